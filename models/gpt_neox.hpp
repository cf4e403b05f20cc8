// GPT-NeoX / Pythia as strong preset types: the gpt_neox composition (LayerNorms with biases, q/k/v
// interleaved per head, RoPE on a quarter of each head, parallel residual, exact-GELU MLP with
// biases), untied embed_in / embed_out.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Its checkpoints' names: gpt_neox.* for the decoder, embed_out, the critic's classifier, and its
// MLP's dense_h_to_4h / dense_4h_to_h.
inline constexpr blocks::decoder_names gpt_neox_names{.layers = "gpt_neox.layers", .embedding = "gpt_neox.embed_in",
                                                      .final_norm = "gpt_neox.final_layer_norm", .lm_head = "embed_out",
                                                      .value_head = "classifier", .signature = "gpt_neox names"};
inline constexpr blocks::plain_mlp_names gpt_neox_mlp_names{"dense_h_to_4h", "dense_4h_to_h"};

// GPT-NeoX (Pythia): LayerNorms, q/k/v interleaved per head in one tensor, attention and MLP side
// by side on the block's input, exact GELU; its HF names (gpt_neox_names). Its partial rotary
// share is a number of the shape (rotary_fraction, config.json's partial_rotary_factor).
using gpt_neox_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::parallel<blocks::layer_norm, blocks::attention<blocks::attention_knobs{.storage = tensor_storage::interleaved}>>,
                  blocks::parallel<blocks::layer_norm, blocks::plain_mlp<activation::gelu, gpt_neox_mlp_names>>>,
    blocks::layer_norm, gpt_neox_names>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr std::string_view gpt_neox_omitted[] = {"num_key_value_heads", "head_dim"};  // kv_heads = heads
inline constexpr required_key gpt_neox_required[] = {
    {"use_parallel_residual", "attention and MLP side by side (parallel residual)"},
    {"attention_bias", "biases on query_key_value and dense (beside the MLP's)"},
};
inline constexpr config_key_rule gpt_neox_keys[] = {
    {"layer_norm_eps", key_use::read},   // its LayerNorms' eps
    {"rotary_pct", key_use::read},       // 4.x's partial_rotary_factor
    {"rotary_emb_base", key_use::read},  // 4.x's rope_theta
    {"use_parallel_residual", key_use::read},  // only true (the composition's)
    {"attention_bias", key_use::read},         // only true (q/k/v and dense biases)
    {"classifier_dropout", key_use::no_effect, "megadsl's value head has no dropout (verl's critics set it to 0)"},
};
// hidden_dropout: after each sublayer and after the embedding.
inline constexpr dropout_key gpt_neox_dropouts[] = {{.key = "hidden_dropout", .residual = true, .embedding = true}};
inline constexpr family_config gpt_neox_config{
    .model_type = "gpt_neox", .hf_class = "GPTNeoX", .display = "GPT-NeoX/Pythia",
    .arch = &architecture_of<gpt_neox_blocks>, .max_positions = 2048, .rms_eps = 1e-5, .eps_key = "layer_norm_eps",
    .bias = {.qkv = {.fallback = true}, .out = {.fallback = true}}, .theta_key = "rotary_emb_base", .partial_rotary_key = "rotary_pct",
    .partial_rotary_default = 0.25, .legacy_rope_keys = true, .omitted_keys = gpt_neox_omitted,
    .required = gpt_neox_required, .dropouts = gpt_neox_dropouts, .keys = gpt_neox_keys};

// The family: biases everywhere (qkv_bias, out_bias); the critic's head is HF's `classifier`.
template <shape S>
struct gpt_neox : decoder_family<gpt_neox_blocks, S> {
  static constexpr std::string_view family = gpt_neox_config.model_type;
  static constexpr std::string_view name = "gpt_neox";
};

// 16 heads of 128, 32 of whose dims rotate; vocab 50304 (the tokenizer's 50277, padded by EleutherAI).
struct pythia_1_4b : gpt_neox<shape{.hidden = 2048, .layers = 24, .heads = 16, .kv_heads = 16, .ffn = 8192,
                                    .vocab = 50304, .max_positions = 2048, .rms_eps = 1e-5,
                                    .rope_theta = 10000.0, .qkv_bias = true, .tie_embeddings = false,
                                    .out_bias = true, .rotary_fraction = 0.25}> {
  static constexpr std::string_view name = "pythia-1.4b";
  static constexpr std::string_view hf_repo = "EleutherAI/pythia-1.4b";
  static constexpr std::int64_t published_params = 1'414'647'808;
};

}  // namespace megadsl
