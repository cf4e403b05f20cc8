// Gemma 2 as strong preset types: the gemma2 composition (Gemma's blocks in sandwich form, scores
// scaled by query_pre_attn_scalar^-1/2 and soft-capped, logits soft-capped), head_dim 256, a 256k
// vocabulary, embeddings tied. The sliding window (4096 tokens on alternate layers) comes with the
// checkpoint's config.json as model_options::attention_window.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Gemma2: Gemma's blocks in sandwich form; its score scale and soft-caps are numbers of the shape
// (query_pre_attn_scalar, attn_softcap, final_softcap, read from config.json), and its alternate
// sliding layers come with the checkpoint's window (model_options::attention_window).
using gemma2_blocks = blocks::decoder<
    blocks::embedding<embed_scale_kind::sqrt_hidden>,
    blocks::block<blocks::sandwich<blocks::rms_norm<norm_kind::rms_1p>, blocks::attention<>>,
                  blocks::sandwich<blocks::rms_norm<norm_kind::rms_1p>, blocks::gated_mlp<activation::gelu_tanh>>>,
    blocks::rms_norm<norm_kind::rms_1p>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule gemma2_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"hidden_activation", key_use::read},
    {"query_pre_attn_scalar", key_use::read},    // the score scale
    {"attn_logit_softcapping", key_use::read},   // tanh soft-cap of the scores
    {"final_logit_softcapping", key_use::read},  // tanh soft-cap of the logits
    {"cache_implementation", key_use::no_effect},  // generation's kv cache
    {"sliding_window", key_use::read},
    {"layer_types", key_use::read},
    {"use_bidirectional_attention", key_use::refused},
};
inline constexpr family_config gemma2_config{
    .model_type = "gemma2", .hf_class = "Gemma2", .display = "Gemma 2",
    .arch = &architecture_of<gemma2_blocks>, .max_positions = 8192, .rms_eps = 1e-6, .head_dim = 256,
    .tie_embeddings = true, .activation_key = "hidden_activation", .bias = {.qkv = attention_bias_key, .out = attention_bias_key},
    .score_caps = true, .window = window_rule::alternate, .reads_layer_types = true, .keys = gemma2_keys};

// Gemma2: Gemma's blocks in sandwich form (a norm before and after each sublayer), scores scaled by
// query_pre_attn_scalar^-1/2 and soft-capped, logits soft-capped, sliding window on alternate layers.
template <shape S>
struct gemma2 : decoder_family<gemma2_blocks, S> {
  static constexpr std::string_view family = gemma2_config.model_type;
  static constexpr std::string_view name = "gemma2";
};

// 16 query heads, 8 kv heads of 256; four norms per layer.
struct gemma2_9b : gemma2<shape{.hidden = 3584, .layers = 42, .heads = 16, .kv_heads = 8, .ffn = 14336,
                                .vocab = 256000, .head_dim = 256, .max_positions = 8192, .rms_eps = 1e-6,
                                .rope_theta = 10000.0, .tie_embeddings = true, .query_pre_attn_scalar = 256.0,
                                .attn_softcap = 50.0, .final_softcap = 30.0}> {
  static constexpr std::string_view name = "gemma-2-9b";
  static constexpr std::string_view hf_repo = "google/gemma-2-9b";
  static constexpr std::int64_t published_params = 9'241'705'984;
};

}  // namespace megadsl
