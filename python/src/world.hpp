// The job this Python process is part of: the `megadsl::distributed` that megadsl.init() joined,
// held by the module (distributed_bindings.cpp) and shared with every Model built under it.
#pragma once

#include <memory>

namespace megadsl {
class distributed;
}

namespace megadsl::python {

// The joined job, or nullptr before megadsl.init() (and after megadsl.shutdown()).
std::shared_ptr<distributed> joined_world();

// The joined job, or a fresh world of one process when megadsl.init() was not called.
std::shared_ptr<distributed> world_or_single();

}  // namespace megadsl::python
