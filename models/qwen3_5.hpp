// Qwen3.5's text models as strong preset types: Qwen3-Next's hybrid (gated DeltaNet layers with
// output-gated full attention every full_attention_interval-th layer, zero-centred norms, RoPE on a
// quarter of each head) with the DeltaNet's projections stored apart (in_proj_qkv = [all q | all k |
// all v], in_proj_z, in_proj_b, in_proj_a); the dense text model's MLP a SwiGLU in every layer,
// Qwen3.5-MoE's a mixture with the gated shared expert in every layer (top-k always renormalised).
// Two kinds of layer each, chosen per layer from config.json.
//
// Qwen3.5 rotates by multimodal RoPE (mrope_section): with text only, its three position streams
// are one and the rotation is plain RoPE, which is what megadsl applies (megadsl trains the text
// model: the published checkpoints' vision tower is not read, see hf_config.cpp's text_config).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/qwen3_next.hpp"  // its norms, attention and mixture
#include "megadsl/shape.hpp"

namespace megadsl {

// Layer i's kind: 0 linear attention, 1 full attention.
constexpr int qwen3_5_layer(const shape& s, std::int64_t layer) { return linear_layer(s, layer) ? 0 : 1; }

using qwen3_5_delta_net = blocks::gated_delta_net<blocks::delta_net_storage::split>;

using qwen3_5_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::select<&qwen3_5_layer, qwen3_next_block<qwen3_5_delta_net, blocks::gated_mlp<activation::silu>>,
                   qwen3_next_block<qwen3_next_attention, blocks::gated_mlp<activation::silu>>>,
    qwen3_next_norm>;

using qwen3_5_moe_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::select<&qwen3_5_layer, qwen3_next_block<qwen3_5_delta_net, qwen3_next_moe>,
                   qwen3_next_block<qwen3_next_attention, qwen3_next_moe>>,
    qwen3_next_norm>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule qwen3_5_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},  // q/k/v and o_proj biases
    {"partial_rotary_factor", key_use::read},
    {"layer_types", key_use::read},              // which layers are linear (qwen3_next/linear_layers.hpp)
    {"full_attention_interval", key_use::read},
};
inline constexpr family_config qwen3_5_config{
    .model_type = "qwen3_5_text", .hf_class = "Qwen3_5", .display = "Qwen3.5 (text)",
    .arch = &architecture_of<qwen3_5_blocks>, .max_positions = 32768, .rms_eps = 1e-6, .head_dim = 256,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .partial_rotary_key = "partial_rotary_factor", .partial_rotary_default = 0.25,
    .layer_type = &qwen3_next_layer_type, .read_own = &qwen3_next_linear_layers, .keys = qwen3_5_keys, .multimodal = {"qwen3_5", "Qwen3_5ForConditionalGeneration", false}};

// Experts of moe_intermediate_size in every layer (the config class has no dense MLP width: the
// shape's ffn is the experts'), top 8 always renormalised, the shared expert of 512.
inline constexpr moe_config qwen3_5_moe_moe_config{.count_key = "num_experts", .top_k = 8, .reads_norm_topk = false,
                                                   .expert_ffn = 512, .every_layer = true, .shared_expert_ffn = 512,
                                                   .norm_topk = true};
inline constexpr config_key_rule qwen3_5_moe_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"num_experts", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"moe_intermediate_size", key_use::read},
    {"shared_expert_intermediate_size", key_use::read},
    {"partial_rotary_factor", key_use::read},
    {"layer_types", key_use::read},
    {"full_attention_interval", key_use::read},
    {"router_aux_loss_coef", key_use::no_effect},  // megadsl's own model_options::moe_aux_loss_coeff
    {"output_router_logits", key_use::no_effect},
};
inline constexpr family_config qwen3_5_moe_config{
    .model_type = "qwen3_5_moe_text", .hf_class = "Qwen3_5Moe", .display = "Qwen3.5-MoE (text)",
    .arch = &architecture_of<qwen3_5_moe_blocks>, .max_positions = 32768, .rms_eps = 1e-6, .head_dim = 256,
    .ffn_key = "moe_intermediate_size", .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .partial_rotary_key = "partial_rotary_factor",
    .partial_rotary_default = 0.25, .layer_type = &qwen3_next_layer_type, .read_own = &qwen3_next_linear_layers,
    .moe = &qwen3_5_moe_moe_config, .keys = qwen3_5_moe_keys,
    .multimodal = {"qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", false}};

