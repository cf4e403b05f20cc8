#include "checkpoint_dir.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/parallel/comm.hpp"

namespace megadsl {

namespace fs = std::filesystem;

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// `staging` takes the place of `dir`; the old checkpoint (if any) is removed afterwards.
void move_into_place(const fs::path& staging, const fs::path& dir) {
  auto fail = [&](const std::string& what, int err) {
    throw checkpoint_error("megadsl: cannot move the new checkpoint " + staging.string() + " to " + dir.string() +
                           ": " + what + ": " + std::strerror(err));
  };
  if (!fs::exists(dir)) {
    if (std::rename(staging.c_str(), dir.c_str()) != 0) fail("rename", errno);
  } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    std::error_code ec;
    fs::remove_all(staging, ec);  // the old checkpoint, now under the staging name
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    fs::path old = staging;
    old += ".old";
    if (std::rename(dir.c_str(), old.c_str()) != 0) fail("rename of the old checkpoint", errno);
    if (std::rename(staging.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      std::rename(old.c_str(), dir.c_str());
      fail("rename", err);
    }
    std::error_code ec;
    fs::remove_all(old, ec);
  } else {
    fail("renameat2 (exchange)", errno);
  }
  fsync_dir(dir.parent_path());
}

fs::path staging_name(const comm_group& group, const fs::path& target) {
  at::Tensor token = at::zeros({1}, at::kLong);
  if (group.rank() == 0) {
    std::random_device rd;
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    token[0] = static_cast<std::int64_t>(
        ((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ now ^ static_cast<std::uint64_t>(::getpid())) >> 1);
  }
  group.broadcast(token, 0);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(token.item<std::int64_t>()));
  fs::path staging = target;
  staging += std::string(".tmp-") + hex;
  return staging;
}

namespace {

fs::path lock_path(const fs::path& target) {
  fs::path path = target;
  path += ".lock";
  return path;
}

// `<name>.tmp-<16 hex digits>`: the target's name, or empty when `n` is no staging name.
std::string staged_target(const std::string& n) {
  const auto at = n.rfind(".tmp-");
  if (at == std::string::npos || at == 0 || n.size() != at + 5 + 16) return {};
  for (std::size_t i = at + 5; i < n.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(n[i]))) return {};
  return n.substr(0, at);
}

// Locks `path` without waiting; -1 when another process holds it (or it cannot be opened). The
// lock is on the file the path names when the lock is taken: a lock file unlinked by its previous
// holder meanwhile is opened anew.
int try_lock(const fs::path& path, bool create, int* error = nullptr) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd < 0) {
      if (error != nullptr) *error = errno;
      return -1;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (error != nullptr) *error = errno;
      ::close(fd);
      return -1;
    }
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev)
      return fd;
    ::close(fd);  // its holder removed it after we opened it: take the file that is there now
    if (!create) return -1;
  }
  if (error != nullptr) *error = EAGAIN;
  return -1;
}

}  // namespace

void remove_stale_staging(const fs::path& target) {
  std::error_code ec;
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string mine = target.filename().string();
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    const std::string of = staged_target(name);
    if (of.empty() || !e.is_directory(ec)) continue;
    if (of == mine) {  // this target's: its lock is the caller's
      fs::remove_all(e.path(), ec);
      continue;
    }
    // Another target's, left by a writer that was killed, unless a writer holds its lock now.
    const fs::path lock = lock_path(parent / of);
    const bool has_lock = fs::exists(lock, ec);
    const int fd = has_lock ? try_lock(lock, false) : -1;
    if (has_lock && fd < 0) continue;  // being written
    fs::remove_all(e.path(), ec);
    if (fd >= 0) {
      if (fs::file_size(lock, ec) == 0) ::unlink(lock.c_str());
      ::close(fd);
    }
  }
  // Another target's lock that no process holds, without a staging directory: its writer was killed
  // after its new state was in place and its staging directory gone, before it removed the lock.
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(".lock") || name == mine + ".lock" || !e.is_regular_file(ec)) continue;
    if (!fs::exists(parent / name.substr(0, name.size() - 5), ec)) continue;  // a lock of no target megadsl wrote
    const int fd = try_lock(e.path(), false);
    if (fd < 0) continue;  // held: being written
    if (fs::file_size(e.path(), ec) == 0) ::unlink(e.path().c_str());
    ::close(fd);
  }
}

