// The decoder's parameters, block by block: megadsl names, HF names and how each is sharded. One
// table, read by the shard plan, `describe`, the loader, the saver and distributed checkpoints;
// a model's shape (its family's block knobs) selects its rows.
//
// `{layer}` stands for the global layer index, `{expert}` for the expert's index in its layer.
// Fused parameters list their HF sources in slot order: qkv = [q, k, v], gate_up = [gate, up].
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "megadsl/shape.hpp"

namespace megadsl {

enum class shard_kind : std::int8_t {
  column,         // split dim 0 over tp
  row,            // split dim 1 over tp
  vocab,          // split dim 0 over tp after padding the vocab
  replicated,     // whole on every tp rank
  fused_qkv,      // column; per rank, per local kv group: [q heads | k | v]
  fused_gate_up,  // column; per rank [gate_r ; up_r]
};

constexpr std::string_view name_of(shard_kind k) {
  switch (k) {
    case shard_kind::column: return "column";
    case shard_kind::row: return "row";
    case shard_kind::vocab: return "vocab";
    case shard_kind::replicated: return "replicated";
    case shard_kind::fused_qkv: return "fused q/k/v";
    case shard_kind::fused_gate_up: return "fused gate/up";
  }
  return "?";
}

// When a row exists in a given model.
enum class presence : std::int8_t {
  always, qkv_bias,
  qk_norm,             // per head (Qwen3)
  qk_norm_full,        // over the full width (OLMo2)
  separate,            // HF stores q/k/v as separate tensors
  concatenated,        // HF stores them as one tensor, rows in slot order (Phi-3)
  gated_separate,      // gated MLP, gate and up separate
  gated_concatenated,  // gated MLP, gate_up_proj
  gated,               // gated MLP (its down projection)
  gated_bias,          // gated MLP with biases (mlp_bias), gate and up separate
  plain,               // plain MLP (c_fc, c_proj)
  plain_bias,          // plain MLP with biases (out_bias)
  out_bias,            // o_proj bias (out_bias)
  pre_norm_bias,       // LayerNorm's bias, pre_norm residual
  norm_bias,           // LayerNorm's bias (final norm)
  pre_norms,           // residual pre_norm or sandwich: norms before the sublayers
  pre_norm_mlp,        // residual pre_norm: the MLP's norm, at post_attention_layernorm
  sandwich_mlp,        // residual sandwich: the MLP's pre-norm, at pre_feedforward_layernorm
  post_norms,          // residual post_norm or sandwich: norms after the sublayers
  moe_mixtral,         // a mixture of experts under Mixtral's names
  moe_qwen,            // a mixture of experts under Qwen's names
  shared_expert,       // the shared expert and its gate (Qwen2-MoE)
  actor, critic, critic_bias,
};

// Where a parameter lives: in the pipeline (first stage, its layer's stage, last stage), and for an
// expert's weights also in the expert-parallel group (the rank holding that expert).
enum class placement : std::int8_t { first_stage, layer, last_stage, expert };


// The extent of the dimension a row's HF tensors do not split: what `plan_of` sizes it by.
enum class extent : std::int8_t {
  hidden,      // (h) norm weights; (h, in) row-parallel outputs
  head_dim,    // (d) per-head q/k norm weights
  q_width,     // (heads * d) full-width q norm weight, split over tp like the q heads
  k_width,     // (kv_heads * d) full-width k norm weight, split over tp like the kv heads
  attn_width,  // row-parallel input heads * head_dim (o_proj)
  ffn,         // row-parallel input intermediate_size (down)
  ffn_rows,    // column-parallel output intermediate_size (a plain MLP's fc and its bias)
  qkv_rows,    // column-parallel output (heads + 2 kv_heads) * head_dim, q/k/v interleaved per head
  experts,     // (experts, h): the router
  one_row,     // (1, h): the shared expert's gate
  expert_ffn,  // an expert's intermediate size (gate_up rows, down's input)
  shared_ffn,  // the shared expert's intermediate size
  none,        // the shape follows from the kind alone
};

struct param_row {
  std::string_view name;  // megadsl parameter name (checkpoint key of a distributed checkpoint)
  shard_kind kind;
  placement where;
  presence when;
  std::array<std::string_view, 3> hf;  // HF source names, in fused-slot order
  int hf_count;
  extent size = extent::none;
  bool concatenated = false;  // the slots are rows of the one HF tensor `hf[0]`, in slot order
  name_scheme names = name_scheme::llama;  // the checkpoints whose names `hf` are (a row exists in
                                           // a model only under its own scheme)
  // Replicated, but each tp rank's gradient is a partial sum (summed over tp): a per-head q/k norm
  // applied to each rank's own heads, a router or gate weighing outputs that are partial over tp.
  bool grad_partial_over_tp = false;
};

// A bias (a vector added after its projection).
constexpr bool is_bias(const param_row& r) { return r.name.ends_with(".bias"); }
// The LM head (the actor's) and the value head (the critic's weight, its bias).
constexpr bool is_lm_head_row(const param_row& r) { return r.when == presence::actor; }

// Each block of the vocabulary (layers/blocks.hpp) declares its parameters here: megadsl name,
// shard kind, placement, when present, HF names bound at its slot. A model's table is every row
// whose presence its shape switches on (shard_plan.hpp), in this order.
namespace block_params {

inline constexpr std::array<param_row, 2> embedding{{
    {"embed.weight", shard_kind::vocab, placement::first_stage, presence::always,
     {"model.embed_tokens.weight"}, 1},
    {"embed.weight", shard_kind::vocab, placement::first_stage, presence::always,
     {"gpt_neox.embed_in.weight"}, 1, extent::none, false, name_scheme::gpt_neox},
}};

// pre_norm<rms_norm, attention>: the norm at the slot HF calls input_layernorm; post_norm<...>: at
// post_attention_layernorm (the same HF name means another slot: names are bound at the slot);
// sandwich<...>: both.
inline constexpr std::array<param_row, 18> attention{{
    {"layers.{layer}.attn_norm.weight", shard_kind::replicated, placement::layer, presence::pre_norms,
     {"model.layers.{layer}.input_layernorm.weight"}, 1, extent::hidden},
    {"layers.{layer}.attn_norm.bias", shard_kind::replicated, placement::layer, presence::pre_norm_bias,
     {"model.layers.{layer}.input_layernorm.bias"}, 1, extent::hidden},
    {"layers.{layer}.qkv.weight", shard_kind::fused_qkv, placement::layer, presence::separate,
     {"model.layers.{layer}.self_attn.q_proj.weight", "model.layers.{layer}.self_attn.k_proj.weight",
      "model.layers.{layer}.self_attn.v_proj.weight"}, 3},
    {"layers.{layer}.qkv.weight", shard_kind::fused_qkv, placement::layer, presence::concatenated,
     {"model.layers.{layer}.self_attn.qkv_proj.weight"}, 1, extent::none, true},
    {"layers.{layer}.qkv.bias", shard_kind::fused_qkv, placement::layer, presence::qkv_bias,
     {"model.layers.{layer}.self_attn.q_proj.bias", "model.layers.{layer}.self_attn.k_proj.bias",
      "model.layers.{layer}.self_attn.v_proj.bias"}, 3},
    // Per-head q/k RMSNorm (Qwen3): one head_dim vector each, shared by every head.
    {"layers.{layer}.q_norm.weight", shard_kind::replicated, placement::layer, presence::qk_norm,
     {"model.layers.{layer}.self_attn.q_norm.weight"}, 1, extent::head_dim, false, name_scheme::llama, true},
    {"layers.{layer}.k_norm.weight", shard_kind::replicated, placement::layer, presence::qk_norm,
     {"model.layers.{layer}.self_attn.k_norm.weight"}, 1, extent::head_dim, false, name_scheme::llama, true},
    // Full-width q/k RMSNorm (OLMo2): split over tp with the heads they scale.
    {"layers.{layer}.q_norm.weight", shard_kind::column, placement::layer, presence::qk_norm_full,
     {"model.layers.{layer}.self_attn.q_norm.weight"}, 1, extent::q_width},
    {"layers.{layer}.k_norm.weight", shard_kind::column, placement::layer, presence::qk_norm_full,
     {"model.layers.{layer}.self_attn.k_norm.weight"}, 1, extent::k_width},
    {"layers.{layer}.o_proj.weight", shard_kind::row, placement::layer, presence::always,
     {"model.layers.{layer}.self_attn.o_proj.weight"}, 1, extent::attn_width},
    // Added after the row-parallel reduction (on SP shards under SP).
    {"layers.{layer}.o_proj.bias", shard_kind::replicated, placement::layer, presence::out_bias,
     {"model.layers.{layer}.self_attn.o_proj.bias"}, 1, extent::hidden},
    {"layers.{layer}.attn_post_norm.weight", shard_kind::replicated, placement::layer, presence::post_norms,
     {"model.layers.{layer}.post_attention_layernorm.weight"}, 1, extent::hidden},
    // GPT-NeoX: query_key_value holds [q_h; k_h; v_h] per head (kv_heads == heads), so each tp
    // rank's heads are one contiguous block of its rows: a column split of the HF tensor.
    {"layers.{layer}.attn_norm.weight", shard_kind::replicated, placement::layer, presence::pre_norms,
     {"gpt_neox.layers.{layer}.input_layernorm.weight"}, 1, extent::hidden, false, name_scheme::gpt_neox},
    {"layers.{layer}.attn_norm.bias", shard_kind::replicated, placement::layer, presence::pre_norm_bias,
     {"gpt_neox.layers.{layer}.input_layernorm.bias"}, 1, extent::hidden, false, name_scheme::gpt_neox},
    {"layers.{layer}.qkv.weight", shard_kind::column, placement::layer, presence::always,
     {"gpt_neox.layers.{layer}.attention.query_key_value.weight"}, 1, extent::qkv_rows, false, name_scheme::gpt_neox},
    {"layers.{layer}.qkv.bias", shard_kind::column, placement::layer, presence::qkv_bias,
     {"gpt_neox.layers.{layer}.attention.query_key_value.bias"}, 1, extent::qkv_rows, false, name_scheme::gpt_neox},
    {"layers.{layer}.o_proj.weight", shard_kind::row, placement::layer, presence::always,
     {"gpt_neox.layers.{layer}.attention.dense.weight"}, 1, extent::attn_width, false, name_scheme::gpt_neox},
    {"layers.{layer}.o_proj.bias", shard_kind::replicated, placement::layer, presence::out_bias,
     {"gpt_neox.layers.{layer}.attention.dense.bias"}, 1, extent::hidden, false, name_scheme::gpt_neox},
}};

// pre_norm<norm, gated_mlp | plain_mlp>: the norm at the slot HF calls post_attention_layernorm;
// post_norm<...>: at post_feedforward_layernorm; sandwich<...>: pre_ and post_feedforward_layernorm.
inline constexpr std::array<param_row, 19> mlp{{
    {"layers.{layer}.mlp_norm.weight", shard_kind::replicated, placement::layer, presence::pre_norm_mlp,
     {"model.layers.{layer}.post_attention_layernorm.weight"}, 1, extent::hidden},
    {"layers.{layer}.mlp_norm.weight", shard_kind::replicated, placement::layer, presence::sandwich_mlp,
     {"model.layers.{layer}.pre_feedforward_layernorm.weight"}, 1, extent::hidden},
    {"layers.{layer}.mlp_norm.bias", shard_kind::replicated, placement::layer, presence::pre_norm_bias,
     {"model.layers.{layer}.post_attention_layernorm.bias"}, 1, extent::hidden},
    {"layers.{layer}.gate_up.weight", shard_kind::fused_gate_up, placement::layer, presence::gated_separate,
     {"model.layers.{layer}.mlp.gate_proj.weight", "model.layers.{layer}.mlp.up_proj.weight"}, 2},
    {"layers.{layer}.gate_up.weight", shard_kind::fused_gate_up, placement::layer, presence::gated_concatenated,
     {"model.layers.{layer}.mlp.gate_up_proj.weight"}, 1, extent::none, true},
    {"layers.{layer}.down.weight", shard_kind::row, placement::layer, presence::gated,
     {"model.layers.{layer}.mlp.down_proj.weight"}, 1, extent::ffn},
    // Llama's mlp_bias: gate/up biases split over tp with their rows, down's added after the reduction.
    {"layers.{layer}.gate_up.bias", shard_kind::fused_gate_up, placement::layer, presence::gated_bias,
     {"model.layers.{layer}.mlp.gate_proj.bias", "model.layers.{layer}.mlp.up_proj.bias"}, 2},
    {"layers.{layer}.down.bias", shard_kind::replicated, placement::layer, presence::gated_bias,
     {"model.layers.{layer}.mlp.down_proj.bias"}, 1, extent::hidden},
    // plain_mlp<...> (StarCoder2): c_fc column-parallel with its bias split, c_proj row-parallel.
    {"layers.{layer}.fc.weight", shard_kind::column, placement::layer, presence::plain,
     {"model.layers.{layer}.mlp.c_fc.weight"}, 1, extent::ffn_rows},
    {"layers.{layer}.fc.bias", shard_kind::column, placement::layer, presence::plain_bias,
     {"model.layers.{layer}.mlp.c_fc.bias"}, 1, extent::ffn_rows},
    {"layers.{layer}.down.weight", shard_kind::row, placement::layer, presence::plain,
     {"model.layers.{layer}.mlp.c_proj.weight"}, 1, extent::ffn},
    {"layers.{layer}.down.bias", shard_kind::replicated, placement::layer, presence::plain_bias,
     {"model.layers.{layer}.mlp.c_proj.bias"}, 1, extent::hidden},
    {"layers.{layer}.mlp_post_norm.weight", shard_kind::replicated, placement::layer, presence::post_norms,
     {"model.layers.{layer}.post_feedforward_layernorm.weight"}, 1, extent::hidden},
    // GPT-NeoX: the MLP's norm, and dense_h_to_4h / dense_4h_to_h with their biases.
    {"layers.{layer}.mlp_norm.weight", shard_kind::replicated, placement::layer, presence::pre_norm_mlp,
     {"gpt_neox.layers.{layer}.post_attention_layernorm.weight"}, 1, extent::hidden, false, name_scheme::gpt_neox},
    {"layers.{layer}.mlp_norm.bias", shard_kind::replicated, placement::layer, presence::pre_norm_bias,
     {"gpt_neox.layers.{layer}.post_attention_layernorm.bias"}, 1, extent::hidden, false, name_scheme::gpt_neox},
    {"layers.{layer}.fc.weight", shard_kind::column, placement::layer, presence::plain,
     {"gpt_neox.layers.{layer}.mlp.dense_h_to_4h.weight"}, 1, extent::ffn_rows, false, name_scheme::gpt_neox},
    {"layers.{layer}.fc.bias", shard_kind::column, placement::layer, presence::plain_bias,
     {"gpt_neox.layers.{layer}.mlp.dense_h_to_4h.bias"}, 1, extent::ffn_rows, false, name_scheme::gpt_neox},
    {"layers.{layer}.down.weight", shard_kind::row, placement::layer, presence::plain,
     {"gpt_neox.layers.{layer}.mlp.dense_4h_to_h.weight"}, 1, extent::ffn, false, name_scheme::gpt_neox},
    {"layers.{layer}.down.bias", shard_kind::replicated, placement::layer, presence::plain_bias,
     {"gpt_neox.layers.{layer}.mlp.dense_4h_to_h.bias"}, 1, extent::hidden, false, name_scheme::gpt_neox},
}};

// moe_mlp<...>: the router (replicated; under tp its gradient is summed over tp, since the experts'
// outputs it weighs are partial sums there), each expert a gated MLP split over etp like the dense
// one (placement::expert: the rank of the ep group holding it), and Qwen2-MoE's shared expert with
// its sigmoid gate. The MLP's norm is the gated MLP's row above (post_attention_layernorm).
inline constexpr std::array<param_row, 9> moe{{
    {"layers.{layer}.router.weight", shard_kind::replicated, placement::layer, presence::moe_mixtral,
     {"model.layers.{layer}.block_sparse_moe.gate.weight"}, 1, extent::experts, false, name_scheme::llama, true},
    {"layers.{layer}.experts.{expert}.gate_up.weight", shard_kind::fused_gate_up, placement::expert, presence::moe_mixtral,
     {"model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight",
      "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight"}, 2, extent::expert_ffn},
    {"layers.{layer}.experts.{expert}.down.weight", shard_kind::row, placement::expert, presence::moe_mixtral,
     {"model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight"}, 1, extent::expert_ffn},
    {"layers.{layer}.router.weight", shard_kind::replicated, placement::layer, presence::moe_qwen,
     {"model.layers.{layer}.mlp.gate.weight"}, 1, extent::experts, false, name_scheme::llama, true},
    {"layers.{layer}.experts.{expert}.gate_up.weight", shard_kind::fused_gate_up, placement::expert, presence::moe_qwen,
     {"model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight",
      "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"}, 2, extent::expert_ffn},
    {"layers.{layer}.experts.{expert}.down.weight", shard_kind::row, placement::expert, presence::moe_qwen,
     {"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"}, 1, extent::expert_ffn},
    {"layers.{layer}.shared_expert.gate_up.weight", shard_kind::fused_gate_up, placement::layer, presence::shared_expert,
     {"model.layers.{layer}.mlp.shared_expert.gate_proj.weight", "model.layers.{layer}.mlp.shared_expert.up_proj.weight"}, 2, extent::shared_ffn},
    {"layers.{layer}.shared_expert.down.weight", shard_kind::row, placement::layer, presence::shared_expert,
     {"model.layers.{layer}.mlp.shared_expert.down_proj.weight"}, 1, extent::shared_ffn},
    // Applied to the whole (gathered) input on every tp rank: replicated, its gradient partial per
    // tp rank (it scales the shared expert's partial sums).
    {"layers.{layer}.shared_expert_gate.weight", shard_kind::replicated, placement::layer, presence::shared_expert,
     {"model.layers.{layer}.mlp.shared_expert_gate.weight"}, 1, extent::one_row, false, name_scheme::llama, true},
}};

inline constexpr std::array<param_row, 4> final_norm{{
    {"final_norm.weight", shard_kind::replicated, placement::last_stage, presence::always,
     {"model.norm.weight"}, 1, extent::hidden},
    {"final_norm.bias", shard_kind::replicated, placement::last_stage, presence::norm_bias,
     {"model.norm.bias"}, 1, extent::hidden},
    {"final_norm.weight", shard_kind::replicated, placement::last_stage, presence::always,
     {"gpt_neox.final_layer_norm.weight"}, 1, extent::hidden, false, name_scheme::gpt_neox},
    {"final_norm.bias", shard_kind::replicated, placement::last_stage, presence::norm_bias,
     {"gpt_neox.final_layer_norm.bias"}, 1, extent::hidden, false, name_scheme::gpt_neox},
}};

// Tied embeddings: the HF source is the embedding; on pp > 1 the last stage keeps a copy.
inline constexpr std::array<param_row, 2> lm_head{{
    {"lm_head.weight", shard_kind::vocab, placement::last_stage, presence::actor,
     {"lm_head.weight"}, 1},
    {"lm_head.weight", shard_kind::vocab, placement::last_stage, presence::actor,
     {"embed_out.weight"}, 1, extent::none, false, name_scheme::gpt_neox},
}};

// GPTNeoXForTokenClassification names its head `classifier`, every other class `score`.
inline constexpr std::array<param_row, 4> value_head{{
    {"value_head.weight", shard_kind::replicated, placement::last_stage, presence::critic,
     {"score.weight"}, 1},
    {"value_head.bias", shard_kind::replicated, placement::last_stage, presence::critic_bias,
     {"score.bias"}, 1},
    {"value_head.weight", shard_kind::replicated, placement::last_stage, presence::critic,
     {"classifier.weight"}, 1, extent::none, false, name_scheme::gpt_neox},
    {"value_head.bias", shard_kind::replicated, placement::last_stage, presence::critic_bias,
     {"classifier.bias"}, 1, extent::none, false, name_scheme::gpt_neox},
}};

}  // namespace block_params

namespace detail {
template <std::size_t... N>
constexpr auto concat_rows(const std::array<param_row, N>&... parts) {
  std::array<param_row, (N + ...)> out{};
  std::size_t i = 0;
  auto append = [&](const auto& part) {
    for (const param_row& r : part) out[i++] = r;
  };
  (append(parts), ...);
  return out;
}
}  // namespace detail

// The decoder's composition in order: embedding, the block's two sublayers, final norm, heads.
inline constexpr auto decoder_params =
    detail::concat_rows(block_params::embedding, block_params::attention, block_params::mlp, block_params::moe,
                        block_params::final_norm, block_params::lm_head, block_params::value_head);
// An array declared longer than its rows would hold default rows, present in every model.
static_assert([] {
  for (const param_row& r : decoder_params)
    if (r.name.empty() || r.hf_count < 1) return false;
  return true;
}(), "megadsl: a block_params array is declared with more rows than it lists");

// Names a critic accepts for its value head when loading (DESIGN §7), in order of preference.
// `lm_head.weight` counts only with shape (1, h).
inline constexpr std::array<std::string_view, 6> value_head_sources{
    {"score", "classifier", "v_head", "value_head", "reward_head", "lm_head"}};

// The HF name of the embedding under a name scheme (a tied lm_head's source).
constexpr std::string_view embedding_hf_name(name_scheme n) {
  for (const param_row& r : block_params::embedding)
    if (r.names == n) return r.hf[0];
  return block_params::embedding[0].hf[0];
}

}  // namespace megadsl
