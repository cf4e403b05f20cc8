// Apertus's xIELU MLP: up and down projections with the learned xIELU activation.
#pragma once

#include "megadsl/blocks/gated_mlp.hpp"

namespace megadsl::blocks {

// down(xielu(up x)) (Apertus): up column-parallel, down row-parallel, no biases; xIELU's four
// scalars under mlp.act_fn: alpha_p and alpha_n learned (replicated, their gradients summed over
// tp, since each rank activates its own features), beta and eps fixed (HF's 0-dim buffers, kept
// out of the gradient):
//   xielu(x) = x > 0 ? softplus(alpha_p) x^2 + beta x : (expm1(min(x, eps)) - x)(beta + softplus(alpha_n)) + beta x
struct xielu_mlp {
  static constexpr row_dims one_value(const shape&) { return {1, 0}; }
  static constexpr void details(const shape&, basic_text<256>& t) {
    t.append("  [mlp: up_proj, act_fn (alpha_p, alpha_n, beta, eps), down_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("mlp");
    b.param(at.sub("up", "up_proj"), {"weight", shard_kind::column, {"weight"}, 1, extent::ffn_rows});
    b.param(at.sub("down", "down_proj"), {"weight", shard_kind::row, {"weight"}, 1, extent::ffn});
    // Their starting values are XIELUActivation's: alpha_p = log(expm1(0.8)), alpha_n = log(expm1(0.8 - beta)).
    const slot act = at.sub("act", "act_fn");
    b.param(act, {"alpha_p", shard_kind::replicated, {"alpha_p"}, 1, extent::none, presence::always, false, true,
                  param_init::constant, false, &one_value, 0.20338237285614014});
    b.param(act, {"alpha_n", shard_kind::replicated, {"alpha_n"}, 1, extent::none, presence::always, false, true,
                  param_init::constant, false, &one_value, -1.0502256155014038});
    b.param(act, {"beta", shard_kind::replicated, {"beta"}, 1, extent::none, presence::always, false, false,
                  param_init::constant, false, &one_value, 0.5, hf_form::scalar});
    b.param(act, {"eps", shard_kind::replicated, {"eps"}, 1, extent::none, presence::always, false, false,
                  param_init::constant, false, &one_value, -1e-6, hf_form::scalar});
    b.uses(activation::xielu);
    return b.costs(b.node(at, &modules::xielu_mlp, {}, "xielu_mlp", "xielu_mlp", &details), mlp_keeps);
  }
};

}  // namespace megadsl::blocks