target_lock::target_lock(const fs::path& target) {
  const fs::path path = lock_path(target);
  std::error_code ec;
  fs::create_directories(target.parent_path().empty() ? fs::path(".") : target.parent_path(), ec);
  int err = 0;
  fd_ = try_lock(path, true, &err);
  // Another writer in this directory sweeping stale locks (remove_stale_staging) holds ours for
  // an instant when it finds the file: held for a second, it is a writer's.
  for (int wait = 0; fd_ < 0 && err == EWOULDBLOCK && wait < 50; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fd_ = try_lock(path, true, &err);
  }
  if (fd_ < 0)
    throw checkpoint_error("megadsl: cannot write " + target.string() +
                           (err == EWOULDBLOCK ? ": another process is writing it (it holds " + path.string() +
                                                     "); wait for it to finish, or write elsewhere"
                                               : ": cannot create or lock its lock file " + path.string() + ": " +
                                                     std::strerror(err)));
  path_ = path;
  cleanup_ = std::make_unique<cleanup_on_signal>(path_, false);
}

target_lock::~target_lock() {
  cleanup_.reset();
  if (fd_ < 0) return;
  // Removed while still held: a process waiting on this file then finds it unlinked and opens
  // the new one (try_lock), so no two writers ever hold "the" lock.
  ::unlink(path_.c_str());
  ::close(fd_);  // releases the flock
}

// ---- cleaning up on a signal ----------------------------------------------------------------------

namespace {

// Paths to remove when a stop signal arrives, in fixed storage the handler can read.
struct cleanup_slot {
  std::atomic<bool> used{false};
  bool directory = false;
  char path[4096] = {};
};
constexpr int max_cleanups = 16;
cleanup_slot slots[max_cleanups];
std::mutex slots_mutex;
int slots_in_use = 0;
constexpr int stop_signals[3] = {SIGTERM, SIGINT, SIGHUP};
struct sigaction previous[3];

struct dirent64_raw {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

// rm -r with system calls only (async-signal-safe): unlink, or empty the directory and remove it.
void remove_tree(int dirfd, const char* name, int depth) {
  if (::unlinkat(dirfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM) || depth > 4) {
    ::unlinkat(dirfd, name, AT_REMOVEDIR);
    return;
  }
  const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  alignas(8) char buf[8192];
  for (int pass = 0; pass < 64; ++pass) {  // entries removed while reading: read again until empty
    ::lseek(fd, 0, SEEK_SET);
    bool any = false;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const auto* d = reinterpret_cast<const dirent64_raw*>(buf + off);
        off += d->d_reclen;
        if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
        any = true;
        remove_tree(fd, d->d_name, depth + 1);
      }
    }
    if (!any) break;
  }
  ::close(fd);
  ::unlinkat(dirfd, name, AT_REMOVEDIR);
}

