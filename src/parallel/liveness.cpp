#include "megadsl/parallel/liveness.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace megadsl {
namespace {

using clock = std::chrono::steady_clock;
constexpr auto beat = std::chrono::milliseconds(500);
constexpr auto poll = std::chrono::milliseconds(100);
const std::string abort_key = "megadsl/abort";
const std::string seen_key = "megadsl/abort_seen";  // ranks that read the failure and are ending

// Rank 0 hosts the store: after posting a failure it waits (at most 3 s) until the other live
// ranks have read it, so that they print the failure rather than "rank 0 is gone".
void linger_for_readers(c10d::Store& store, std::int64_t readers) {
  const auto until = clock::now() + std::chrono::seconds(3);
  try {
    while (store.add(seen_key, 0) < readers && clock::now() < until) std::this_thread::sleep_for(poll / 2);
  } catch (...) {
  }
}

const std::string abort_rank_key = "megadsl/abort_rank";  // the rank the failure names, when it names one

std::string key_of(std::int64_t rank) { return "megadsl/heartbeat/" + std::to_string(rank); }

std::string seconds(clock::duration d) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return os.str();
}

// One line on stderr, written with write(2) (no stream state from the main thread), then exit 1.
// With MEGADSL_FAILURE_DIR (megadsl.launch_local sets it) the line also goes to <dir>/rank<r>,
// after the rank the failure names (or -1), so the launcher can name that rank.
[[noreturn]] void end_rank(std::int64_t rank, const std::string& why, std::int64_t culprit = -1) {
  const std::string line = "[rank " + std::to_string(rank) + "] megadsl: " + why + "\n";
  [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
  if (const char* dir = std::getenv("MEGADSL_FAILURE_DIR"); dir != nullptr && *dir != '\0') {
    const std::string path = std::string(dir) + "/rank" + std::to_string(rank);
    const std::string text = std::to_string(culprit) + "\n" + why + "\n";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      n = ::write(fd, text.data(), text.size());
      ::close(fd);
    }
  }
  std::_Exit(1);
}

// Who answers the store: torchrun's agent (TORCHELASTIC_USE_AGENT_STORE), else rank 0.
bool agent_hosts_store() {
  const char* v = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  return v != nullptr && (std::string(v) == "True" || std::string(v) == "true" || std::string(v) == "1");
}

struct watch {
  c10::intrusive_ptr<c10d::Store> store;
  watch_options o;
  std::atomic<bool> stop{false};
  std::atomic<bool> posted{false};  // this rank reported the failure: its main thread speaks
  // When the store call under way began (steady clock ticks), 0 while none is: a store that stops
  // answering is seen by the second thread, which does not wait on it.
  std::atomic<clock::rep> call_since{0};
  std::atomic<clock::rep> loop_at{0};  // when the watch loop last ran: a stale one means a frozen process
  std::mutex m;
  std::condition_variable wake;
  std::thread thread, store_guard;

  template <class F>
  auto timed(F&& f) {
    call_since = clock::now().time_since_epoch().count();
    struct done {
      std::atomic<clock::rep>& since;
      ~done() { since = 0; }
    } const end{call_since};
    return f();
  }

  // A loop that ran late by about the peer timeout: this process was frozen (SIGSTOP, a debugger,
  // memory pressure) while its peers went on and judged it (a peer's verdict counts from its last
  // heartbeat, up to a beat before the freeze: hence a beat less).
  [[nodiscard]] clock::duration frozen_after() const {
    return std::max<clock::duration>(o.peer_timeout - beat, std::chrono::seconds(1));
  }
  [[nodiscard]] std::string frozen_text(clock::duration d) const {
    return "it was stopped or frozen for " + seconds(d) + " (SIGSTOP, a debugger, memory pressure), longer than "
           "MEGADSL_PEER_TIMEOUT_S (" + seconds(o.peer_timeout) + "): the job's other ranks have ended or are ending on it";
  }
  void check_not_frozen(clock::time_point& last) {
    const auto now = clock::now();
    if (o.peer_timeout.count() > 0 && now - last > frozen_after() && !stop)
      end_rank(o.rank, "ending this rank: " + frozen_text(now - last), o.rank);
    last = now;
  }

