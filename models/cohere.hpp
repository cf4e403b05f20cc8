// Cohere's Command R (model_type cohere) as strong preset types: each layer's attention and MLP
// read one bias-free LayerNorm of its input, side by side (x + attn(n(x)) + mlp(n(x))), RoPE on
// interleaved pairs on every layer, the logits multiplied by logit_scale, tied embeddings. Its
// per-head q/k LayerNorms (use_qk_norm, Command R+) are refused: no block has them yet.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using cohere_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::parallel_shared_norm<blocks::layer_norm_no_bias, blocks::attention<>, blocks::gated_mlp<activation::silu>>,
    blocks::layer_norm_no_bias>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule cohere_keys[] = {
    {"layer_norm_eps", key_use::read},
    {"logit_scale", key_use::read},     // the logits multiplied by it
    {"attention_bias", key_use::read},  // q/k/v and o_proj biases
    // LayerNorms over each head of q and k with a weight per head (Command R+): not a block yet.
    {"use_qk_norm", key_use::refused},
};
inline constexpr family_config cohere_config{
    .model_type = "cohere", .hf_class = "Cohere", .display = "Command R",
    .arch = &architecture_of<cohere_blocks>, .max_positions = 8192, .rms_eps = 1e-5, .tie_embeddings = true,
    .eps_key = "layer_norm_eps", .bias = bias_rule::attention_bias, .reads_logit_scale = true, .interleaved_rope = true,
    .keys = cohere_keys};

// Command R: one norm for the side-by-side sublayers; RoPE on pairs.
template <shape S>
struct cohere : decoder_family<cohere_blocks, S> {
  static constexpr std::string_view family = cohere_config.model_type;
  static constexpr std::string_view name = "cohere";
};

// Command R (c4ai-command-r-v01): transformers' CohereConfig defaults, which its docstring gives as
// this model's configuration (64 heads without GQA, logit_scale 1/16, tied); rope_theta 8e6 is its
// config.json's as recalled, not confirmed from a copy here (it changes no count or plan figure, and
// a checkpoint's config.json sets it on load). The count is transformers' count of that config, the
// card's "35 billion".
struct command_r_v01 : cohere<shape{.hidden = 8192, .layers = 40, .heads = 64, .kv_heads = 64, .ffn = 22528,
                                    .vocab = 256000, .max_positions = 8192, .rms_eps = 1e-5, .rope_theta = 8000000.0,
                                    .tie_embeddings = true, .logit_scale = 0.0625}> {
  static constexpr std::string_view name = "command-r-v01";
  static constexpr std::string_view hf_repo = "CohereForAI/c4ai-command-r-v01";
  static constexpr std::int64_t published_params = 34'980'831'232;
};

}  // namespace megadsl
