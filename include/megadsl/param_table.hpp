// The Llama family's parameters: megadsl names, HF names and how each is sharded. One table,
// read by the shard plan, `describe`, the loader, the saver and distributed checkpoints.
//
// `{layer}` stands for the global layer index. Fused parameters list their HF sources in slot
// order: qkv = [q, k, v], gate_up = [gate, up].
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

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
enum class presence : std::int8_t { always, qkv_bias, actor, critic, critic_bias };

// Where a parameter lives in the pipeline.
enum class placement : std::int8_t { first_stage, layer, last_stage };

struct param_row {
  std::string_view name;  // megadsl parameter name (checkpoint key of a distributed checkpoint)
  shard_kind kind;
  placement where;
  presence when;
  std::array<std::string_view, 3> hf;  // HF source names, in fused-slot order
  int hf_count;
};

inline constexpr std::array<param_row, 12> llama_params{{
    {"embed.weight", shard_kind::vocab, placement::first_stage, presence::always,
     {"model.embed_tokens.weight"}, 1},
    {"layers.{layer}.attn_norm.weight", shard_kind::replicated, placement::layer, presence::always,
     {"model.layers.{layer}.input_layernorm.weight"}, 1},
    {"layers.{layer}.qkv.weight", shard_kind::fused_qkv, placement::layer, presence::always,
     {"model.layers.{layer}.self_attn.q_proj.weight", "model.layers.{layer}.self_attn.k_proj.weight",
      "model.layers.{layer}.self_attn.v_proj.weight"}, 3},
    {"layers.{layer}.qkv.bias", shard_kind::fused_qkv, placement::layer, presence::qkv_bias,
     {"model.layers.{layer}.self_attn.q_proj.bias", "model.layers.{layer}.self_attn.k_proj.bias",
      "model.layers.{layer}.self_attn.v_proj.bias"}, 3},
    {"layers.{layer}.o_proj.weight", shard_kind::row, placement::layer, presence::always,
     {"model.layers.{layer}.self_attn.o_proj.weight"}, 1},
    {"layers.{layer}.mlp_norm.weight", shard_kind::replicated, placement::layer, presence::always,
     {"model.layers.{layer}.post_attention_layernorm.weight"}, 1},
    {"layers.{layer}.gate_up.weight", shard_kind::fused_gate_up, placement::layer, presence::always,
     {"model.layers.{layer}.mlp.gate_proj.weight", "model.layers.{layer}.mlp.up_proj.weight"}, 2},
    {"layers.{layer}.down.weight", shard_kind::row, placement::layer, presence::always,
     {"model.layers.{layer}.mlp.down_proj.weight"}, 1},
    {"final_norm.weight", shard_kind::replicated, placement::last_stage, presence::always,
     {"model.norm.weight"}, 1},
    // Tied embeddings: the HF source is the embedding; on pp > 1 the last stage keeps a copy.
    {"lm_head.weight", shard_kind::vocab, placement::last_stage, presence::actor,
     {"lm_head.weight"}, 1},
    {"value_head.weight", shard_kind::replicated, placement::last_stage, presence::critic,
     {"score.weight"}, 1},
    {"value_head.bias", shard_kind::replicated, placement::last_stage, presence::critic_bias,
     {"score.bias"}, 1},
}};

// Names a critic accepts for its value head when loading (DESIGN §7), in order of preference.
// `lm_head.weight` counts only with shape (1, h).
inline constexpr std::array<std::string_view, 5> value_head_sources{
    {"score", "v_head", "value_head", "reward_head", "lm_head"}};

}  // namespace megadsl
