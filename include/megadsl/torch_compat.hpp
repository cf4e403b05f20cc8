// The one place where LibTorch versions differ (DESIGN §15): Debian's 1.13 for the CPU path,
// the PyTorch wheel's 2.x for CUDA/NCCL.
#pragma once

#include <torch/version.h>

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

}  // namespace megadsl::compat
