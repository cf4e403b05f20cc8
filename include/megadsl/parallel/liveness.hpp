// The job's watch: a rank that dies or hangs ends every rank of the job within seconds, named.
//
// Each process runs one background thread with its own connection to the rendezvous store (rank
// 0 hosts it, or torchrun's agent), so that a main thread blocked in the store or in a collective
// never stalls it:
//
//   - it bumps `megadsl/heartbeat/<rank>` twice a second;
//   - on rank 0 it also reads every peer's counter, and on rank 1 rank 0's: one that stands still
//     for the peer timeout (MEGADSL_PEER_TIMEOUT_S, 5 s by default; 0 turns the watch off, e.g.
//     under a debugger) is a dead, stopped or hung rank, posted as the job's failure;
//   - it polls `megadsl/abort`, the job's failure: the first rank that learns of one (a collective
//     whose transport saw a peer's connection close, a rank whose body threw, a judge's verdict)
//     posts its reason there (and the rank it names), and every other rank prints it as one line
//     and ends with status 1;
//   - a store that fails means its host is gone; one whose call has not returned within the peer
//     timeout (a second thread times each call, so the watch does not depend on the store's host
//     answering) means its host is stopped or hangs: the rank ends the same way, naming it;
//   - a loop that wakes a peer timeout late means this process itself was frozen (SIGSTOP, a
//     debugger): it ends saying so, rather than blaming the peers that gave up on it.
//
// A rank its watch ends also leaves the reason and the rank it names in $MEGADSL_FAILURE_DIR/rank<r>
// when that is set (megadsl's launchers set it, and end a named rank at once). Nothing is lost by
// ending abruptly: every file megadsl writes is staged and renamed into place.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace megadsl {

struct watch_options {
  std::int64_t rank = 0;
  std::int64_t world = 1;
  std::chrono::milliseconds peer_timeout{5000};  // 0: no heartbeat verdicts (the abort key still works)
};

// MEGADSL_PEER_TIMEOUT_S, or 5 s.
std::chrono::milliseconds default_peer_timeout();

// Starts this process's watch over `store` (a connection of its own). Once per process.
void start_watch(const c10::intrusive_ptr<c10d::Store>& store, const watch_options& o);
// Stops it (a rank that has finished its part no longer ends on a peer's failure).
void stop_watch();

// "it was stopped or frozen for 6.2 s ...": non-empty when this process was frozen longer than its
// peers wait (its watch loop has not run since), so that an error it meets on waking (its peers
// gone) names the freeze rather than a peer.
std::string frozen_reason();

// Posts `reason` as the job's failure, unless one is posted already; other ranks end on it. This
// rank's own watch ignores it (the caller reports the error itself). Best effort: never throws.
void post_job_failure(const std::string& reason);
// On rank 0 (the store's host), before it exits after a failure: waits, at most 3 s, until the
// other ranks have read the posted failure. Elsewhere a no-op.
void wait_for_failure_readers();

// Human-readable verdict on `peers`: "rank 3 stopped responding", "rank 0 (store host) is gone", ...
std::string diagnose_peers(const c10::intrusive_ptr<c10d::Store>& store,
                           const std::vector<std::int64_t>& peers, std::int64_t me);

}  // namespace megadsl
