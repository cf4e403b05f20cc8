// Cohere's Command R (model_type cohere) as strong preset types: each layer's attention and MLP
// read one bias-free LayerNorm of its input, side by side (x + attn(n(x)) + mlp(n(x))), RoPE on
// interleaved pairs on every layer, the logits multiplied by logit_scale, tied embeddings; where
// use_qk_norm says (Command R+), q and k LayerNorm-ed per head before RoPE, a weight for every head.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/cohere/headwise_qk_norm.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// use_qk_norm (CohereConfig's, off by default; tested for truth) picks the attention with q and k
// LayerNorm-ed per head.
inline constexpr config_setting cohere_use_qk_norm[] = {
    {.key = "use_qk_norm", .fallback = 0, .kind = setting_kind::truthy,
     .meaning = "q and k LayerNorm-ed per head before RoPE, a weight for every head (Command R+)"}};

// Every layer is of one kind: 1 where q and k are normed per head, else 0.
constexpr int cohere_layer(const shape& s, std::int64_t) { return setting(s, "use_qk_norm") != 0 ? 1 : 0; }
inline constexpr blocks::layer_choice cohere_choice{&cohere_layer, cohere_use_qk_norm};

template <class Attention>
using cohere_block = blocks::parallel_shared_norm<blocks::layer_norm_no_bias, Attention, blocks::gated_mlp<activation::silu>>;
using cohere_attention_qk_norm =
    blocks::attention<blocks::attention_knobs{}, blocks::headwise_qk_norm<blocks::layer_norm_no_bias>>;

// logit_scale (CohereConfig's default 0.0625): the logits multiplied by it.
inline constexpr config_setting cohere_logit_scale{.key = "logit_scale", .fallback = 0.0625, .meaning = "the logits multiplied by it"};

using cohere_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::select<&cohere_choice, cohere_block<blocks::attention<>>, cohere_block<cohere_attention_qk_norm>>,
    blocks::layer_norm_no_bias, blocks::hf_default_names, blocks::lm_head<&cohere_logit_scale>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule cohere_keys[] = {
    {"layer_norm_eps", key_use::read},
    {"attention_bias", key_use::read},  // q/k/v and o_proj biases
};
inline constexpr family_config cohere_config{
    .model_type = "cohere", .hf_class = "Cohere", .display = "Command R",
    .arch = &architecture_of<cohere_blocks>, .max_positions = 8192, .rms_eps = 1e-5, .tie_embeddings = true,
    .eps_key = "layer_norm_eps", .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .interleaved_rope = true,
    .keys = cohere_keys};

// Command R: one norm for the side-by-side sublayers; RoPE on pairs; Command R+'s q/k norms.
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
                                    .tie_embeddings = true}> {  // logit_scale: the default
  static constexpr std::string_view name = "command-r-v01";
  static constexpr std::string_view hf_repo = "CohereForAI/c4ai-command-r-v01";
  static constexpr std::int64_t published_params = 34'980'831'232;
};

// Command R+ (c4ai-command-r-plus, 104B): 96 query heads of 128 over 8 kv heads, each q and k head
// LayerNorm-ed with its own weight (use_qk_norm), 64 layers, ffn 33792, tied, logit_scale 1/1.2.
// The sizes are its config.json's as recalled (not a copy here; rope_theta 7.5e7 and logit_scale
// change no count or plan figure, and a checkpoint's config.json sets them on load); the count is
// transformers 5.23's count of that config, the card's "104B".
struct command_r_plus : cohere<shape{.hidden = 12288, .layers = 64, .heads = 96, .kv_heads = 8, .ffn = 33792,
                                     .vocab = 256000, .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 75000000.0,
                                     .tie_embeddings = true,
                                     .settings = settings_given({{"logit_scale", 0.8333333333333334}, {"use_qk_norm", 1}})}> {
  static constexpr std::string_view name = "command-r-plus";
  static constexpr std::string_view hf_repo = "CohereForAI/c4ai-command-r-plus";
  static constexpr std::int64_t published_params = 103'810'674'688;
};

}  // namespace megadsl
