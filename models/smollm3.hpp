// Hugging Face's SmolLM3 as strong preset types: the Llama blocks with NoPE layers, whose attention
// rotates nothing (every fourth layer by default; config.json's no_rope_layers says which). Two
// kinds of layer, chosen per layer from the shape's nope_layers (smollm3_layer), so config.json
// decides which layer has which; with use_sliding_window the NoPE layers slide.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Layer i is kind 1 (no RoPE) where no_rope_layers[i] is 0, else kind 0.
constexpr int smollm3_layer(const shape& s, std::int64_t layer) { return nope_layer(s, layer) ? 1 : 0; }

template <bool Rope>
using smollm3_block =
    blocks::block<blocks::pre_norm<blocks::rms_norm<>, blocks::attention<blocks::attention_knobs{.rope = Rope}>>,
                  blocks::pre_norm<blocks::rms_norm<>, blocks::gated_mlp<activation::silu>>>;

using smollm3_blocks = blocks::decoder<blocks::embedding<>,
                                       blocks::select<&smollm3_layer, smollm3_block<true>, smollm3_block<false>>,
                                       blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule smollm3_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},          // q/k/v and o_proj biases
    {"mlp_bias", key_use::read},                // gate/up/down biases
    {"no_rope_layers", key_use::read},          // 1: the layer applies RoPE, 0: it does not
    {"no_rope_layer_interval", key_use::read},  // without no_rope_layers: every n-th layer has no RoPE
    {"use_sliding_window", key_use::read},
    {"sliding_window", key_use::read},
    {"layer_types", key_use::read},
};
inline constexpr family_config smollm3_config{
    .model_type = "smollm3", .hf_class = "SmolLM3", .display = "SmolLM3",
    .arch = &architecture_of<smollm3_blocks>, .max_positions = 32768, .rms_eps = 1e-6, .rope_theta = 2000000.0,
    .tie_embeddings = true, .bias = {.qkv = attention_bias_key, .out = attention_bias_key, .mlp = {"mlp_bias"}},
    .window = window_rule::nope_layers, .window_needs_use_flag = true, .reads_layer_types = true,
    .reads_no_rope_layers = true, .keys = smollm3_keys};

// SmolLM3: Llama's blocks, the attention of some layers without RoPE.
template <shape S>
struct smollm3 : decoder_family<smollm3_blocks, S> {
  static constexpr std::string_view family = smollm3_config.model_type;
  static constexpr std::string_view name = "smollm3";
};

// Every fourth layer (3, 7, ..., 35) without RoPE; theta 5e6, tied embeddings.
struct smollm3_3b : smollm3<shape{.hidden = 2048, .layers = 36, .heads = 16, .kv_heads = 4, .ffn = 11008,
                                  .vocab = 128256, .max_positions = 65536, .rms_eps = 1e-6, .rope_theta = 5000000.0,
                                  .tie_embeddings = true,
                                  .nope_layers = (std::int64_t{1} << 3) | (std::int64_t{1} << 7) | (std::int64_t{1} << 11) |
                                                 (std::int64_t{1} << 15) | (std::int64_t{1} << 19) | (std::int64_t{1} << 23) |
                                                 (std::int64_t{1} << 27) | (std::int64_t{1} << 31) | (std::int64_t{1} << 35)}> {
  static constexpr std::string_view name = "smollm3-3b";
  static constexpr std::string_view hf_repo = "HuggingFaceTB/SmolLM3-3B";
  static constexpr std::int64_t published_params = 3'075'098'624;
};

}  // namespace megadsl
