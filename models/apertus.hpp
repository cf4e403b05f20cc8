// Swiss AI's Apertus (model_type apertus) as strong preset types: Llama's pre-norm layer under
// Apertus's norm names (attention_layernorm, feedforward_layernorm), per-head q/k RMSNorms before
// RoPE (Qwen3's), q/k/v and o_proj biases by `attention_bias`, and a plain MLP with the xIELU
// activation, whose learned scalars each layer holds (blocks::xielu_mlp).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/apertus/xielu_mlp.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Its pre-norm layers' norm names: attention_layernorm, feedforward_layernorm.
inline constexpr blocks::norm_names apertus_norm_names{"attention_layernorm", "", "feedforward_layernorm", ""};

using apertus_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>,
                                   blocks::attention<blocks::attention_knobs{}, blocks::per_head_qk_norm<blocks::rms_norm<>>>,
                                   apertus_norm_names>,
                  blocks::pre_norm<blocks::rms_norm<>, blocks::xielu_mlp, apertus_norm_names>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule apertus_keys[] = {
    {"rms_norm_eps", key_use::read},    // the layer norms' and the q/k norms'
    {"attention_bias", key_use::read},  // q/k/v and o_proj
};
inline constexpr family_config apertus_config{
    .model_type = "apertus", .hf_class = "Apertus", .display = "Apertus",
    .arch = &architecture_of<apertus_blocks>, .max_positions = 65536, .rms_eps = 1e-5, .rope_theta = 12000000.0,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key},
    .rope_must_be_stated = "ApertusConfig then uses Llama 3's scaling (factor 8, theta 12,000,000) whatever rope_theta "
                           "says, which megadsl does not guess",
    .keys = apertus_keys};

// Apertus: the composition above; its RoPE (Llama 3's scaling in the published models) and biases
// are numbers of the shape.
template <shape S>
struct apertus : decoder_family<apertus_blocks, S> {
  static constexpr std::string_view family = apertus_config.model_type;
  static constexpr std::string_view name = "apertus";
};

// Apertus-8B-2509: 32 layers, 32 query heads of 128 over 8 kv heads with q/k norms, the xIELU MLP of
// 21504, Llama 3's scaling x 8 on theta 1.2e7, untied. Its sizes as a vLLM audit of the checkpoint
// (ProjectDMX/DMI-vLLM-Integration) and a config-parsing test of the 8B agree. The count is
// transformers' parameters, published in two places; the checkpoint also holds each layer's xIELU
// beta and eps (0-dim buffers, 64 values, not parameters): 8,053,338,240 in its safetensors.
struct apertus_8b : apertus<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8, .ffn = 21504, .vocab = 131072,
                                  .max_positions = 65536, .rms_eps = 1e-5, .rope_theta = 12000000.0,
                                  .rope = {.type = rope_type::llama3, .factor = 8.0, .low_freq_factor = 1.0,
                                           .high_freq_factor = 4.0, .original_max_positions = 8192}}> {
  static constexpr std::string_view name = "apertus-8b";
  static constexpr std::string_view hf_repo = "swiss-ai/Apertus-8B-2509";
  static constexpr std::int64_t published_params = 8'053'338'176;
};

}  // namespace megadsl
