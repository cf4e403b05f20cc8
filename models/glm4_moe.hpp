// Zhipu's GLM-4.5 as strong preset types: Llama's pre-norms; grouped-query attention with q/k/v
// biases (o_proj none) rotating half of each head (partial_rotary_factor 0.5), with per-head RMS
// norms of q and k before RoPE where use_qk_norm says (GLM-4.5, 4.6, 4.7; not GLM-4.5-Air); the first
// first_k_dense_replace layers a dense SwiGLU, the rest a mixture of experts behind DeepSeek-V3's
// grouped sigmoid router, whose expert bias (gate.e_score_correction_bias) selects and is balanced
// by load in training, beside ungated shared experts (mlp.shared_experts.*).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Layer i is dense (kind 0) when it is among the first first_k_dense_replace (the shape's
// dense_layers), else sparse (kind 1).
constexpr int dense_first_layer(const shape& s, std::int64_t layer) {
  return layer < 63 && ((s.dense_layers.get() >> layer) & 1) != 0 ? 0 : 1;
}

// use_qk_norm (Glm4MoeConfig's, off by default; tested for truth) picks the attention with q and k
// RMS-normed per head.
inline constexpr config_setting glm4_moe_use_qk_norm[] = {
    {.key = "use_qk_norm", .fallback = 0, .kind = setting_kind::truthy,
     .meaning = "q and k RMS-normed per head before RoPE (GLM-4.5, 4.6, 4.7; not GLM-4.5-Air)"}};

// Layer i's kind: dense_first_layer's (0 dense, 1 sparse), plus 2 where q and k are normed per head.
constexpr int glm4_moe_layer(const shape& s, std::int64_t layer) {
  return dense_first_layer(s, layer) + (setting(s, "use_qk_norm") != 0 ? 2 : 0);
}
inline constexpr blocks::layer_choice glm4_moe_choice{&glm4_moe_layer, glm4_moe_use_qk_norm};

using glm4_moe_attention_qk_norm = blocks::attention<blocks::attention_knobs{}, blocks::per_head_qk_norm<blocks::rms_norm<>>>;
using glm4_moe_dense = blocks::gated_mlp<activation::silu>;
// DeepSeek-V3's mixture: its grouped sigmoid router (routed_scaling_factor, n_group, topk_group
// defaulting to Glm4MoeConfig's 1.0, 1, 1) and ungated shared experts (mlp.shared_experts).
template <class Router>
using glm4_moe_sparse_of = blocks::moe<Router, blocks::experts<>,
                                       blocks::shared_expert<blocks::hf_shared_experts_names, presence::shared_experts>>;
using glm4_moe_sparse = glm4_moe_sparse_of<blocks::grouped_sigmoid_router<>>;

template <class Attention, class Mlp>
using glm4_moe_block = blocks::block<blocks::pre_norm<blocks::rms_norm<>, Attention>, blocks::pre_norm<blocks::rms_norm<>, Mlp>>;

using glm4_moe_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::select<&glm4_moe_choice, glm4_moe_block<blocks::attention<>, glm4_moe_dense>,
                   glm4_moe_block<blocks::attention<>, glm4_moe_sparse>,
                   glm4_moe_block<glm4_moe_attention_qk_norm, glm4_moe_dense>,
                   glm4_moe_block<glm4_moe_attention_qk_norm, glm4_moe_sparse>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr moe_config glm4_moe_moe{.count_key = "n_routed_experts", .top_k = 8, .expert_ffn = 1408, .norm_topk = true,
                                         .shared_count_key = "n_shared_experts", .shared_count = 1,
                                         .dense_first_key = "first_k_dense_replace", .dense_first = 1};