template <shape S>
struct qwen3_5 : decoder_family<qwen3_5_blocks, S> {
  static constexpr std::string_view family = qwen3_5_config.model_type;
  static constexpr std::string_view name = "qwen3_5";
};

template <shape S>
struct qwen3_5_moe : decoder_family<qwen3_5_moe_blocks, S> {
  static constexpr std::string_view family = qwen3_5_moe_config.model_type;
  static constexpr std::string_view name = "qwen3_5_moe";
};

// ---- presets ----

// Qwen/Qwen3.5-35B-A3B's text model (the published checkpoint is multimodal: its vision tower and
// MTP layer are not counted): the sizes slime's Megatron recipe for it states
// (THUDM/slime scripts/models/qwen3.5-35B-A3B.sh) and Qwen3_5MoeTextConfig's defaults, which
// transformers documents as that model's, agree on; rope_theta 1e7 as the recipe has it.
// The dense Qwen3.5 text models: the hub's totals include the vision tower and the MTP layer, and
// each reconciles exactly as text + vision + MTP (transformers' counts on the meta device); the
// text model's count is the one here. Every size: heads of 256 (RoPE on a quarter, theta 1e7),
// three DeltaNet layers then a full one, 16 key heads of 128, value heads of 128.
// Qwen3.5-9B: 32 layers, 16 query heads over 4 kv heads, 32 value heads, SwiGLU of 12288, untied;
// its text model's 8,953,803,264 also written out by a second source beside its config.
struct qwen3_5_9b
    : qwen3_5<shape{.hidden = 4096, .layers = 32, .heads = 16, .kv_heads = 4, .ffn = 12288, .vocab = 248320,
                    .head_dim = 256, .max_positions = 262144, .rms_eps = 1e-6, .rope_theta = 10000000.0,
                    .rotary_fraction = 0.25, .linear_layers = linear_every_but(32, 4)}> {  // the DeltaNet's sizes: its keys' defaults
  static constexpr std::string_view name = "qwen3.5-9b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen3.5-9B";
  static constexpr std::int64_t published_params = 8'953'803'264;
};
// Qwen3.5-27B: 64 layers, 24 query heads over 4 kv heads, 48 value heads, SwiGLU of 17408, untied
// (the config slime's recipe THUDM/slime scripts/models/qwen3.5-27B.sh states; the hub's total
// 27,781,427,952 split as text 26,895,998,464 + vision + MTP by a second source).
struct qwen3_5_27b
    : qwen3_5<shape{.hidden = 5120, .layers = 64, .heads = 24, .kv_heads = 4, .ffn = 17408, .vocab = 248320,
                    .head_dim = 256, .max_positions = 262144, .rms_eps = 1e-6, .rope_theta = 10000000.0,
                    .rotary_fraction = 0.25, .linear_layers = linear_every_but(64, 4),
                    .settings = settings_given({{"linear_num_value_heads", 48}})}> {
  static constexpr std::string_view name = "qwen3.5-27b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen3.5-27B";
  static constexpr std::int64_t published_params = 26'895'998'464;
};

struct qwen3_5_35b_a3b
    : qwen3_5_moe<shape{.hidden = 2048, .layers = 40, .heads = 16, .kv_heads = 2, .ffn = 512, .vocab = 248320,
                        .head_dim = 256, .max_positions = 262144, .rms_eps = 1e-6, .rope_theta = 10000000.0,
                        .rotary_fraction = 0.25, .experts = 256, .top_k = 8, .expert_ffn = 512, .shared_expert_ffn = 512,
                        .norm_topk = true, .linear_layers = linear_every_but(40, 4)}> {  // the DeltaNet's sizes: its keys' defaults
  static constexpr std::string_view name = "qwen3.5-35b-a3b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen3.5-35B-A3B";
  // transformers' Qwen3_5MoeForCausalLM of that config, built on the meta device.
  static constexpr std::int64_t published_params = 34'660'610'688;
};

}  // namespace megadsl
