// Gemma (1) as strong preset types: the gemma composition ((1 + w) RMSNorm, sqrt(hidden)-scaled
// embedding, GELU-tanh gated MLP), head_dim 256, a 256k vocabulary, embeddings always tied.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using gemma_blocks = blocks::decoder<
    blocks::embedding<embed_scale_kind::sqrt_hidden>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<norm_kind::rms_1p>, blocks::attention<>>,
                  blocks::pre_norm<blocks::rms_norm<norm_kind::rms_1p>, blocks::gated_mlp<activation::gelu_tanh>>>,
    blocks::rms_norm<norm_kind::rms_1p>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule gemma_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"hidden_activation", key_use::read},               // Gemma's name of the activation
    {"use_bidirectional_attention", key_use::refused},  // non-causal attention
};
inline constexpr family_config gemma_config{
    .model_type = "gemma", .hf_class = "Gemma", .display = "Gemma",
    .arch = &architecture_of<gemma_blocks>, .max_positions = 8192, .rms_eps = 1e-6, .head_dim = 256,
    .tie_embeddings = true, .legacy_activation = "gelu",  // transformers' old spelling of the tanh GELU
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .keys = gemma_keys};

// Gemma: (1 + w) RMSNorm, embedding scaled by sqrt(hidden), GELU-tanh gated MLP, tied embeddings.
template <shape S>
struct gemma : decoder_family<gemma_blocks, S> {
  static constexpr std::string_view family = gemma_config.model_type;
  static constexpr std::string_view name = "gemma";
};

// Multi-query attention (1 kv head): tp > 1 replicates it.
struct gemma_2b : gemma<shape{.hidden = 2048, .layers = 18, .heads = 8, .kv_heads = 1, .ffn = 16384,
                              .vocab = 256000, .head_dim = 256, .max_positions = 8192, .rms_eps = 1e-6,
                              .rope_theta = 10000.0, .tie_embeddings = true}> {
  static constexpr std::string_view name = "gemma-2b";
  static constexpr std::string_view hf_repo = "google/gemma-2b";
  static constexpr std::int64_t published_params = 2'506'172'416;
};

// 16 heads of 256 = 4096 > hidden 3072.
struct gemma_7b : gemma<shape{.hidden = 3072, .layers = 28, .heads = 16, .kv_heads = 16, .ffn = 24576,
                              .vocab = 256000, .head_dim = 256, .max_positions = 8192, .rms_eps = 1e-6,
                              .rope_theta = 10000.0, .tie_embeddings = true}> {
  static constexpr std::string_view name = "gemma-7b";
  static constexpr std::string_view hf_repo = "google/gemma-7b";
  static constexpr std::int64_t published_params = 8'537'680'896;
};

}  // namespace megadsl
