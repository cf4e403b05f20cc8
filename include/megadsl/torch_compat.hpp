// The one place where LibTorch versions differ (DESIGN §15): Debian's 1.13 for the CPU path,
// the PyTorch wheel's 2.x for CUDA/NCCL.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_utils.h>
#include <torch/version.h>

#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace megadsl::compat {

#if TORCH_VERSION_MAJOR >= 2
// 2.x split ProcessGroup into a dispatching front and per-device Backends; Gloo/NCCL are Backends.
using backend = c10d::Backend;
using work = c10d::Work;
#else
using backend = c10d::ProcessGroup;
using work = c10d::Work;
#endif

// The key of a parameter's entry in torch::optim::Optimizer::state(): 2.x keys by the TensorImpl's
// address, 1.13 by that address printed as text.
#if TORCH_VERSION_MAJOR >= 2
inline void* optimizer_state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
inline std::string optimizer_state_key(const at::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}
#endif

}  // namespace megadsl::compat