void on_stop_signal(int sig) {
  const int saved = errno;
  for (cleanup_slot& s : slots)
    if (s.used.load()) {
      if (s.directory) remove_tree(AT_FDCWD, s.path, 0);
      else ::unlink(s.path);
    }
  errno = saved;
  for (int i = 0; i < 3; ++i) {
    if (stop_signals[i] != sig) continue;
    const struct sigaction& p = previous[i];
    if ((p.sa_flags & SA_SIGINFO) != 0 && p.sa_sigaction != nullptr) return p.sa_sigaction(sig, nullptr, nullptr);
    if (p.sa_handler == SIG_IGN) return;
    if (p.sa_handler != SIG_DFL && p.sa_handler != nullptr) return p.sa_handler(sig);
  }
  // The default action: end the process by the same signal.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

cleanup_on_signal::cleanup_on_signal(const fs::path& path, bool directory) {
  const std::string p = fs::absolute(path).string();
  std::lock_guard lock(slots_mutex);
  for (int i = 0; i < max_cleanups; ++i) {
    cleanup_slot& s = slots[i];
    if (s.used.load() || p.size() >= sizeof s.path) continue;
    std::memcpy(s.path, p.c_str(), p.size() + 1);
    s.directory = directory;
    s.used.store(true);
    slot_ = i;
    break;
  }
  if (slot_ < 0) return;  // out of slots: the next write's start cleans it up instead
  if (slots_in_use++ == 0) {
    struct sigaction a {};
    a.sa_handler = on_stop_signal;
    sigemptyset(&a.sa_mask);
    for (int i = 0; i < 3; ++i) ::sigaction(stop_signals[i], &a, &previous[i]);
  }
}

cleanup_on_signal::~cleanup_on_signal() {
  if (slot_ < 0) return;
  std::lock_guard lock(slots_mutex);
  slots[slot_].used.store(false);
  if (--slots_in_use == 0)
    for (int i = 0; i < 3; ++i) ::sigaction(stop_signals[i], &previous[i], nullptr);
}

// Collective: returns when no rank has an error; otherwise every rank throws checkpoint_error, with
// its own message when it has one, else with that of the first rank that failed.
void agree(const comm_group& world, const std::string& error) {
  at::Tensor flag = at::full({1}, error.empty() ? 0 : 1, at::kLong);
  const at::Tensor flags = world.all_gather(flag, 0);  // (world)
  const auto failed = flags.nonzero();
  if (failed.numel() == 0) return;
  const int first = static_cast<int>(failed[0][0].item<std::int64_t>());
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(error.size()), at::kLong);
  world.broadcast(length, first);
  at::Tensor text = at::zeros({std::max<std::int64_t>(1, length.item<std::int64_t>())}, at::kByte);
  if (world.rank() == first) std::memcpy(text.data_ptr(), error.data(), error.size());
  world.broadcast(text, first);
  if (!error.empty()) throw checkpoint_error(error);
  const std::string theirs(static_cast<const char*>(text.data_ptr()), static_cast<std::size_t>(length.item<std::int64_t>()));
  throw checkpoint_error(theirs + " [reported by rank " + std::to_string(world.ranks()[static_cast<std::size_t>(first)]) + "]");
}

void save_step(const comm_group& group, const fs::path& staging, const std::function<void()>& f) {
  std::string error;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
    std::replace(error.begin(), error.end(), '\n', ' ');
  }
  try {
    agree(group, error);
  } catch (...) {
    std::error_code ec;
    if (group.rank() == 0) fs::remove_all(staging, ec);
    throw;
  }
}

void refuse_target_over_source(const fs::path& target, const fs::path& source, const std::string& what,
                               bool overwrite_checkpoint) {
  if (source.empty()) return;
  std::error_code ec;
  fs::path src = source;
  // A distributed checkpoint's hf/ folder stands for the checkpoint.
  const bool checkpoint = src.filename() == "hf" && fs::exists(src.parent_path() / "metadata.json", ec);
  if (checkpoint) src = src.parent_path();
  const fs::path t = fs::weakly_canonical(fs::absolute(target, ec), ec), s = fs::weakly_canonical(fs::absolute(src, ec), ec);
  if (t.empty() || s.empty()) return;
  // Whether `inner` is `outer` or below it, component by component.
  const auto within = [](const fs::path& inner, const fs::path& outer) {
    return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first == outer.end();
  };
  const std::string head = "megadsl: cannot save " + what + " to " + target.string() + ": ";
  if (t == s) {
    if (overwrite_checkpoint && checkpoint) return;
    throw checkpoint_error(head + "it is the directory the model was loaded from, and saving would replace its weights "
                                  "and every file megadsl does not write (README.md, ...); write to another directory");
  }
  if (within(s, t))
    throw checkpoint_error(head + "it holds " + s.string() + ", the model's source, and saving replaces the whole " +
                           "directory, which would delete it; write to a directory that does not hold the source");
  if (within(t, s))
    throw checkpoint_error(head + "it is inside " + s.string() + ", the model's source; write outside it");
}

}  // namespace megadsl
