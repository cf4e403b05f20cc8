// IBM Granite 3.x dense (model_type granite) as strong preset types: the Llama blocks with Granite's
// four multipliers, numbers of the shape read from config.json (embedding_multiplier,
// residual_multiplier, attention_multiplier, logits_scaling), biases on q/k/v and o_proj by
// `attention_bias`, on gate/up/down by `mlp_bias`.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule granite_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},        // q/k/v and o_proj biases
    {"mlp_bias", key_use::read},              // gate/up/down biases
    {"embedding_multiplier", key_use::read},  // the embedding's output times it
    {"residual_multiplier", key_use::read},   // each sublayer's output times it before the residual add
    {"attention_multiplier", key_use::read},  // the scores' scale (not head_dim^-0.5)
    {"logits_scaling", key_use::read},        // the logits divided by it
};
inline constexpr family_config granite_config{
    .model_type = "granite", .hf_class = "Granite", .display = "Granite 3.x",
    .arch = &architecture_of<llama_blocks>, .max_positions = 2048, .rms_eps = 1e-6,
    .bias = bias_rule::attention_bias, .reads_mlp_bias = true, .multipliers = true, .keys = granite_keys};

// Granite: Llama's composition; its multipliers are the shape's numbers of those names.
template <shape S>
struct granite : decoder_family<llama_blocks, S> {
  static constexpr std::string_view family = granite_config.model_type;
  static constexpr std::string_view name = "granite";
};

// Granite-3.3-8B-Instruct (its config.json): Llama's shape, tied embeddings, the embedding times 12,
// each sublayer's output times 0.22, the scores times 1/128 (not head_dim^-0.5), the logits / 16.
struct granite3_3_8b : granite<shape{.hidden = 4096, .layers = 40, .heads = 32, .kv_heads = 8, .ffn = 12800,
                                     .vocab = 49159, .max_positions = 131072, .rms_eps = 1e-5,
                                     .rope_theta = 10000000.0, .tie_embeddings = true, .embedding_multiplier = 12.0,
                                     .residual_multiplier = 0.22, .attention_multiplier = 0.0078125,
                                     .logits_scaling = 16.0}> {
  static constexpr std::string_view name = "granite-3.3-8b";
  static constexpr std::string_view hf_repo = "ibm-granite/granite-3.3-8b-instruct";
  static constexpr std::int64_t published_params = 8'170'864'640;
};

}  // namespace megadsl