inline constexpr config_key_rule glm4_moe_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},          // q/k/v biases
    {"partial_rotary_factor", key_use::read},   // (4.x's top-level form of rope_parameters')
    {"n_routed_experts", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"moe_intermediate_size", key_use::read},
    {"n_shared_experts", key_use::read},
    {"norm_topk_prob", key_use::read},
    {"first_k_dense_replace", key_use::read},
    {"num_mtp_layers", key_use::no_effect},     // the multi-token-prediction layers HF does not run
    {"num_nextn_predict_layers", key_use::read},   // the MTP layers stored after the decoder's: not loaded
    {"output_router_logits", key_use::no_effect},
    {"router_aux_loss_coef", key_use::no_effect},  // megadsl's own model_options::moe_aux_loss_coeff
};
inline constexpr family_config glm4_moe_config{
    .model_type = "glm4_moe", .hf_class = "Glm4Moe", .display = "GLM-4.5",
    .arch = &architecture_of<glm4_moe_blocks>, .max_positions = 131072, .rms_eps = 1e-5,
    .bias = {.qkv = attention_bias_key}, .partial_rotary_key = "partial_rotary_factor", .partial_rotary_default = 0.5,
    .mtp_key = "num_nextn_predict_layers", .moe = &glm4_moe_moe, .keys = glm4_moe_keys};

// GLM-4.5: attention on half of each head, dense first layers, DeepSeek's router and shared experts.
template <shape S>
struct glm4_moe : decoder_family<glm4_moe_blocks, S> {
  static constexpr std::string_view family = glm4_moe_config.model_type;
  static constexpr std::string_view name = "glm4_moe";
};

// 46 layers (the first dense), 96 query heads of 128 over 8 kv heads, q/k/v biases; 128 experts of
// 1408, top 8 renormalised, x 1.0, one shared expert; theta 1e6.
struct glm4_5_air : glm4_moe<shape{.hidden = 4096, .layers = 46, .heads = 96, .kv_heads = 8, .ffn = 10944,
                                   .vocab = 151552, .head_dim = 128, .max_positions = 131072, .rms_eps = 1e-5,
                                   .rope_theta = 1000000.0, .qkv_bias = true, .rotary_fraction = 0.5, .experts = 128,
                                   .top_k = 8, .expert_ffn = 1408, .shared_expert_ffn = 1408, .norm_topk = true,
                                   .dense_layers = 1}> {
  static constexpr std::string_view name = "glm-4.5-air";
  static constexpr std::string_view hf_repo = "zai-org/GLM-4.5-Air";
  // The checkpoint's tensors as transformers loads them: 106,852,245,504 parameters and the 45 sparse
  // layers' expert biases (128 each, a buffer in HF); the multi-token-prediction layer is not counted.
  static constexpr std::int64_t published_params = 106'852'251'264;
};

// GLM-4.5 (355B-A32B; GLM-4.6 and 4.7 share its shape): 92 layers (the first 3 dense), 96 query heads
// of 128 over 8 kv heads with q/k/v biases and per-head q/k norms; 160 experts of 1536, top 8
// renormalised, x 2.5, one shared expert; untied; theta 1e6. Its sizes are where Megatron-Bridge's
// GLM-4.5 page and slime's glm4.5-355B-A32B recipe agree. The count is transformers' count of that
// config, 352,797,814,784 parameters, and the 89 sparse layers' expert biases (160 each, a buffer
// in HF); the multi-token-prediction layer is not counted.
struct glm4_5 : glm4_moe<shape{.hidden = 5120, .layers = 92, .heads = 96, .kv_heads = 8, .ffn = 12288,
                               .vocab = 151552, .head_dim = 128, .max_positions = 131072, .rms_eps = 1e-5,
                               .rope_theta = 1000000.0, .qkv_bias = true, .rotary_fraction = 0.5, .experts = 160,
                               .top_k = 8, .expert_ffn = 1536, .shared_expert_ffn = 1536, .norm_topk = true,
                               .dense_layers = 0b111,
                               .settings = settings_given({{"use_qk_norm", 1}, {"routed_scaling_factor", 2.5}})}> {
  static constexpr std::string_view name = "glm-4.5";
  static constexpr std::string_view hf_repo = "zai-org/GLM-4.5";
  static constexpr std::int64_t published_params = 352'797'829'024;
};

}  // namespace megadsl
