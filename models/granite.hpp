// IBM Granite 3.x dense (model_type granite) as strong preset types: the Llama blocks with Granite's
// four multipliers, each its blocks' own config.json key (GraniteConfig's defaults, all 1.0): the
// embedding's output times embedding_multiplier, each sublayer's output times residual_multiplier
// before the residual add, the scores scaled by attention_multiplier outright (not
// head_dim^-1/2), the logits divided by logits_scaling; biases on q/k/v and o_proj by
// `attention_bias`, on gate/up/down by `mlp_bias`.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

inline constexpr config_setting granite_embedding_multiplier{
    .key = "embedding_multiplier", .fallback = 1.0, .meaning = "the embedding's output multiplied by it"};
inline constexpr config_setting granite_residual_multiplier{
    .key = "residual_multiplier", .fallback = 1.0, .meaning = "each sublayer's output multiplied by it before the residual add"};
// 0 would make every score 0 and the attention uniform; GraniteConfig has no use for it.
inline constexpr config_setting granite_attention_multiplier{
    .key = "attention_multiplier", .fallback = 1.0, .least = 1e-30,
    .meaning = "the scores' scale, outright (Granite 3's is 1/head_dim)"};
inline constexpr config_setting granite_logits_scaling{
    .key = "logits_scaling", .fallback = 1.0, .least = 1e-30, .meaning = "the logits divided by it"};

template <class Inner>
using granite_residual = blocks::pre_norm<blocks::rms_norm<>, Inner, blocks::hf_norm_names, &granite_residual_multiplier>;

// Llama's blocks, each with its multiplier.
using granite_blocks = blocks::decoder<
    blocks::embedding<embed_scale_kind::none, &granite_embedding_multiplier>,
    blocks::block<granite_residual<blocks::attention<blocks::attention_knobs{.score_scale = &granite_attention_multiplier}>>,
                  granite_residual<blocks::gated_mlp<activation::silu>>>,
    blocks::rms_norm<>, blocks::hf_default_names, blocks::lm_head<&granite_logits_scaling, blocks::logit_scaling::divided_by>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule granite_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},        // q/k/v and o_proj biases
    {"mlp_bias", key_use::read},              // gate/up/down biases
};
inline constexpr family_config granite_config{
    .model_type = "granite", .hf_class = "Granite", .display = "Granite 3.x",
    .arch = &architecture_of<granite_blocks>, .max_positions = 2048, .rms_eps = 1e-6,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key, .mlp = {"mlp_bias"}}, .keys = granite_keys,
    .earlier_arch = &architecture_of<llama_blocks>};

// Granite: Llama's composition with its four multipliers.
template <shape S>
struct granite : decoder_family<granite_blocks, S> {
  static constexpr std::string_view family = granite_config.model_type;
  static constexpr std::string_view name = "granite";
};

// Granite-3.3-8B-Instruct (its config.json): Llama's shape, tied embeddings, the embedding times 12,
// each sublayer's output times 0.22, the scores times 1/128 (not head_dim^-0.5), the logits / 16.
struct granite3_3_8b : granite<shape{.hidden = 4096, .layers = 40, .heads = 32, .kv_heads = 8, .ffn = 12800,
                                     .vocab = 49159, .max_positions = 131072, .rms_eps = 1e-5,
                                     .rope_theta = 10000000.0, .tie_embeddings = true,
                                     .settings = settings_given({{"embedding_multiplier", 12.0},
                                                                 {"residual_multiplier", 0.22},
                                                                 {"attention_multiplier", 0.0078125},
                                                                 {"logits_scaling", 16.0}})}> {
  static constexpr std::string_view name = "granite-3.3-8b";
  static constexpr std::string_view hf_repo = "ibm-granite/granite-3.3-8b-instruct";
  static constexpr std::int64_t published_params = 8'170'864'640;
};

}  // namespace megadsl
