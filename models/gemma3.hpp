// Google's Gemma 3 (text) as strong preset types: Gemma 2's sandwich norms ((1 + w) RMSNorms),
// scaled embedding and GELU-tanh gated MLP, with per-head (1 + w) q/k norms before RoPE, scores
// scaled by query_pre_attn_scalar^-1/2 and no soft-caps; five sliding layers to one full, each with
// its own RoPE: the sliding layers a plain RoPE of base 1e4 (rope_local_base_freq), the full ones
// base 1e6 with the checkpoint's scaling (shape::local_rope_theta).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using gemma3_blocks = blocks::decoder<
    blocks::embedding<embed_scale_kind::sqrt_hidden>,
    blocks::block<blocks::sandwich<blocks::rms_norm<norm_kind::rms_1p>,
                                   blocks::attention<blocks::attention_knobs{}, blocks::per_head_qk_norm<blocks::rms_norm<norm_kind::rms_1p>>>>,
                  blocks::sandwich<blocks::rms_norm<norm_kind::rms_1p>, blocks::gated_mlp<activation::gelu_tanh>>>,
    blocks::rms_norm<norm_kind::rms_1p>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule gemma3_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"hidden_activation", key_use::read},
    {"query_pre_attn_scalar", key_use::read},    // the score scale
    {"attn_logit_softcapping", key_use::read},   // null in Gemma 3; honoured when set
    {"final_logit_softcapping", key_use::read},
    {"rope_local_base_freq", key_use::read},     // 4.x's base of the sliding layers' RoPE
    {"sliding_window", key_use::read},
    {"sliding_window_pattern", key_use::read},   // 4.x's: every n-th layer full
    {"layer_types", key_use::read},
    {"cache_implementation", key_use::no_effect},  // generation's kv cache
    {"use_bidirectional_attention", key_use::refused},
};
inline constexpr family_config gemma3_config{
    .model_type = "gemma3_text", .hf_class = "Gemma3", .display = "Gemma 3 (text)",
    .arch = &architecture_of<gemma3_blocks>, .max_positions = 131072, .rms_eps = 1e-6, .rope_theta = 1000000.0,
    .head_dim = 256, .tie_embeddings = true, .activation_key = "hidden_activation", .bias = {.qkv = attention_bias_key, .out = attention_bias_key},
    .score_caps = true, .attn_softcap_default = 0.0, .final_softcap_default = 0.0, .local_rope_theta = 10000.0,
    .local_theta_key = "rope_local_base_freq", .full_every = 6, .window = window_rule::alternate, .reads_layer_types = true,
    .keys = gemma3_keys, .multimodal = {"gemma3", "Gemma3ForConditionalGeneration", true}};

// Gemma 3: Gemma 2's sandwich with per-head q/k norms, and RoPE per layer type.
template <shape S>
struct gemma3 : decoder_family<gemma3_blocks, S> {
  static constexpr std::string_view family = gemma3_config.model_type;
  static constexpr std::string_view name = "gemma3";
};

// 62 layers, 32 query heads of 128 over 16 kv heads, query_pre_attn_scalar 168 (hidden / heads);
// the full layers' RoPE linearly scaled by 8; the sliding window (1024) comes with config.json.
struct gemma3_27b : gemma3<shape{.hidden = 5376, .layers = 62, .heads = 32, .kv_heads = 16, .ffn = 21504,
                                 .vocab = 262208, .head_dim = 128, .max_positions = 131072, .rms_eps = 1e-6,
                                 .rope_theta = 1000000.0, .rope = {.type = rope_type::linear, .factor = 8.0},
                                 .local_rope_theta = 10000.0, .tie_embeddings = true, .query_pre_attn_scalar = 168.0}> {
  static constexpr std::string_view name = "gemma-3-27b";
  static constexpr std::string_view hf_repo = "google/gemma-3-27b-it";
  static constexpr std::int64_t published_params = 27'009'346'304;  // the text model (Gemma3ForCausalLM)
};

}  // namespace megadsl
