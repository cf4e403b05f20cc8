// Qwen3-Next's gated attention: q_proj = [q | gate] per head, the output times sigmoid(gate). A
// block only Qwen3-Next and the family built on it (Qwen3.5) use, so it lives with them (DESIGN
// decision 16), its module in gated_attention.cpp beside this file.
#pragma once

#include <memory>

#include "megadsl/blocks/attention.hpp"

namespace megadsl::modules {
// Its module (models/qwen3_next/gated_attention.cpp; child 0: its q/k norm); weak outside the
// runtime library, as the core's are.
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> gated_attention(const block_build& b);
}  // namespace megadsl::modules

namespace megadsl::blocks {

constexpr void gated_attention_ring_rule(const shape&, const layout& l, violations& out) {
  refuse_cp_ring(l, "Qwen3-Next's output-gated attention", out);
}

// Qwen3-Next's full-attention layers (Qwen3NextAttention): q_proj gives each head [q | gate] (2 x
// head_dim rows per head, so a tp rank's heads are one contiguous block, column-parallel); k_proj
// and v_proj replicated (they are small: Qwen3-Next has 2 kv heads), each rank projecting the kv
// heads its query heads read, so any tp the kv heads fit (a multiple or a divisor) works, fewer kv
// heads than ranks included; their gradients partial over tp; the q/k norm `QkNorm` per head before RoPE
// (zero-centred RMSNorms in Qwen3-Next); RoPE on the shape's rotary share; causal attention; the
// output times sigmoid(gate) before o_proj (row-parallel).
template <class QkNorm>
struct gated_attention {
  static constexpr std::int64_t d(const shape& s) { return effective_head_dim(s).get(); }
  static constexpr row_dims q(const shape& s) { return {2 * s.heads.get() * d(s), s.hidden.get()}; }
  static constexpr row_dims q_bias(const shape& s) { return {2 * s.heads.get() * d(s), 0}; }
  static constexpr row_dims kv(const shape& s) { return {s.kv_heads.get() * d(s), s.hidden.get()}; }
  static constexpr row_dims kv_bias(const shape& s) { return {s.kv_heads.get() * d(s), 0}; }
  static constexpr std::int64_t score_units(const shape& s) { return s.heads.get() * d(s); }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    auto on = [](const auto& v) { return v.is_static() && v.get(); };
    t.add("  q/k/v", on(s.qkv_bias) ? " + bias" : "", on(s.out_bias) ? ", o + bias" : "", ", rope",
          s.rotary_fraction.is_static() && s.rotary_fraction.get() != 1.0 ? " on part of each head" : "", QkNorm::label,
          ", output times sigmoid(gate)  [self_attn: q_proj = [q | gate] per head]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("self_attn");
    b.param(at, {"q_proj.weight", &geo::column<&q>, {"q_proj.weight"}, 1});
    const auto replicated = [&](std::string_view name, presence when, row_geometry_fn g, param_init init) {
      b.param(at, {name, g, {name}, 1, when, false, true, init});
    };
    replicated("k_proj.weight", presence::always, &geo::whole<&kv>, param_init::normal);
    replicated("v_proj.weight", presence::always, &geo::whole<&kv>, param_init::normal);
    b.param(at, {"q_proj.bias", &geo::column<&q_bias>, {"q_proj.bias"}, 1, presence::qkv_bias, false, false,
                 param_init::zeros});
    replicated("k_proj.bias", presence::qkv_bias, &geo::whole<&kv_bias>, param_init::zeros);
    replicated("v_proj.bias", presence::qkv_bias, &geo::whole<&kv_bias>, param_init::zeros);
    const int qk = lower_block<QkNorm>(b, at);
    b.param(at.sub("o_proj", "o_proj"), {"weight", &geo::attn_out, {"weight"}, 1});
    b.rule(&attention_out_invariant_rule);
    b.rule(&gated_attention_ring_rule);
    b.param(at.sub("o_proj", "o_proj"), {"bias", &geo::hidden, {"bias"}, 1, presence::out_bias});
    const int node = b.node(at, &modules::gated_attention, {qk}, "gated_attention", "attention (output gate)", &details);
    return b.cp_traffic(b.per_token(b.costs(node, {.whole = 3, .split = 10, .scores = 5}, &score_units), &verl_weights),
                        &gqa_cp_sent);
  }
  // verl counts q_proj twice as wide (the gate), k_proj, v_proj and o_proj: h (3 n d + 2 g d).
  static constexpr token_flops verl_weights(const shape& s) {
    return {.verl_weights = s.hidden.get() * (3 * s.heads.get() + 2 * s.kv_heads.get()) * d(s)};
  }
};

}  // namespace megadsl::blocks
