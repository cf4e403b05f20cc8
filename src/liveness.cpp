#include "megadsl/parallel/liveness.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace megadsl {
namespace {

constexpr auto beat = std::chrono::milliseconds(500);

std::string key_of(std::int64_t rank) { return "megadsl/heartbeat/" + std::to_string(rank); }

struct heartbeat {
  std::atomic<bool> stop{false};
  std::thread thread;
};

std::mutex mu;
heartbeat* running = nullptr;

}  // namespace

void start_heartbeat(const c10::intrusive_ptr<c10d::Store>& store, std::int64_t rank) {
  std::lock_guard<std::mutex> lock(mu);
  if (running != nullptr) return;
  running = new heartbeat;
  heartbeat* hb = running;
  hb->thread = std::thread([store, rank, hb] {
    const std::string key = key_of(rank);
    while (!hb->stop) {
      try {
        store->add(key, 1);
      } catch (...) {
        return;  // the store host is gone; the failing collective reports it
      }
      for (int i = 0; i < 10 && !hb->stop; ++i) std::this_thread::sleep_for(beat / 10);
    }
  });
}

void stop_heartbeat() {
  std::lock_guard<std::mutex> lock(mu);
  if (running == nullptr) return;
  running->stop = true;
  if (running->thread.joinable()) running->thread.join();
  delete running;
  running = nullptr;
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
