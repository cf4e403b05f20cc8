// Qwen3 (dense) as strong preset types: the qwen3 composition (Llama with per-head q/k RMSNorm,
// head_dim 128 given explicitly, no q/k/v bias).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using qwen3_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>, blocks::attention<blocks::attention_knobs{}, blocks::per_head_qk_norm<blocks::rms_norm<>>>>,
                  blocks::pre_norm<blocks::rms_norm<>, blocks::gated_mlp<activation::silu>>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule qwen3_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"sliding_window", key_use::read},
    {"use_sliding_window", key_use::read},
    {"max_window_layers", key_use::read},
    {"layer_types", key_use::read},
};
inline constexpr family_config qwen3_config{
    .model_type = "qwen3", .hf_class = "Qwen3", .display = "Qwen3",
    .arch = &architecture_of<qwen3_blocks>, .max_positions = 32768, .rms_eps = 1e-6, .head_dim = 128,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .window = window_rule::from_max_window_layers,
    .window_needs_use_flag = true, .reads_layer_types = true, .keys = qwen3_keys};

// Qwen3: Llama with per-head q/k RMSNorm before RoPE (and no q/k/v bias by default).
template <shape S>
struct qwen3 : decoder_family<qwen3_blocks, S> {
  static constexpr std::string_view family = qwen3_config.model_type;
  static constexpr std::string_view name = "qwen3";
};

// Embeddings tied; 16 q heads of 128 = 2048 > hidden 1024 (head_dim is not hidden / heads).
struct qwen3_0_6b : qwen3<shape{.hidden = 1024, .layers = 28, .heads = 16, .kv_heads = 8, .ffn = 3072,
                                .vocab = 151936, .head_dim = 128, .max_positions = 40960, .rms_eps = 1e-6,
                                .rope_theta = 1000000.0, .tie_embeddings = true}> {
  static constexpr std::string_view name = "qwen3-0.6b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen3-0.6B";
  static constexpr std::int64_t published_params = 596'049'920;
};

struct qwen3_8b : qwen3<shape{.hidden = 4096, .layers = 36, .heads = 32, .kv_heads = 8, .ffn = 12288,
                              .vocab = 151936, .head_dim = 128, .max_positions = 40960, .rms_eps = 1e-6,
                              .rope_theta = 1000000.0}> {
  static constexpr std::string_view name = "qwen3-8b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen3-8B";
  static constexpr std::int64_t published_params = 8'190'735'360;  // index total_size 16381470720 / 2 (bf16)
};

}  // namespace megadsl