  void run() {
    auto last_beat = clock::now() - beat;
    auto last_look = clock::now();
    auto last_loop = clock::now();
    struct seen {
      std::int64_t count = -1;
      clock::time_point since;
    };
    std::map<std::int64_t, seen> peers;
    // Rank 0 judges every peer by its heartbeat; rank 1 judges rank 0 (whose store may be another
    // process's, torchrun's agent, and answer while rank 0 itself is stopped).
    const bool judge = o.peer_timeout.count() > 0 && (o.rank == 0 || o.rank == 1);
    while (!stop) {
      check_not_frozen(last_loop);
      loop_at = last_loop.time_since_epoch().count();
      try {
        const auto now = clock::now();
        if (now - last_beat >= beat) {
          timed([&] { return store->add(key_of(o.rank), 1); });
          last_beat = now;
        }
        if (!posted && timed([&] { return store->check({abort_key}); })) {
          const std::vector<std::uint8_t> v = timed([&] { return store->get(abort_key); });
          std::int64_t culprit = -1;
          if (timed([&] { return store->check({abort_rank_key}); })) {
            const std::vector<std::uint8_t> r = timed([&] { return store->get(abort_rank_key); });
            culprit = std::atoll(std::string(r.begin(), r.end()).c_str());
          }
          if (!posted) {
            timed([&] { return store->add(seen_key, 1); });
            // The store's host stays until the others have read it too (all but the poster and,
            // typically, one dead rank), or they would learn only that rank 0 vanished.
            if (o.rank == 0) linger_for_readers(*store, o.world - 2);
            end_rank(o.rank, "ending this rank: the job failed: " + std::string(v.begin(), v.end()), culprit);
          }
        }
        if (judge && now - last_look >= beat) {
          last_look = now;
          for (std::int64_t p = o.rank == 0 ? 1 : 0; p < (o.rank == 0 ? o.world : 1); ++p) {
            const std::int64_t c = timed([&] { return store->add(key_of(p), 0); });
            seen& s = peers[p];
            if (c != s.count) {
              s = {c, now};
            } else if (now - s.since > o.peer_timeout) {
              const std::string why = "rank " + std::to_string(p) + " stopped responding: no heartbeat for " +
                                      seconds(now - s.since) + " (its process died, is stopped or hangs; "
                                      "MEGADSL_PEER_TIMEOUT_S is " + seconds(o.peer_timeout) + "), seen by rank " +
                                      std::to_string(o.rank);
              post(why, p);
              if (o.rank == 0) linger_for_readers(*store, o.world - 2);  // every rank but this one and the dead one
              end_rank(o.rank, "ending this rank: the job failed: " + why, p);
            }
          }
        }
      } catch (const std::exception& e) {
        if (stop) return;
        if (o.rank == 0) end_rank(o.rank, std::string("ending this rank: the rendezvous store failed: ") + e.what());
        end_rank(o.rank, std::string(agent_hosts_store() ? "torchrun's agent" : "rank 0") +
                             ", which hosts the rendezvous store, is gone (its process died)",
                 agent_hosts_store() ? -1 : 0);
      }
      std::unique_lock<std::mutex> lock(m);
      wake.wait_for(lock, poll, [&] { return stop.load(); });
    }
  }

  // The second thread: a store call that has not returned within the peer timeout means its host
  // is stopped or hangs (a connection that stays open, so no error ever comes back).
  void guard_store() {
    auto last_loop = clock::now();
    while (!stop) {
      {
        std::unique_lock<std::mutex> lock(m);
        wake.wait_for(lock, poll, [&] { return stop.load(); });
      }
      if (stop) return;
      check_not_frozen(last_loop);
      const clock::rep since = call_since.load();
      if (since == 0 || o.peer_timeout.count() == 0) continue;
      const auto quiet = clock::now() - clock::time_point(clock::duration(since));
      if (quiet > o.peer_timeout && !stop) {
        const bool agent = agent_hosts_store();
        end_rank(o.rank, std::string("ending this rank: ") + (agent ? "torchrun's agent" : "rank 0") +
                             ", which hosts the rendezvous store, has not answered for " + seconds(quiet) +
                             " (its process is stopped or hangs; MEGADSL_PEER_TIMEOUT_S is " +
                             seconds(o.peer_timeout) + ")",
                 agent ? -1 : 0);
      }
    }
  }

