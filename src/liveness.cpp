#include "megadsl/parallel/liveness.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <unistd.h>

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

std::string key_of(std::int64_t rank) { return "megadsl/heartbeat/" + std::to_string(rank); }

// One line on stderr, written with write(2) (no stream state from the main thread), then exit 1.
[[noreturn]] void end_rank(std::int64_t rank, const std::string& why) {
  const std::string line = "[rank " + std::to_string(rank) + "] megadsl: " + why + "\n";
  [[maybe_unused]] const auto n = ::write(2, line.data(), line.size());
  std::_Exit(1);
}

struct watch {
  c10::intrusive_ptr<c10d::Store> store;
  watch_options o;
  std::atomic<bool> stop{false};
  std::atomic<bool> posted{false};  // this rank reported the failure: its main thread speaks
  std::mutex m;
  std::condition_variable wake;
  std::thread thread;

  void run() {
    auto last_beat = clock::now() - beat;
    auto last_look = clock::now();
    struct seen {
      std::int64_t count = -1;
      clock::time_point since;
    };
    std::map<std::int64_t, seen> peers;
    const bool judge = o.rank == 0 && o.peer_timeout.count() > 0;
    while (!stop) {
      try {
        const auto now = clock::now();
        if (now - last_beat >= beat) {
          store->add(key_of(o.rank), 1);
          last_beat = now;
        }
        if (!posted && store->check({abort_key})) {
          const std::vector<std::uint8_t> v = store->get(abort_key);
          if (!posted) {
            store->add(seen_key, 1);
            // The store's host stays until the others have read it too (all but the poster and,
            // typically, one dead rank), or they would learn only that rank 0 vanished.
            if (o.rank == 0) linger_for_readers(*store, o.world - 2);
            end_rank(o.rank, "ending this rank: the job failed: " + std::string(v.begin(), v.end()));
          }
        }
        if (judge && now - last_look >= beat) {
          last_look = now;
          for (std::int64_t p = 1; p < o.world; ++p) {
            const std::int64_t c = store->add(key_of(p), 0);
            seen& s = peers[p];
            if (c != s.count) {
              s = {c, now};
            } else if (now - s.since > o.peer_timeout) {
              const double quiet = std::chrono::duration<double>(now - s.since).count();
              std::ostringstream why;
              why.precision(1);
              why << std::fixed << "rank " << p << " stopped responding: no heartbeat for " << quiet
                  << " s (its process died or hangs; MEGADSL_PEER_TIMEOUT_S is " << o.peer_timeout.count() / 1000.0
                  << " s), seen by rank 0";
              post(why.str());
              linger_for_readers(*store, o.world - 2);  // every rank but this one and the dead one
              end_rank(o.rank, "ending this rank: the job failed: " + why.str());
            }
          }
        }
      } catch (const std::exception& e) {
        if (stop) return;
        if (o.rank == 0) end_rank(o.rank, std::string("ending this rank: the rendezvous store failed: ") + e.what());
        end_rank(o.rank, "ending this rank: rank 0, which hosts the rendezvous store, is gone or does not answer "
                         "(its process died or hangs)");
      }
      std::unique_lock<std::mutex> lock(m);
      wake.wait_for(lock, poll, [&] { return stop.load(); });
    }
  }

  void post(const std::string& reason) {
    posted = true;
    try {
      store->compareSet(abort_key, {}, std::vector<std::uint8_t>(reason.begin(), reason.end()));
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
  delete running;
  running = nullptr;
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
