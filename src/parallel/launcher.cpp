#include "megadsl/parallel/launcher.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace megadsl {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("megadsl launch: cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("megadsl launch: cannot bind a socket on 127.0.0.1");
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

namespace {

// The signal that asked the launcher to stop (SIGTERM, SIGINT, SIGHUP), 0 while none did.
volatile sig_atomic_t stop_signal = 0;
void on_stop_signal(int sig) { stop_signal = sig; }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "stopped";
}

int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The rank a failed rank's watch named when it ended it (src/parallel/liveness.cpp writes <dir>/rank<r>:
// the named rank, or -1, then the reason), -1 when it named none.
int named_rank(const std::string& dir, std::size_t rank) {
  std::FILE* f = std::fopen((dir + "/rank" + std::to_string(rank)).c_str(), "r");
  if (f == nullptr) return -1;
  int named = -1;
  if (std::fscanf(f, "%d", &named) != 1) named = -1;
  std::fclose(f);
  return named;
}

}  // namespace

int launch_local(const std::vector<std::string>& argv, const launch_options& options) {
  if (argv.empty()) throw std::invalid_argument("megadsl launch: no program to start");
  if (options.ranks < 1) throw std::invalid_argument("megadsl launch: ranks must be >= 1");
  const int port = free_port();
  // Where a rank that its watch ends leaves the rank it names (a stopped one is ended at once).
  char failure_template[] = "/tmp/megadsl-launch-XXXXXX";
  const char* made = ::mkdtemp(failure_template);
  const std::string failure_dir = made != nullptr ? made : "";
  // Parent and ranks live and die together: a SIGTERM/SIGINT/SIGHUP to the launcher stops every
  // rank before it returns (then ends the launcher by the same signal), and a launcher killed
  // outright (SIGKILL) takes its ranks with it through the parent-death signal.
  stop_signal = 0;
  struct sigaction stop {};
  stop.sa_handler = on_stop_signal;
  sigemptyset(&stop.sa_mask);
  struct sigaction previous[3];
  const int stop_signals[3] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; ++i) ::sigaction(stop_signals[i], &stop, &previous[i]);
  const pid_t launcher = ::getpid();
  std::vector<pid_t> pids(static_cast<std::size_t>(options.ranks), -1);
  for (int r = 0; r < options.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("megadsl launch: fork failed");
    if (pid == 0) {
      for (int i = 0; i < 3; ++i) ::sigaction(stop_signals[i], &previous[i], nullptr);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(128 + SIGKILL);  // the launcher died before prctl
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(options.ranks).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.ranks).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (!failure_dir.empty()) ::setenv("MEGADSL_FAILURE_DIR", failure_dir.c_str(), 1);
      for (const auto& [k, v] : options.extra_env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv("/proc/self/exe", args.data());
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "megadsl launch: cannot start %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }

  int first_failure = 0;
  int remaining = options.ranks;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (remaining > 0) {
    if (stop_signal != 0) {
      // The signal goes on to the ranks, so that each removes what it was writing (a staging
      // directory, a lock file); a rank that has not ended within 2 s (or is stopped) is killed.
      for (const pid_t p : pids)
        if (p > 0) ::kill(p, SIGTERM);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      for (pid_t& p : pids) {
        while (p > 0 && ::waitpid(p, nullptr, WNOHANG) == 0 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (p > 0 && ::waitpid(p, nullptr, WNOHANG) == 0) {
          ::kill(p, SIGKILL);
          ::waitpid(p, nullptr, 0);
        }
        p = -1;
      }
      const int sig = stop_signal;
      std::error_code ec;
      if (!failure_dir.empty()) std::filesystem::remove_all(failure_dir, ec);
      std::fprintf(stderr, "megadsl launch: %s: stopped every rank\n", ::strsignal(sig));
      for (int i = 0; i < 3; ++i) ::sigaction(stop_signals[i], &previous[i], nullptr);
      ::signal(sig, SIG_DFL);
      ::raise(sig);
      return 128 + sig;  // when the signal is blocked or handled by the caller
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (std::size_t r = 0; r < pids.size(); ++r)
          if (pids[r] > 0) {
            std::fprintf(stderr, "megadsl launch: stopping rank %zu, still running %lld s after the first failure\n",
                         r, static_cast<long long>(options.grace.count()));
            ::kill(pids[r], SIGKILL);
          }
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) break;
    --remaining;
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != pid) continue;
      pids[r] = -1;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        std::fprintf(stderr, "megadsl launch: rank %zu %s\n", r, describe_status(status).c_str());
        if (first_failure == 0) {
          first_failure = code_of(status);
          if (first_failure == 0) first_failure = 1;
          deadline = std::chrono::steady_clock::now() + options.grace;
        }
        // A rank named as stopped or hung will not end by itself: ended now, not after the grace.
        const int named = failure_dir.empty() ? -1 : named_rank(failure_dir, r);
        if (named >= 0 && named < options.ranks && static_cast<std::size_t>(named) != r &&
            pids[static_cast<std::size_t>(named)] > 0) {
          std::fprintf(stderr, "megadsl launch: stopping rank %d, which rank %zu named as not responding\n", named, r);
          ::kill(pids[static_cast<std::size_t>(named)], SIGKILL);
        }
      }
    }
  }
  for (int i = 0; i < 3; ++i) ::sigaction(stop_signals[i], &previous[i], nullptr);
  if (!failure_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(failure_dir, ec);
  }
  return first_failure;
}

}  // namespace megadsl
