// The plain MLP: proj(act(fc(x))), its HF names bound by the family.
#pragma once

#include "megadsl/blocks/gated_mlp.hpp"

namespace megadsl::blocks {

// HF's names of a plain MLP's two projections, bound by the family (c_fc / c_proj by default).
struct plain_mlp_names {
  std::string_view fc = "c_fc", proj = "c_proj";
};
inline constexpr plain_mlp_names c_fc_c_proj{};

// proj(act(fc(x) + b_fc)) + b_proj: fc column-parallel with its bias split, proj row-parallel with
// its bias added after the reduction (biases per the shape's out_bias).
template <activation A = activation::gelu_tanh, const plain_mlp_names& Names = c_fc_c_proj>
struct plain_mlp {
  static constexpr mlp_knobs knobs{A};
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add(s.out_bias.is_static() && s.out_bias.get() ? " + biases" : "", "  [mlp: ", Names.fc, ", ", Names.proj, "]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("mlp");
    const std::string_view fc = Names.fc, proj = Names.proj;
    b.param(at.sub("fc", fc), {"weight", &geo::ffn_rows<false>, {"weight"}, 1});
    b.param(at.sub("fc", fc), {"bias", &geo::ffn_rows<true>, {"bias"}, 1, presence::out_bias});
    b.param(at.sub("down", proj), {"weight", &geo::down<&geo::dense_ffn>, {"weight"}, 1});
    b.param(at.sub("down", proj), {"bias", &geo::hidden, {"bias"}, 1, presence::out_bias});
    b.uses(A);
    basic_text<64> name("plain_mlp<");
    name.add(name_of(A), ">");
    return b.costs(b.node(at, &modules::plain_mlp, {}, name.view(), name.view(), &details, knobs_of(knobs)), mlp_keeps);
  }
};

}  // namespace megadsl::blocks
