// Attention: GQA with RoPE, windows, sinks, chunks and soft-caps, its HF q/k/v stored apart or fused.
#pragma once

#include "megadsl/blocks/qk_norms.hpp"

namespace megadsl::blocks {

struct attention_knobs {
  static constexpr std::string_view knobs_name = "attention_knobs";
  tensor_storage storage = tensor_storage::separate;  // HF's q/k/v: q_proj, k_proj, v_proj or qkv_proj
  bool rope = true;  // false: a NoPE layer, q and k unrotated (SmolLM3's no_rope_layers zeros)
  bool sinks = false;  // gpt-oss's learned sink logit per query head (self_attn.sinks), split with the heads
  bool chunked = false;  // Llama 4's RoPE layers: attention within chunks (its key attention_chunk_size)
  bool temperature = false;  // Llama 4's NoPE layers: q scaled per position (attn_temperature_tuning, floor_scale, attn_scale)
  // A config key of the family's whose value scales the scores outright, not head_dim^-1/2
  // (Granite's attention_multiplier); null: none.
  const config_setting* score_scale = nullptr;
};

// The keys of the chunked and the temperature-tuned attention (Llama4TextConfig's, with its defaults).
inline constexpr config_setting attention_chunk_size{
    .key = "attention_chunk_size", .fallback = 8192, .kind = setting_kind::integer, .least = 1,
    .meaning = "the chunked layers attend within chunks of this many tokens of their sequence"};
inline constexpr config_setting attn_temperature_tuning{
    .key = "attn_temperature_tuning", .fallback = 1, .kind = setting_kind::truthy,
    .meaning = "the NoPE layers scale q by 1 + attn_scale ln(1 + floor((p + 1) / floor_scale)) at position p"};
// (An integer in Llama4TextConfig, whose strict fields refuse 3.0 where they take 3.)
inline constexpr config_setting floor_scale{
    .key = "floor_scale", .fallback = 8192, .kind = setting_kind::integer, .meaning = "the temperature tuning's position divisor"};
inline constexpr config_setting attn_scale{
    .key = "attn_scale", .fallback = 0.1, .meaning = "the temperature tuning's slope"};

// Temperature tuning divides each position by floor_scale.
constexpr void temperature_rule(const shape& s, const layout&, violations& out) {
  if (s.arch == nullptr || s.settings.dynamic) return;
  if (setting(s, attn_temperature_tuning.key) != 0 && !(setting(s, floor_scale.key) > 0))
    out.add("floor_scale_positive")
        .add("floor_scale = ", setting(s, floor_scale.key), " with attn_temperature_tuning on: the NoPE layers divide "
             "each position by it; give a positive floor_scale (Llama 4's is 8192) or turn the tuning off");
}

constexpr void concatenated_qkv_rule(const shape& s, const layout&, violations& out) {
  if (s.qkv_bias.is_static() && s.qkv_bias.get())
    out.add("concatenated_qkv_has_no_bias")
        .add("qkv_bias = true with q/k/v stored concatenated (qkv_proj), which has no bias tensor in HF; "
             "use separate storage (attention<>) or qkv_bias = false");
}

// Grouped-query attention's (cp_whole_stream_heads): the tp rank's [q | k | v] of whole kv groups
// there and the output back; where its kv groups do not split over cp, q alone there and k and v
// gathered whole. Fewer kv heads than tp ranks: each rank holds one.
constexpr double gqa_cp_sent(const shape& s, std::int64_t tp, std::int64_t cp) {
  const std::int64_t d = effective_head_dim(s).get(), n = s.heads.get() / tp;
  const std::int64_t g = s.kv_heads.get() >= tp ? s.kv_heads.get() / tp : 1;
  if (g % cp == 0) return static_cast<double>((2 * n + 2 * g) * d) * all_to_all_share(cp);
  return static_cast<double>(2 * n * d) * all_to_all_share(cp) + static_cast<double>(2 * g * d * (cp - 1));
}
// Under the ring: its tp rank's kv heads' k and v (one head when they are fewer than tp).
constexpr double gqa_ring_sent(const shape& s, std::int64_t tp) {
  const std::int64_t g = s.kv_heads.get() >= tp ? s.kv_heads.get() / tp : 1;
  return static_cast<double>(2 * g * effective_head_dim(s).get());
}
constexpr void interleaved_qkv_rule(const shape& s, const layout&, violations& out) {
  if (megadsl::detail::known(s.heads, s.kv_heads) && s.heads.get() != s.kv_heads.get())
    out.add("interleaved_qkv_needs_kv_heads_equal_heads", {s.heads.get(), s.kv_heads.get()})
        .add("kv_heads = ", s.kv_heads.get(), " with heads = ", s.heads.get(),
             ": query_key_value holds one [q; k; v] triple per head; use kv_heads = ", s.heads.get());
}

// Under invariant arithmetic (rules.hpp's check_invariant) o_proj's input, num_heads * head_dim,
// is summed in equal chunks.
constexpr void attention_out_invariant_rule(const shape& s, const layout& l, violations& out) {
  if (!l.invariant.is_static() || !l.invariant.get() || !megadsl::detail::known(s.heads, effective_head_dim(s))) return;
  const std::int64_t width = s.heads.get() * effective_head_dim(s).get();
  if (width % megadsl::detail::invariant_chunks != 0)
    out.add("invariant_chunks_fit", {width})
        .add("invariant arithmetic splits num_heads * head_dim (o_proj's input) = ", width, " into ",
             megadsl::detail::invariant_chunks, " equal chunks, and it does not divide; this model cannot run with invariant");
}

// Grouped-query self-attention with RoPE: q/k/v (fused per rank, column-parallel; bias per the
// shape's qkv_bias) and o (row-parallel; bias per out_bias, added after the reduction), with an
// optional q/k norm before RoPE. The shape's numbers set the score scale, soft-cap and rotated share.
template <attention_knobs K = attention_knobs{}, class QkNorm = no_qk_norm>
struct attention {
  static constexpr tensor_storage hf_storage = K.storage;
  static constexpr bool interleaved = K.storage == tensor_storage::interleaved;