  void post(const std::string& reason, std::int64_t culprit = -1) {
    posted = true;
    try {
      timed([&] { return store->compareSet(abort_key, {}, std::vector<std::uint8_t>(reason.begin(), reason.end())); });
      if (culprit >= 0) {
        const std::string r = std::to_string(culprit);
        timed([&] { return store->compareSet(abort_rank_key, {}, std::vector<std::uint8_t>(r.begin(), r.end())); });
      }
    } catch (...) {
    }
  }
};

std::mutex mu;
watch* running = nullptr;

}  // namespace

std::chrono::milliseconds default_peer_timeout() {
  const char* v = std::getenv("MEGADSL_PEER_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return std::chrono::milliseconds(5000);
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s >= 0) || s > 1e6)
    throw std::invalid_argument(std::string("megadsl: MEGADSL_PEER_TIMEOUT_S='") + v +
                                "' is not a number of seconds >= 0 (0 turns the heartbeat verdicts off)");
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
}

void start_watch(const c10::intrusive_ptr<c10d::Store>& store, const watch_options& o) {
  std::lock_guard<std::mutex> lock(mu);
  if (running != nullptr) return;
  running = new watch;
  running->store = store;
  running->o = o;
  running->thread = std::thread([w = running] { w->run(); });
  if (o.world > 1) running->store_guard = std::thread([w = running] { w->guard_store(); });
}

void stop_watch() {
  std::lock_guard<std::mutex> lock(mu);
  if (running == nullptr) return;
  {
    std::lock_guard<std::mutex> l(running->m);
    running->stop = true;
  }
  running->wake.notify_all();
  if (running->thread.joinable()) running->thread.join();
  if (running->store_guard.joinable()) running->store_guard.join();
  delete running;
  running = nullptr;
}

std::string frozen_reason() {
  std::lock_guard<std::mutex> lock(mu);
  if (running == nullptr || running->o.peer_timeout.count() == 0) return {};
  const clock::rep at = running->loop_at.load();
  if (at == 0) return {};
  const auto quiet = clock::now() - clock::time_point(clock::duration(at));
  return quiet > running->frozen_after() ? running->frozen_text(quiet) : std::string();
}

void post_job_failure(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu);
  if (running != nullptr) running->post(reason);
}

void wait_for_failure_readers() {
  std::lock_guard<std::mutex> lock(mu);
  if (running != nullptr && running->o.rank == 0) linger_for_readers(*running->store, running->o.world - 1);
}

std::string diagnose_peers(const c10::intrusive_ptr<c10d::Store>& store,
                           const std::vector<std::int64_t>& peers, std::int64_t me) {
  try {
    auto read = [&] {
      std::map<std::int64_t, std::int64_t> seen;
      for (std::int64_t p : peers)
        if (p != me) seen[p] = store->add(key_of(p), 0);
      return seen;
    };
    const auto before = read();
    std::this_thread::sleep_for(beat * 4);
    const auto after = read();
    std::ostringstream dead;
    for (const auto& [peer, count] : before)
      if (after.at(peer) == count) dead << (dead.tellp() > 0 ? ", " : "") << peer;
    if (dead.tellp() > 0) return "rank " + dead.str() + " stopped responding (process died or hung)";
    return "every peer is alive (a peer is slow or issued a different collective, or the backend refused the call)";
  } catch (const std::exception&) {
    return "rank 0 (which hosts the rendezvous store) is gone";
  }
}

}  // namespace megadsl
