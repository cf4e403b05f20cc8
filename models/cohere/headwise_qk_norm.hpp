// Command R+'s q/k norms with a weight for every head: a block only Cohere uses, so it lives with
// the family (DESIGN decision 16). Its module is the core's per-head q/k norm, told by its knobs
// that the weights are per head (blocks::qk_norm_knobs::weight_per_head).
#pragma once

#include "megadsl/blocks/qk_norms.hpp"

namespace megadsl::blocks {

// Cohere (Command R+): q and k each normed over head_dim as per_head_qk_norm's, with a weight for
// every head: q_norm.weight (heads, d), k_norm.weight (kv_heads, d), split over tp with the heads,
// so each rank holds and steps its own heads' weights (with kv_heads < tp, its kv group's k weight,
// replicated like its k rows, the replicas' gradients summed).
template <norm_block N>
struct headwise_qk_norm {
  static constexpr qk_norm_knobs knobs{.weight_per_head = true};
  static constexpr std::string_view label = ", q/k norm per head, a weight per head";
  static constexpr int lower(arch_builder& b, const slot& at) {
    int nodes[2]{};
    const std::string_view names[2] = {"q_norm", "k_norm"};
    const row_geometry_fn geometries[2] = {&geo::q_head_weights, &geo::kv_head_weights};
    for (int i = 0; i < 2; ++i) {
      b.param(at.sub(names[i], names[i]), {.name = "weight", .geometry = geometries[i], .hf = {"weight"},
                                           .hf_count = 1, .init = N::init});
      nodes[i] = b.node(at.sub(names[i], names[i]), N::module, {}, N::label);
    }
    return b.node(at, &modules::per_head_qk_norm, {nodes[0], nodes[1]}, "headwise_qk_norm", {}, nullptr, knobs_of(knobs));
  }
};

}  // namespace megadsl::blocks
