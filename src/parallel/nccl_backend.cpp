#include "nccl_backend.hpp"

#include <stdexcept>

#ifdef MEGADSL_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace megadsl {

#ifdef MEGADSL_WITH_NCCL

bool built_with_nccl() { return true; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout,
                                                    const std::string&) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

#else

bool built_with_nccl() { return false; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                    std::chrono::milliseconds, const std::string& group) {
  throw std::runtime_error("megadsl: a CUDA tensor reached the " + group +
                           " group, but this build has no NCCL backend; rebuild with the CUDA toolkit "
                           "(nvcc on PATH) and a CUDA LibTorch, or run the model on the CPU");
}

#endif

}  // namespace megadsl
