// GLM-4 (the 0414 dense models, model_type glm4) as strong preset types: a sandwich of RMSNorms
// around each sublayer under GLM's names, q/k/v biases without o_proj's, gate and up stored as one
// gate_up_proj, RoPE on interleaved pairs of the first half of each head.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// GLM-4's sandwich norms: its post_attention_layernorm is the norm before the MLP.
inline constexpr blocks::norm_names glm4_norm_names{"input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
                                                    "post_mlp_layernorm"};

// Glm4DecoderLayer: x + post_self_attn_layernorm(attn(input_layernorm(x))), then
// x + post_mlp_layernorm(mlp(post_attention_layernorm(x))): Gemma 2's sandwich with Llama's RMSNorm
// and GLM's names (its post_attention_layernorm is the norm before the MLP).
using glm4_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::sandwich<blocks::rms_norm<>, blocks::attention<>, glm4_norm_names>,
                  blocks::sandwich<blocks::rms_norm<>, blocks::gated_mlp<activation::silu, tensor_storage::concatenated>,
                                   glm4_norm_names>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule glm4_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},         // q/k/v biases (o_proj never has one)
    {"partial_rotary_factor", key_use::read},  // (4.x's top-level form of rope_parameters')
};
inline constexpr family_config glm4_config{
    .model_type = "glm4", .hf_class = "Glm4", .display = "GLM-4 (0414)",
    .arch = &architecture_of<glm4_blocks>, .max_positions = 131072, .rms_eps = 1.5625e-7, .head_dim = 128,
    .bias = {.qkv = {"attention_bias", true, true}}, .partial_rotary_key = "partial_rotary_factor",
    .partial_rotary_default = 0.5, .interleaved_rope = true, .keys = glm4_keys};

// GLM-4: the sandwich composition; RoPE on pairs of half of each head (rope_interleave,
// rotary_fraction), the q/k/v biases (qkv_bias) are numbers of the shape.
template <shape S>
struct glm4 : decoder_family<glm4_blocks, S> {
  static constexpr std::string_view family = glm4_config.model_type;
  static constexpr std::string_view name = "glm4";
};

// GLM-4-9B-0414: 32 query heads of 128, 2 kv heads; RoPE on the first 64 dims of each head.
struct glm4_9b : glm4<shape{.hidden = 4096, .layers = 40, .heads = 32, .kv_heads = 2, .ffn = 13696, .vocab = 151552,
                            .head_dim = 128, .max_positions = 32768, .rms_eps = 1e-5, .rope_theta = 10000.0,
                            .qkv_bias = true, .rotary_fraction = 0.5, .rope_interleave = true}> {
  static constexpr std::string_view name = "glm-4-9b-0414";
  static constexpr std::string_view hf_repo = "zai-org/GLM-4-9B-0414";
  static constexpr std::int64_t published_params = 9'400'279'040;
};

}  // namespace megadsl