  // Its scores over every key of the sequence: heads x head_dim (the formulas' L n d, per layer).
  static constexpr std::int64_t score_units(const shape& s) { return s.heads.get() * effective_head_dim(s).get(); }
  static constexpr row_dims sink_dims(const shape& s) { return {s.heads.get(), 0}; }

  static constexpr void details(const shape& s, basic_text<256>& t) {
    auto on = [](const auto& v) { return v.is_static() && v.get(); };
    t.add("  q/k/v", on(s.qkv_bias) ? " + bias" : "", on(s.out_bias) ? ", o + bias" : "", K.rope ? (on(s.rope_interleave) ? ", rope on pairs" : ", rope") : ", no rope",
          QkNorm::label);
    if (K.sinks) t.add(", learned sinks");
    const bool settings = s.arch != nullptr && !s.settings.dynamic;
    if (K.chunked && settings) t.add(", chunks of ", static_cast<std::int64_t>(setting(s, attention_chunk_size.key)));
    if (K.temperature && settings && setting(s, attn_temperature_tuning.key) != 0) t.add(", q temperature-tuned");
    if (s.query_pre_attn_scalar.is_static() && s.query_pre_attn_scalar.get() != 0) t.add(", scale query_pre_attn_scalar^-1/2");
    if (K.score_scale != nullptr && settings) t.add(", scores x ", setting(s, K.score_scale->key));
    if (s.attn_softcap.is_static() && s.attn_softcap.get() != 0) t.add(", tanh soft-cap");
    if (s.rotary_fraction.is_static() && s.rotary_fraction.get() != 1.0) t.add(" on part of each head");
    t.add(K.storage == tensor_storage::concatenated ? "  [self_attn: qkv_proj]"
          : interleaved                              ? "  [attention: query_key_value, per head]"
                                                     : "  [self_attn]");
  }

  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module(interleaved ? "attention" : "self_attn");
    if constexpr (K.chunked) b.setting(attention_chunk_size);
    if constexpr (K.score_scale != nullptr) b.setting(*K.score_scale);
    if constexpr (K.temperature) {
      b.setting(attn_temperature_tuning);
      b.setting(floor_scale);
      b.setting(attn_scale);
      b.rule(&temperature_rule);
    }
    if constexpr (K.storage == tensor_storage::separate) {
      b.param(at, {"qkv.weight", &geo::qkv<false>, {"q_proj.weight", "k_proj.weight", "v_proj.weight"}, 3});
      b.param(at, {"qkv.bias", &geo::qkv<true>, {"q_proj.bias", "k_proj.bias", "v_proj.bias"}, 3, presence::qkv_bias});
    } else if constexpr (K.storage == tensor_storage::concatenated) {
      b.param(at, {"qkv.weight", &geo::qkv<false>, {"qkv_proj.weight"}, 1, presence::always, true});
      b.rule(&concatenated_qkv_rule);
    } else {
      // query_key_value holds [q_h; k_h; v_h] per head (kv_heads == heads), so each tp rank's heads
      // are one contiguous block of its rows: a column split of the HF tensor.
      b.param(at, {"qkv.weight", &geo::neox_qkv<false>, {"query_key_value.weight"}, 1});
      b.param(at, {"qkv.bias", &geo::neox_qkv<true>, {"query_key_value.bias"}, 1, presence::qkv_bias});
      b.rule(&interleaved_qkv_rule);
    }
    // One logit per query head, in the softmax of each of its rows (gpt-oss): split over tp with the
    // heads (each rank's are contiguous), and over cp with the heads the core sees (Ulysses; the
    // ring's rows see every head of their tp rank).
    if constexpr (K.sinks) b.param(at, {"sinks", &geo::column<&sink_dims>, {"sinks"}, 1});
    int qk = -1;
    if constexpr (!std::is_same_v<QkNorm, no_qk_norm>) qk = lower_block<QkNorm>(b, at);
    const std::string_view o = interleaved ? "dense" : "o_proj";
    b.param(at.sub("o_proj", o), {"weight", &geo::attn_out, {"weight"}, 1});
    b.rule(&attention_out_invariant_rule);
    b.param(at.sub("o_proj", o), {"bias", &geo::hidden, {"bias"}, 1, presence::out_bias});
    basic_text<112> name("attention<");
    name.add(name_of(K.storage), K.rope ? "" : ", nope", K.sinks ? ", sinks" : "", K.chunked ? ", chunked" : "",
             K.temperature ? ", temperature" : "");
    if constexpr (K.score_scale != nullptr) name.add(", scores x ", K.score_scale->key);
    name.append(">");
    // Keeps its input (2, whole without SP) and the dropout mask (1), q and k (4), v (2), the
    // output projection's input (2) split over tp, and the softmax with its mask (5 a s b s).
    return b.ring_traffic(b.cp_traffic(b.costs(b.node(at, &modules::attention, {qk}, name.view(),
                                                      K.rope ? "attention" : "attention (no RoPE)", &details, knobs_of(K)),
                                               {.whole = 3, .split = 8, .scores = 5}, &score_units),
                                       &gqa_cp_sent),
                          &gqa_ring_sent);
  }
};

}  // namespace megadsl::blocks
