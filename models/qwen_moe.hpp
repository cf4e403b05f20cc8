// Qwen's mixtures of experts as strong preset types: Qwen2-MoE (Qwen1.5-MoE; Qwen2 attention with
// q/k/v biases, routed experts beside a shared expert behind a sigmoid gate) and Qwen3-MoE (Qwen3
// attention with per-head q/k norms, routed experts only). Both under Qwen's HF names (mlp.gate,
// mlp.experts.E.*). config.json's mlp_only_layers and decoder_sparse_step make some layers dense:
// two kinds of layer, chosen per layer (qwen_sparse_layer).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Which layers have the mixture (transformers' Qwen2MoeDecoderLayer): layer i does when it is not
// in mlp_only_layers (the shape's dense_layers bits) and (i + 1) % decoder_sparse_step == 0; the
// others have a dense gated MLP of intermediate_size. Read from config.json's numbers, so the
// choice is per checkpoint.
constexpr int qwen_sparse_layer(const shape& s, std::int64_t layer) {
  const std::int64_t step = s.sparse_step.get();
  const bool listed = layer < 63 && ((s.dense_layers.get() >> layer) & 1) != 0;
  return !listed && step > 0 && (layer + 1) % step == 0 ? 1 : 0;
}

// A Qwen mixture's layers: kind 0 dense, kind 1 sparse, chosen by qwen_sparse_layer.
template <class Attention, class Moe>
using qwen_moe_layers =
    blocks::select<&qwen_sparse_layer,
                   blocks::block<blocks::pre_norm<blocks::rms_norm<>, Attention>,
                                 blocks::pre_norm<blocks::rms_norm<>, blocks::gated_mlp<activation::silu>>>,
                   blocks::block<blocks::pre_norm<blocks::rms_norm<>, Attention>, blocks::pre_norm<blocks::rms_norm<>, Moe>>>;

using qwen2_moe_blocks =
    blocks::decoder<blocks::embedding<>,
                    qwen_moe_layers<blocks::attention<>,
                                    blocks::moe<blocks::softmax_router<>, blocks::experts<>, blocks::gated_shared_expert<>>>,
                    blocks::rms_norm<>>;

using qwen3_moe_blocks =
    blocks::decoder<blocks::embedding<>,
                    qwen_moe_layers<blocks::attention<blocks::attention_knobs{}, blocks::per_head_qk_norm<blocks::rms_norm<>>>,
                                    blocks::moe<>>,
                    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr moe_config qwen2_moe_moe{.count_key = "num_experts", .top_k = 4, .expert_ffn = 1408,
                                          .shared_expert_ffn = 5632};
inline constexpr config_key_rule qwen2_moe_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"num_experts", key_use::read},
    {"moe_intermediate_size", key_use::read},
    {"shared_expert_intermediate_size", key_use::read},
    {"norm_topk_prob", key_use::read},
    {"decoder_sparse_step", key_use::read},
    {"mlp_only_layers", key_use::read},
    {"qkv_bias", key_use::read},
    {"router_aux_loss_coef", key_use::no_effect},
    {"output_router_logits", key_use::no_effect},
    {"sliding_window", key_use::read},      // cleared without use_sliding_window, which is refused
    {"use_sliding_window", key_use::read},
    {"max_window_layers", key_use::read},
    {"layer_types", key_use::read},
};
inline constexpr family_config qwen2_moe_config{
    .model_type = "qwen2_moe", .hf_class = "Qwen2Moe", .display = "Qwen1.5/2-MoE",
    .arch = &architecture_of<qwen2_moe_blocks>, .max_positions = 32768, .rms_eps = 1e-6, .bias = {.qkv = {"qkv_bias", true}},
    .use_flag_refusal = "is true: Qwen2-MoE then slides alternate layers below max_window_layers, which megadsl "
                        "does not implement",
    .moe = &qwen2_moe_moe, .keys = qwen2_moe_keys};

inline constexpr moe_config qwen3_moe_moe{.count_key = "num_local_experts", .reads_both_counts = true, .top_k = 8,
                                          .expert_ffn = 768};
inline constexpr config_key_rule qwen3_moe_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"num_local_experts", key_use::read},
    {"num_experts", key_use::read},
    {"moe_intermediate_size", key_use::read},
    {"norm_topk_prob", key_use::read},
    {"decoder_sparse_step", key_use::read},
    {"mlp_only_layers", key_use::read},
    {"router_aux_loss_coef", key_use::no_effect},
    {"output_router_logits", key_use::no_effect},
    {"attention_bias", key_use::read},
    {"sliding_window", key_use::read},
    {"use_sliding_window", key_use::read},
    {"max_window_layers", key_use::no_effect},  // Qwen3MoeAttention slides every layer or none
    {"layer_types", key_use::no_effect},
};
inline constexpr family_config qwen3_moe_config{
    .model_type = "qwen3_moe", .hf_class = "Qwen3Moe", .display = "Qwen3-MoE",
    .arch = &architecture_of<qwen3_moe_blocks>, .max_positions = 32768, .rms_eps = 1e-6, .bias = {.qkv = attention_bias_key, .out = attention_bias_key},
    .window = window_rule::every_layer, .window_needs_use_flag = true, .moe = &qwen3_moe_moe, .keys = qwen3_moe_keys};

template <shape S>
struct qwen2_moe : decoder_family<qwen2_moe_blocks, S> {
  static constexpr std::string_view family = qwen2_moe_config.model_type;
  static constexpr std::string_view name = "qwen2_moe";
};

template <shape S>
struct qwen3_moe : decoder_family<qwen3_moe_blocks, S> {
  static constexpr std::string_view family = qwen3_moe_config.model_type;
  static constexpr std::string_view name = "qwen3_moe";
};

// 60 experts of 1408, top 4 not renormalised, and a shared expert of 5632 (intermediate_size, the
// width a dense layer would have, is unused: every layer is sparse).
struct qwen1_5_moe_a2_7b
    : qwen2_moe<shape{.hidden = 2048, .layers = 24, .heads = 16, .kv_heads = 16, .ffn = 5632, .vocab = 151936,
                      .max_positions = 8192, .rms_eps = 1e-6, .rope_theta = 1000000.0, .qkv_bias = true,
                      .experts = 60, .top_k = 4, .expert_ffn = 1408, .shared_expert_ffn = 5632, .norm_topk = false}> {
  static constexpr std::string_view name = "qwen1.5-moe-a2.7b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen1.5-MoE-A2.7B";
  static constexpr std::int64_t published_params = 14'315'784'192;
};

// 128 experts of 768, top 8 renormalised; head_dim 128 with 32 q heads (4096 > hidden 2048).
struct qwen3_30b_a3b
    : qwen3_moe<shape{.hidden = 2048, .layers = 48, .heads = 32, .kv_heads = 4, .ffn = 6144, .vocab = 151936,
                      .head_dim = 128, .max_positions = 40960, .rms_eps = 1e-6, .rope_theta = 1000000.0,
                      .experts = 128, .top_k = 8, .expert_ffn = 768, .norm_topk = true}> {
  static constexpr std::string_view name = "qwen3-30b-a3b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen3-30B-A3B";
  static constexpr std::int64_t published_params = 30'532'122'624;
};

}  // namespace megadsl
