// Swiss AI's Apertus (model_type apertus) as strong preset types: Llama's pre-norm layer under
// Apertus's norm names (attention_layernorm, feedforward_layernorm), per-head q/k RMSNorms before
// RoPE (Qwen3's), q/k/v and o_proj biases by `attention_bias`, and a plain MLP with the xIELU
// activation, whose learned scalars each layer holds (blocks::xielu_mlp).
#pragma once

#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using apertus_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>,
                                   blocks::attention<blocks::attention_knobs{}, blocks::per_head_qk_norm<blocks::rms_norm<>>>,
                                   blocks::apertus_norm_names>,
                  blocks::pre_norm<blocks::rms_norm<>, blocks::xielu_mlp, blocks::apertus_norm_names>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule apertus_keys[] = {
    {"rms_norm_eps", key_use::read},    // the layer norms' and the q/k norms'
    {"attention_bias", key_use::read},  // q/k/v and o_proj
};
inline constexpr family_config apertus_config{
    .model_type = "apertus", .hf_class = "Apertus", .display = "Apertus",
    .arch = &architecture_of<apertus_blocks>, .max_positions = 65536, .rms_eps = 1e-5, .rope_theta = 12000000.0,
    .bias = bias_rule::attention_bias,
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

}  // namespace megadsl
