// Cohere's Command R (model_type cohere) as strong preset types: each layer's attention and MLP
// read one bias-free LayerNorm of its input, side by side (x + attn(n(x)) + mlp(n(x))), RoPE on
// interleaved pairs on every layer, the logits multiplied by logit_scale, tied embeddings. Its
// per-head q/k LayerNorms (use_qk_norm, Command R+) are refused: no block has them yet.
#pragma once

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

}  // namespace megadsl
