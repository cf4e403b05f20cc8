// ByteDance Seed-OSS as strong preset types: the Llama composition with q/k/v biases by
// `attention_bias` (true by default) and o_proj's by its own `attention_out_bias` (false by
// default), head_dim 128 whatever the width, untied embeddings.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// ---- config.json (megadsl/family_config.hpp) ----

// SeedOssConfig's dropouts default to 0.1: on the attention probabilities, and on o_proj's and
// down_proj's outputs (the residual places).
inline constexpr dropout_key seed_oss_dropouts[] = {{.key = "attention_dropout", .attention = true, .class_default = 0.1},
                                                    {.key = "residual_dropout", .residual = true, .class_default = 0.1}};
inline constexpr config_key_rule seed_oss_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},       // q/k/v biases
    {"attention_out_bias", key_use::read},   // o_proj's bias, added after the reduction
    {"mlp_bias", key_use::read},             // gate/up/down biases
    {"pretraining_tp", key_use::no_effect},  // HF's sliced matmuls: the same product
};
inline constexpr family_config seed_oss_config{
    .model_type = "seed_oss", .hf_class = "SeedOss", .display = "Seed-OSS",
    .arch = &architecture_of<llama_blocks>, .max_positions = 524288, .rms_eps = 1e-6, .head_dim = 128,
    .bias = {.qkv = {"attention_bias", true, true}, .out = {"attention_out_bias"}, .mlp = {"mlp_bias"}}, .dropouts = seed_oss_dropouts,
    .keys = seed_oss_keys};

// Seed-OSS: the Llama composition; its biases are numbers of the shape (qkv_bias, out_bias).
template <shape S>
struct seed_oss : decoder_family<llama_blocks, S> {
  static constexpr std::string_view family = seed_oss_config.model_type;
  static constexpr std::string_view name = "seed_oss";
};

// 80 query heads of 128 (10240 > hidden 5120), 8 kv heads, q/k/v biases, theta 1e7.
struct seed_oss_36b : seed_oss<shape{.hidden = 5120, .layers = 64, .heads = 80, .kv_heads = 8, .ffn = 27648,
                                     .vocab = 155136, .head_dim = 128, .max_positions = 524288, .rms_eps = 1e-6,
                                     .rope_theta = 10000000.0, .qkv_bias = true}> {
  static constexpr std::string_view name = "seed-oss-36b";
  static constexpr std::string_view hf_repo = "ByteDance-Seed/Seed-OSS-36B-Instruct";
  static constexpr std::int64_t published_params = 36'151'104'512;
};

}  // namespace megadsl
