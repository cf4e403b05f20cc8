// Llama 4's q/k norm without a weight: a block only Llama 4 uses, so it lives with the family
// (DESIGN decision 16), its module in l2_qk_norm.cpp beside this file.
#pragma once

#include <memory>

#include "megadsl/blocks/qk_norms.hpp"

namespace megadsl::modules {
// Its module (models/llama4/l2_qk_norm.cpp); weak outside the runtime library, as the core's are.
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> l2_qk_norm(const block_build& b);
}  // namespace megadsl::modules

namespace megadsl::blocks {

// Llama 4 (Llama4TextL2Norm): q and k normed per head over head_dim without a weight, eps the
// shape's rms_eps, in fp32. HF norms them after RoPE; the RMS of a head is the same before and
// after the rotation, so megadsl norms them before it, as Megatron's qk_l2_norm does.
struct l2_qk_norm {
  static constexpr std::string_view label = ", q/k rms-normed per head (no weight)";
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.node(at, &modules::l2_qk_norm, {}, "l2_qk_norm");
  }
};

}  // namespace megadsl::blocks
