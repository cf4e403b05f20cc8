// Qwen2.5 (base models) as strong preset types: the Llama architecture plus a bias on q/k/v.
//
// Head counts that are not powers of two (14, 28) limit tp: Qwen2.5-0.5B takes tp 1, 2 only
// (2 kv heads, 14 q heads), Qwen2.5-7B tp 1, 2, 4 (4 kv heads), 72B up to tp 8 (8 kv heads) and
// beyond with kv replication while 64 % tp == 0 and ffn % tp == 0.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule qwen2_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"sliding_window", key_use::read},
    {"use_sliding_window", key_use::read},
    {"max_window_layers", key_use::read},
    {"layer_types", key_use::read},
    {"use_mrope", key_use::refused},  // Qwen2-VL's multimodal RoPE (Qwen2.5 writes false)
};
inline constexpr family_config qwen2_config{
    .model_type = "qwen2", .hf_class = "Qwen2", .display = "Qwen2/2.5",
    .arch = &architecture_of<llama_blocks>, .max_positions = 32768, .rms_eps = 1e-6,
    .bias = {.qkv = {.fallback = true}},  // q/k/v biases always, no key
    .window = window_rule::from_max_window_layers, .window_needs_use_flag = true, .reads_layer_types = true,
    .keys = qwen2_keys};

// Qwen2 / Qwen2.5: the Llama composition with a bias on q/k/v (the shape's qkv_bias).
template <shape S>
struct qwen2 : decoder_family<llama_blocks, S> {
  static constexpr std::string_view family = qwen2_config.model_type;
  static constexpr std::string_view name = "qwen2";
};

// Embeddings tied; vocab 151936 is a multiple of 128 (and not of 256).
struct qwen2_5_0_5b : qwen2<shape{.hidden = 896, .layers = 24, .heads = 14, .kv_heads = 2,
                                  .ffn = 4864, .vocab = 151936, .max_positions = 32768,
                                  .rms_eps = 1e-6, .rope_theta = 1000000.0, .qkv_bias = true,
                                  .tie_embeddings = true}> {
  static constexpr std::string_view name = "qwen2.5-0.5b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen2.5-0.5B";
  static constexpr std::int64_t published_params = 494'032'768;
};

struct qwen2_5_7b : qwen2<shape{.hidden = 3584, .layers = 28, .heads = 28, .kv_heads = 4,
                                .ffn = 18944, .vocab = 152064, .max_positions = 131072,
                                .rms_eps = 1e-6, .rope_theta = 1000000.0, .qkv_bias = true}> {
  static constexpr std::string_view name = "qwen2.5-7b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen2.5-7B";
  static constexpr std::int64_t published_params = 7'615'616'512;
};

// The base model's config.json has rms_norm_eps 1e-5 (the Instruct model's has 1e-6).
struct qwen2_5_72b : qwen2<shape{.hidden = 8192, .layers = 80, .heads = 64, .kv_heads = 8,
                                 .ffn = 29568, .vocab = 152064, .max_positions = 131072,
                                 .rms_eps = 1e-5, .rope_theta = 1000000.0, .qkv_bias = true}> {
  static constexpr std::string_view name = "qwen2.5-72b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen2.5-72B";
  static constexpr std::int64_t published_params = 72'706'203'648;
};

}  // namespace megadsl
