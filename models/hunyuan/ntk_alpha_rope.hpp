// HunYuan's fixed NTK-alpha RoPE: its config's rope "dynamic" with an `alpha` is no dynamic
// scaling but the base stretched once (HunYuanDenseV1RotaryEmbedding / HunYuanMoEV1's), which only
// this family's classes do, so it is the family's own reading (family_config::read_own) and no
// block's key.
#pragma once

#include <cmath>

#include "megadsl/config_hook.hpp"

namespace megadsl {

// "dynamic" with an alpha: plain RoPE on theta * alpha^(d / (d - 2)), as transformers computes it in
// Python floats, written back so. Without an alpha, "dynamic" stays transformers' dynamic NTK.
inline void hunyuan_ntk_alpha_rope(const config_view& c, shape& s) {
  if (s.rope.type.get() != rope_type::dynamic_ntk) return;
  // 5.x's rope_parameters, else 4.x's rope_scaling.
  const std::optional<double> alpha =
      c.number(c.has_object("rope_parameters") ? "rope_parameters.alpha" : "rope_scaling.alpha");
  if (!alpha) return;
  const double d = static_cast<double>(effective_head_dim(s).get());
  if (!(*alpha > 0) || d <= 2)
    c.fail("rope_parameters.alpha", "is " + c.shown(*alpha) + " with head_dim " + c.shown(d),
           "use a positive alpha and head_dim > 2");
  const double base = s.rope_theta.get() * std::pow(*alpha, d / (d - 2));
  c.note("rope_parameters: \"dynamic\" with alpha " + c.shown(*alpha) + " is a fixed NTK-alpha RoPE: plain RoPE with base " +
         c.shown(base) + " (written back so)");
  s.rope_theta = base;
  s.rope = {};
}

}  // namespace megadsl
