// AllenAI's OLMo 3 as strong preset types: OLMo 2's composition (norms after each sublayer, (w * x)
// RMSNorms, full-width q/k norms before RoPE) with three sliding layers to one full
// (layer_types, a window of 4096 by default) and RoPE per layer type (both plain with base 5e5 by
// default; a scaling applies to the full layers only).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/olmo2.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule olmo3_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"sliding_window", key_use::read},
    {"layer_types", key_use::read},
};
inline constexpr family_config olmo3_config{
    .model_type = "olmo3", .hf_class = "Olmo3", .display = "OLMo 3",
    .arch = &architecture_of<olmo2_blocks>, .max_positions = 2048, .rms_eps = 1e-5, .rope_theta = 500000.0,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .local_rope_theta = 500000.0, .full_every = 4, .window = window_rule::alternate,
    .reads_layer_types = true, .keys = olmo3_keys};

// OLMo 3: OLMo 2's blocks, sliding windows on three layers of four, RoPE per layer type.
template <shape S>
struct olmo3 : decoder_family<olmo2_blocks, S> {
  static constexpr std::string_view family = olmo3_config.model_type;
  static constexpr std::string_view name = "olmo3";
};

// 32 layers, multi-head attention, a 100k vocabulary; the sliding window (4096) comes with config.json.
struct olmo3_7b : olmo3<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 32, .ffn = 11008,
                              .vocab = 100278, .max_positions = 65536, .rms_eps = 1e-6, .rope_theta = 500000.0,
                              .local_rope_theta = 500000.0}> {
  static constexpr std::string_view name = "olmo-3-7b";
  static constexpr std::string_view hf_repo = "allenai/Olmo-3-1025-7B";
  static constexpr std::int64_t published_params = 7'298'011'136;
};

}  // namespace megadsl
