// Baidu ERNIE 4.5 (dense) as strong preset types: the Llama blocks with RoPE on interleaved pairs
// (its rotate_half pairs x[0::2] with x[1::2]), biases on q/k/v, o_proj and gate/up/down together
// from `use_bias` (false by default), head_dim 128 whatever the width, tied embeddings.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule ernie4_5_keys[] = {
    {"attention_dropout", key_use::no_effect, "transformers' ERNIE 4.5 attention applies no dropout"},
    {"rms_norm_eps", key_use::read},
    {"use_bias", key_use::read},  // q/k/v, o_proj and the MLP's gate/up/down
};
inline constexpr family_config ernie4_5_config{
    .model_type = "ernie4_5", .hf_class = "Ernie4_5", .display = "ERNIE 4.5 (dense)",
    .arch = &architecture_of<llama_blocks>, .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 500000.0,
    .head_dim = 128, .tie_embeddings = true, .bias = {.qkv = {"use_bias"}, .out = {"use_bias"}, .mlp = {"use_bias"}}, .interleaved_rope = true,
    .keys = ernie4_5_keys};

// ERNIE 4.5: the Llama composition; RoPE on pairs is the shape's rope_interleave, its biases the
// shape's qkv_bias, out_bias and mlp_bias (all three or none).
template <shape S>
struct ernie4_5 : decoder_family<llama_blocks, S> {
  static constexpr std::string_view family = ernie4_5_config.model_type;
  static constexpr std::string_view name = "ernie4_5";
};

// ERNIE-4.5-0.3B: 16 query heads of 128 (2048 > hidden 1024), 2 kv heads, tied, no biases.
struct ernie4_5_0_3b : ernie4_5<shape{.hidden = 1024, .layers = 18, .heads = 16, .kv_heads = 2, .ffn = 3072,
                                      .vocab = 103424, .head_dim = 128, .max_positions = 131072, .rms_eps = 1e-5,
                                      .rope_theta = 500000.0, .tie_embeddings = true, .rope_interleave = true}> {
  static constexpr std::string_view name = "ernie-4.5-0.3b";
  static constexpr std::string_view hf_repo = "baidu/ERNIE-4.5-0.3B-PT";
  static constexpr std::int64_t published_params = 360'748'032;
};

}  // namespace megadsl
