// LG's EXAONE 4.0 as strong preset types: norms after each sublayer (OLMo 2's placement, Llama's
// RMSNorm), per-head q/k norms before RoPE, three sliding layers to one full (layer_types) and,
// whenever a window is set, no RoPE on the full layers (their "global NoPE"): two kinds of layer,
// chosen from the shape's nope_layers, which config.json's window and layer_types decide.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Layer i is kind 1 (no RoPE) where the shape's nope_layers says so, else kind 0.
constexpr int exaone4_layer(const shape& s, std::int64_t layer) { return nope_layer(s, layer) ? 1 : 0; }

template <bool Rope>
using exaone4_block = blocks::block<
    blocks::post_norm<blocks::rms_norm<>, blocks::attention<blocks::attention_knobs{.rope = Rope}, blocks::per_head_qk_norm<blocks::rms_norm<>>>>,
    blocks::post_norm<blocks::rms_norm<>, blocks::gated_mlp<activation::silu>>>;

using exaone4_blocks = blocks::decoder<blocks::embedding<>,
                                       blocks::select<&exaone4_layer, exaone4_block<true>, exaone4_block<false>>,
                                       blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule exaone4_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"sliding_window", key_use::read},
    {"sliding_window_pattern", key_use::read},  // every n-th layer full (an int; layer_types wins)
    {"layer_types", key_use::read},
};
inline constexpr family_config exaone4_config{
    .model_type = "exaone4", .hf_class = "Exaone4", .display = "EXAONE 4.0",
    .arch = &architecture_of<exaone4_blocks>, .max_positions = 2048, .rms_eps = 1e-5, .full_every = 4,
    .window = window_rule::alternate, .reads_layer_types = true, .rope_on = rope_layers::sliding_if_windowed, .keys = exaone4_keys};

// EXAONE 4.0: post norms, per-head q/k norms, and the full layers without RoPE beside the sliding ones.
template <shape S>
struct exaone4 : decoder_family<exaone4_blocks, S> {
  static constexpr std::string_view family = exaone4_config.model_type;
  static constexpr std::string_view name = "exaone4";
};

// EXAONE-4.0-1.2B (its config.json): no sliding window, so every layer is full and rotates
// (nope_layers 0); Llama 3's RoPE scaling, tied embeddings.
struct exaone4_1_2b : exaone4<shape{.hidden = 2048, .layers = 30, .heads = 32, .kv_heads = 8, .ffn = 4096,
                                    .vocab = 102400, .head_dim = 64, .max_positions = 65536, .rms_eps = 1e-5,
                                    .rope_theta = 1000000.0,
                                    .rope = {.type = rope_type::llama3, .factor = 16.0, .low_freq_factor = 1.0,
                                             .high_freq_factor = 4.0, .original_max_positions = 8192},
                                    .tie_embeddings = true}> {
  static constexpr std::string_view name = "exaone-4.0-1.2b";
  static constexpr std::string_view hf_repo = "LGAI-EXAONE/EXAONE-4.0-1.2B";
  static constexpr std::int64_t published_params = 1'279'391'488;
};

// EXAONE-4.0-32B: 64 layers (three sliding of 4096 then one global, the window a model option),
// 40 query heads of 128 over 8 kv heads, Llama 3's scaling x 16 on theta 1e6, untied. The config
// as a verbatim copy of the hub's (rengzhengcodes/SmolBench scripts/arch/arch_configs_raw.json) and
// TensorRT-LLM's test config agree; the count is the hub's safetensors total_size / 2 (SmolBench's
// exaone.md), also transformers' count of the config.
struct exaone4_32b : exaone4<shape{.hidden = 5120, .layers = 64, .heads = 40, .kv_heads = 8, .ffn = 27392,
                                   .vocab = 102400, .head_dim = 128, .max_positions = 131072, .rms_eps = 1e-5,
                                   .rope_theta = 1000000.0,
                                   .rope = {.type = rope_type::llama3, .factor = 16.0, .low_freq_factor = 1.0,
                                            .high_freq_factor = 4.0, .original_max_positions = 8192}}> {
  static constexpr std::string_view name = "exaone-4.0-32b";
  static constexpr std::string_view hf_repo = "LGAI-EXAONE/EXAONE-4.0-32B";
  static constexpr std::int64_t published_params = 32'003'216'384;
};

}  // namespace megadsl
