// A block megadsl does not have, in this example's own files: a learned scale for every query head
// and every kv head, soft-capped, applied to q and k before RoPE (in the q/k slot of megadsl's
// attention, attention<{}, learned_qk_scales>). It brings what no megadsl block has:
//   - a tensor geometry of its own: k_scale is a vector of one number per kv head, split over tp
//     with the kv heads and, with fewer kv heads than tp ranks, held by each rank for its group
//     (replicated, the copies' gradients summed), as the fused k rows are;
//   - a config.json key of its own, qk_scale_cap (default 4, older spelling qk_scales_cap): the
//     scales are cap * tanh(w / cap). megadsl's reader takes it from config.json, checks it, and
//     writes it back; no megadsl file names it.
// Torch-free: the rows, the geometry and the key; the module is in qk_scales.cpp.
#pragma once

#include <array>
#include <memory>

#include "megadsl/layers/blocks.hpp"

namespace example {

// Defined in qk_scales.cpp (weak like megadsl's own factories, for torch-free programs).
MEGADSL_FACTORY_LINKAGE std::unique_ptr<megadsl::block_module> make_qk_scales(const megadsl::block_build& b);

// (heads): split over tp with the query heads.
constexpr megadsl::row_geometry q_scale_geometry(const megadsl::shape& s) {
  return {.split = 0, .sources = {{{s.heads.get()}}}};
}
// (kv_heads): split with the kv heads; with kv_heads < tp each rank holds its group's one.
constexpr megadsl::row_geometry k_scale_geometry(const megadsl::shape& s) {
  return {.split = 0, .sources = {{{.units = s.kv_heads.get(), .unit = 1, .replicated_when_fewer = true}}}};
}

struct learned_qk_scales {
  static constexpr megadsl::config_setting cap{
      .key = "qk_scale_cap", .fallback = 4.0, .least = 0.25, .most = 64.0,
      .meaning = "the learned q/k scales are soft-capped: cap * tanh(w / cap)", .also = {"qk_scales_cap"}};
  static constexpr std::array<megadsl::block_param, 2> params{{
      {.name = "q_scale", .geometry = &q_scale_geometry, .hf = {"q_scale"}, .init = megadsl::param_init::ones},
      {.name = "k_scale", .geometry = &k_scale_geometry, .hf = {"k_scale"}, .init = megadsl::param_init::ones},
  }};
  static constexpr std::string_view label = ", q/k scaled per head (learned, soft-capped)";
  static constexpr int lower(megadsl::blocks::arch_builder& b, const megadsl::blocks::slot& attention) {
    b.setting(cap);
    return b.leaf(attention, params, &make_qk_scales, "learned_qk_scales",
                  "learned_qk_scales  q, k times cap tanh(w / cap), a scale per head  [self_attn: q_scale, k_scale]");
  }
};

}  // namespace example
