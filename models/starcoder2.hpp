// StarCoder2 as strong preset types: the starcoder2 composition (LayerNorms with biases, a plain
// GELU-tanh MLP, biases on q/k/v, o_proj and the MLP from config.json's use_bias), tied embeddings.
// The sliding window (4096 tokens on every layer) comes with the checkpoint's config.json.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using starcoder2_blocks =
    blocks::decoder<blocks::embedding<>,
                    blocks::block<blocks::pre_norm<blocks::layer_norm, blocks::attention<>>,
                                  blocks::pre_norm<blocks::layer_norm, blocks::plain_mlp<activation::gelu_tanh>>>,
                    blocks::layer_norm>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule starcoder2_keys[] = {
    {"norm_epsilon", key_use::read},  // its LayerNorms' eps
    {"use_bias", key_use::read},      // q/k/v, o_proj and MLP biases
    {"sliding_window", key_use::read},
};
// Dropout on o_proj's and c_proj's outputs, and on the embedding's.
inline constexpr dropout_key starcoder2_dropouts[] = {{.key = "residual_dropout", .residual = true},
                                                      {.key = "embedding_dropout", .embedding = true}};
inline constexpr family_config starcoder2_config{
    .model_type = "starcoder2", .hf_class = "Starcoder2", .display = "StarCoder2",
    .arch = &architecture_of<starcoder2_blocks>, .max_positions = 4096, .rms_eps = 1e-5, .tie_embeddings = true,
    .eps_key = "norm_epsilon", .bias = {.qkv = {"use_bias", true, true}, .out = {"use_bias", true, true}}, .window = window_rule::every_layer,
    .dropouts = starcoder2_dropouts, .keys = starcoder2_keys};

// StarCoder2: LayerNorms with biases, a plain GELU-tanh MLP (c_fc, c_proj), biases on q/k/v, o_proj
// and the MLP per the shape (config.json's use_bias), tied embeddings by default.
template <shape S>
struct starcoder2 : decoder_family<starcoder2_blocks, S> {
  static constexpr std::string_view family = starcoder2_config.model_type;
  static constexpr std::string_view name = "starcoder2";
};

// 36 query heads, 4 kv heads of 128.
struct starcoder2_7b : starcoder2<shape{.hidden = 4608, .layers = 32, .heads = 36, .kv_heads = 4, .ffn = 18432,
                                        .vocab = 49152, .max_positions = 16384, .rms_eps = 1e-5,
                                        .rope_theta = 1000000.0, .qkv_bias = true, .tie_embeddings = true,
                                        .out_bias = true}> {
  static constexpr std::string_view name = "starcoder2-7b";
  static constexpr std::string_view hf_repo = "bigcode/starcoder2-7b";
  static constexpr std::int64_t published_params = 7'173'923'840;
};

}  // namespace megadsl
