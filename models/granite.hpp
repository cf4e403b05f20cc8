// IBM Granite 3.x dense (model_type granite) as strong preset types: the Llama blocks with Granite's
// four multipliers, numbers of the shape read from config.json (embedding_multiplier,
// residual_multiplier, attention_multiplier, logits_scaling), biases on q/k/v and o_proj by
// `attention_bias`, on gate/up/down by `mlp_bias`.
#pragma once

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

}  // namespace megadsl
