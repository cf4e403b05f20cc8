// The plain MLP: c_proj(act(c_fc(x))) (StarCoder2, GPT-NeoX).
#pragma once

#include "megadsl/blocks/gated_mlp.hpp"

namespace megadsl::blocks {

// proj(act(fc(x) + b_fc)) + b_proj: fc column-parallel with its bias split, proj row-parallel with
// its bias added after the reduction (StarCoder2's c_fc / c_proj, NeoX's dense_h_to_4h /
// dense_4h_to_h; biases per the shape's out_bias).
template <activation A = activation::gelu_tanh>
struct plain_mlp {
  static constexpr mlp_knobs knobs{A};
  template <bool Neox>
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add(s.out_bias.is_static() && s.out_bias.get() ? " + biases" : "",
          Neox ? "  [mlp: dense_h_to_4h, dense_4h_to_h]" : "  [mlp: c_fc, c_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const bool neox = layer.names == name_scheme::gpt_neox;
    const slot at = layer.module("mlp");
    const std::string_view fc = neox ? "dense_h_to_4h" : "c_fc", proj = neox ? "dense_4h_to_h" : "c_proj";
    b.param(at.sub("fc", fc), {"weight", &geo::ffn_rows<false>, {"weight"}, 1});
    b.param(at.sub("fc", fc), {"bias", &geo::ffn_rows<true>, {"bias"}, 1, presence::out_bias});
    b.param(at.sub("down", proj), {"weight", &geo::down<&geo::dense_ffn>, {"weight"}, 1});
    b.param(at.sub("down", proj), {"bias", &geo::hidden, {"bias"}, 1, presence::out_bias});
    b.uses(A);
    basic_text<64> name("plain_mlp<");
    name.add(name_of(A), ">");
    return b.costs(b.node(at, &modules::plain_mlp, {}, name.view(), name.view(), neox ? &details<true> : &details<false>,
                          knobs_of(knobs)),
                   mlp_keeps);
  }
};

}  // namespace megadsl::blocks
