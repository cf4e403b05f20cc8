// The q/k norms an attention takes: per_head_qk_norm, full_width_qk_norm, no_qk_norm. (Command R+'s
// headwise_qk_norm and Llama 4's l2_qk_norm are their families', under models/.)
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// ---- attention and its q/k norms ------------------------------------------------------------------

// HF's names of a per-head q/k norm's two weights.
struct qk_norm_names {
  std::string_view q, k;
};
inline constexpr qk_norm_names hf_qk_norm_names{"q_norm", "k_norm"};

constexpr void qk_norm_after_rope_rule(const shape& s, const layout&, violations& out) {
  // RoPE on pairs leaves each head's dims as halves (apply_rope): a norm's per-dim weights after it
  // would meet other dims than HF's.
  if (s.rope_interleave.is_static() && s.rope_interleave.get())
    out.add("qk_norm_after_rope_needs_halves")
        .add("rope_interleave: q/k norms after RoPE on interleaved pairs are not supported; rotate halves");
}

// Qwen3: q and k normed over head_dim before RoPE, one weight each for every head (q_norm,
// k_norm; replicated, their gradients partial over tp: each rank norms its own heads). HunYuan
// norms them after RoPE (AfterRope) and names them query_layernorm / key_layernorm.
// What a per-head q/k norm's module is told (modules::per_head_qk_norm).
struct qk_norm_knobs {
  static constexpr std::string_view knobs_name = "qk_norm_knobs";
  bool after_rope = false;       // HunYuan: q and k rotated first, then normed
  bool weight_per_head = false;  // a weight per head: (heads, d) and (kv_heads, d) (Command R+)
};

template <norm_block N, const qk_norm_names& Names = hf_qk_norm_names, bool AfterRope = false>
struct per_head_qk_norm {
  static constexpr qk_norm_knobs knobs{.after_rope = AfterRope};
  static constexpr std::string_view label = AfterRope ? ", q/k rms_norm per head after rope" : ", q/k rms_norm per head";
  static constexpr int lower(arch_builder& b, const slot& at) {
    int nodes[2]{};
    const std::string_view ours[2] = {"q_norm", "k_norm"}, hf[2] = {Names.q, Names.k};
    for (int i = 0; i < 2; ++i) {
      b.param(at.sub(ours[i], hf[i]), {"weight", &geo::head_dim, {"weight"}, 1, presence::always, false, true,
                                       N::init});
      nodes[i] = b.node(at.sub(ours[i], hf[i]), N::module, {}, N::label);
    }
    if constexpr (AfterRope) b.rule(&qk_norm_after_rope_rule);
    return b.node(at, &modules::per_head_qk_norm, {nodes[0], nodes[1]}, "per_head_qk_norm", {}, nullptr, knobs_of(knobs));
  }
};

constexpr void full_width_qk_norm_rule(const shape& s, const layout& l, violations& out) {
  if (!l.tp.is_static() || l.tp.get() < 1 || !s.kv_heads.is_static() || s.kv_heads.get() < 1) return;
  const std::int64_t kv = s.kv_heads.get(), tp = l.tp.get();
  if (kv >= tp) return;
  text& m = out.add("full_width_qk_norm_needs_kv_heads_per_rank", {kv, tp});
  m.add("the k norm spans all ", kv, " kv heads, and tp = ", tp,
        " would replicate them (kv_heads < tp), which this norm's tp split does not support; valid tp: ");
  bool first = true;
  for (std::int64_t t = 1; t <= kv; ++t)
    if (kv % t == 0 && (!s.heads.is_static() || s.heads.get() < 1 || s.heads.get() % t == 0)) {
      m.add(first ? "" : ", ", t);
      first = false;
    }
}

// OLMo2: over the whole projection width (heads * d for q, kv_heads * d for k), split over tp with
// the heads: the fp32 sum of squares summed over tp, then each norm's weight step.
template <norm_block N>
struct full_width_qk_norm {
  static constexpr std::string_view label = ", q/k rms_norm over the full width";
  static constexpr int lower(arch_builder& b, const slot& at) {
    b.param(at.sub("q_norm", "q_norm"), {"weight", &geo::q_width, {"weight"}, 1, presence::always, false, false,
                                         N::init});
    b.param(at.sub("k_norm", "k_norm"), {"weight", &geo::k_width, {"weight"}, 1, presence::always, false, false,
                                         N::init});
    b.rule(&full_width_qk_norm_rule);
    const int q = b.node(at.sub("q_norm", "q_norm"), N::module, {}, N::label);
    const int k = b.node(at.sub("k_norm", "k_norm"), N::module, {}, N::label);
    return b.node(at, &modules::full_width_qk_norm, {q, k}, "full_width_qk_norm");
  }
};

struct no_qk_norm {
  static constexpr std::string_view label = "";
};

}  // namespace megadsl::blocks
