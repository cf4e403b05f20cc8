// Cohere's Command R7B and Command A (model_type cohere2) as strong preset types: each layer's
// attention and MLP read one bias-free LayerNorm of its input, side by side
// (x + attn(n(x)) + mlp(n(x))); three sliding layers to one full (layer_types,
// sliding_window_pattern), RoPE on interleaved pairs on the sliding layers only (the full layers
// apply none); the logits multiplied by logit_scale; tied embeddings.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Layer i is kind 1 (no RoPE) where the shape's nope_layers says so (the layers that do not slide).
constexpr int cohere2_layer(const shape& s, std::int64_t layer) { return nope_layer(s, layer) ? 1 : 0; }

template <bool Rope>
using cohere2_block = blocks::parallel_shared_norm<blocks::layer_norm_no_bias,
                                                   blocks::attention<blocks::attention_knobs{.rope = Rope}>,
                                                   blocks::gated_mlp<activation::silu>>;

// logit_scale (Cohere2Config's default 0.0625): the logits multiplied by it.
inline constexpr config_setting cohere2_logit_scale{.key = "logit_scale", .fallback = 0.0625, .meaning = "the logits multiplied by it"};

using cohere2_blocks = blocks::decoder<blocks::embedding<>,
                                       blocks::select<&cohere2_layer, cohere2_block<true>, cohere2_block<false>>,
                                       blocks::layer_norm_no_bias, blocks::hf_default_names, blocks::lm_head<&cohere2_logit_scale>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule cohere2_keys[] = {
    {"layer_norm_eps", key_use::read},
    {"attention_bias", key_use::read},          // q/k/v and o_proj biases
    {"sliding_window", key_use::read},
    {"sliding_window_pattern", key_use::read},  // every n-th layer full (layer_types wins)
    {"layer_types", key_use::read},
};
inline constexpr family_config cohere2_config{
    .model_type = "cohere2", .hf_class = "Cohere2", .display = "Command R7B, Command A",
    .arch = &architecture_of<cohere2_blocks>, .max_positions = 8192, .rms_eps = 1e-5, .tie_embeddings = true,
    .eps_key = "layer_norm_eps", .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .full_every = 4,
    .window = window_rule::alternate, .reads_layer_types = true, .rope_on = rope_layers::sliding, .interleaved_rope = true,
    .keys = cohere2_keys};

// Cohere2: one norm for the side-by-side sublayers; RoPE on pairs on the sliding layers only.
template <shape S>
struct cohere2 : decoder_family<cohere2_blocks, S> {
  static constexpr std::string_view family = cohere2_config.model_type;
  static constexpr std::string_view name = "cohere2";
};

// Command R7B: the shape as transformers prints the published model's modules (embed_tokens
// 256000 x 4096, 32 layers, q 4096, k and v 1024, gate/up 14336; a 4-bit copy's model card), tied,
// every fourth layer full and without RoPE. rope_theta 50000 and logit_scale 0.25 are its
// config.json's as recalled, not confirmed from a copy here; neither changes the count or plan's
// figures, and a checkpoint's own config.json sets both on load. The count is transformers' count
// of that shape, the hub's 8.03B.
struct command_r7b : cohere2<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8, .ffn = 14336,
                                   .vocab = 256000, .max_positions = 8192, .rms_eps = 1e-5, .rope_theta = 50000.0,
                                   .tie_embeddings = true, .nope_layers = 0x88888888,
                                   .settings = settings_given({{"logit_scale", 0.25}})}> {
  static constexpr std::string_view name = "command-r7b";
  static constexpr std::string_view hf_repo = "CohereForAI/c4ai-command-r7b-12-2024";
  static constexpr std::int64_t published_params = 8'028'033'024;
};

}  // namespace megadsl
