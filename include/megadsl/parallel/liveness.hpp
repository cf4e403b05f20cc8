// Heartbeats in the rendezvous store, so that a collective that fails can name the rank that died.
//
// Each process bumps `megadsl/heartbeat/<rank>` twice a second from a background thread. When a
// collective fails (a closed connection or its timeout), the survivor reads its peers' counters
// twice, a couple of beats apart: a peer whose counter stood still is dead; a store that does not
// answer means rank 0, which hosts it, is gone.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace megadsl {

void start_heartbeat(const c10::intrusive_ptr<c10d::Store>& store, std::int64_t rank);
void stop_heartbeat();

// Human-readable verdict on `peers`: "rank 3 stopped responding", "rank 0 (store host) is gone", ...
std::string diagnose_peers(const c10::intrusive_ptr<c10d::Store>& store,
                           const std::vector<std::int64_t>& peers, std::int64_t me);

}  // namespace megadsl
