// The NCCL backend of a communication group, in a TU of its own: only it includes NCCL's headers,
// and a build without the CUDA toolkit compiles it to a clear error.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class Store;
class Backend;
}  // namespace c10d

namespace megadsl {

// True when this build carries the NCCL backend (LibTorch with CUDA and the CUDA toolkit).
bool built_with_nccl();

// A c10d ProcessGroupNCCL over `store` (already prefixed for this group). Throws when the build
// has no NCCL, naming the group.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout,
                                                    const std::string& group);

}  // namespace megadsl
