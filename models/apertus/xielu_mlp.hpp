// Apertus's xIELU MLP: up and down projections with the learned xIELU activation. A block only
// Apertus uses, so it lives with the family (DESIGN decision 16), its module in xielu_mlp.cpp
// beside this file.
#pragma once

#include <memory>

#include "megadsl/blocks/gated_mlp.hpp"

namespace megadsl::modules {
// Its module (models/apertus/xielu_mlp.cpp); weak outside the runtime library, as the core's are.
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> xielu_mlp(const block_build& b);
}  // namespace megadsl::modules

namespace megadsl::blocks {

// down(xielu(up x)) (Apertus): up column-parallel, down row-parallel, no biases; xIELU's four
// scalars under mlp.act_fn: alpha_p and alpha_n learned (replicated, their gradients summed over
// tp, since each rank activates its own features), beta and eps fixed (HF's 0-dim buffers, kept
// out of the gradient):
//   xielu(x) = x > 0 ? softplus(alpha_p) x^2 + beta x : (expm1(min(x, eps)) - x)(beta + softplus(alpha_n)) + beta x
struct xielu_mlp {
  static constexpr void details(const shape&, basic_text<256>& t) {
    t.append("  [mlp: up_proj, act_fn (alpha_p, alpha_n, beta, eps), down_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("mlp");
    b.param(at.sub("up", "up_proj"), {"weight", &geo::ffn_rows<false>, {"weight"}, 1});
    b.param(at.sub("down", "down_proj"), {"weight", &geo::down<&geo::dense_ffn>, {"weight"}, 1});
    // Their starting values are XIELUActivation's: alpha_p = log(expm1(0.8)), alpha_n = log(expm1(0.8 - beta)).
    const slot act = at.sub("act", "act_fn");
    b.param(act, {"alpha_p", &geo::scalar, {"alpha_p"}, 1, presence::always, false, true,
                  param_init::constant, false, 0.20338237285614014});
    b.param(act, {"alpha_n", &geo::scalar, {"alpha_n"}, 1, presence::always, false, true,
                  param_init::constant, false, -1.0502256155014038});
    b.param(act, {"beta", &geo::scalar, {"beta"}, 1, presence::always, false, false,
                  param_init::constant, false, 0.5, hf_form::scalar});
    b.param(act, {"eps", &geo::scalar, {"eps"}, 1, presence::always, false, false,
                  param_init::constant, false, -1e-6, hf_form::scalar});
    b.uses(activation::xielu);
    return b.costs(b.node(at, &modules::xielu_mlp, {}, "xielu_mlp", "xielu_mlp", &details), mlp_keeps);
  }
};

}  // namespace megadsl::blocks
