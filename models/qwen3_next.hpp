// Qwen3-Next as strong preset types: a hybrid of gated DeltaNet layers (linear attention by the
// gated delta rule) and, every full_attention_interval-th layer (or where layer_types says
// "full_attention"), output-gated attention with zero-centred q/k norms and RoPE on a quarter of
// each head; each layer's MLP a mixture (Qwen2-MoE's: softmax router, experts, and a shared expert
// behind a sigmoid gate), or dense where decoder_sparse_step / mlp_only_layers say. Every norm is
// zero-centred ((1 + w), fp32). Four kinds of layer, chosen per layer from config.json.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/qwen3_next/gated_attention.hpp"
#include "megadsl/models/qwen3_next/linear_layers.hpp"
#include "megadsl/models/qwen_moe.hpp"  // qwen_sparse_layer: the same rule for which layers route
#include "megadsl/shape.hpp"

namespace megadsl {

// Layer i's kind: 0 linear attention, 1 full attention; plus 2 where it routes.
constexpr int qwen3_next_layer(const shape& s, std::int64_t layer) {
  return (linear_layer(s, layer) ? 0 : 1) + 2 * qwen_sparse_layer(s, layer);
}

using qwen3_next_norm = blocks::rms_norm<norm_kind::rms_1p>;
using qwen3_next_attention = blocks::gated_attention<blocks::per_head_qk_norm<qwen3_next_norm>>;
using qwen3_next_moe = blocks::moe<blocks::softmax_router<>, blocks::experts<>, blocks::gated_shared_expert<>>;

template <class Mixer, class Mlp>
using qwen3_next_block = blocks::block<blocks::pre_norm<qwen3_next_norm, Mixer>, blocks::pre_norm<qwen3_next_norm, Mlp>>;

using qwen3_next_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::select<&qwen3_next_layer, qwen3_next_block<blocks::gated_delta_net<>, blocks::gated_mlp<activation::silu>>,
                   qwen3_next_block<qwen3_next_attention, blocks::gated_mlp<activation::silu>>,
                   qwen3_next_block<blocks::gated_delta_net<>, qwen3_next_moe>, qwen3_next_block<qwen3_next_attention, qwen3_next_moe>>,
    qwen3_next_norm>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr moe_config qwen3_next_moe_config{.count_key = "num_experts", .top_k = 10, .expert_ffn = 512,
                                                  .shared_expert_ffn = 512, .norm_topk = true};
inline constexpr config_key_rule qwen3_next_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},  // q/k/v and o_proj biases
    {"num_experts", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"moe_intermediate_size", key_use::read},
    {"shared_expert_intermediate_size", key_use::read},
    {"norm_topk_prob", key_use::read},
    {"decoder_sparse_step", key_use::read},
    {"mlp_only_layers", key_use::read},
    {"partial_rotary_factor", key_use::read},
    {"layer_types", key_use::read},              // which layers are linear (linear_layers.hpp)
    {"full_attention_interval", key_use::read},  // (where layer_types is absent)
    {"router_aux_loss_coef", key_use::no_effect},  // megadsl's own model_options::moe_aux_loss_coeff
    {"output_router_logits", key_use::no_effect},
};
inline constexpr family_config qwen3_next_config{
    .model_type = "qwen3_next", .hf_class = "Qwen3Next", .display = "Qwen3-Next",
    .arch = &architecture_of<qwen3_next_blocks>, .max_positions = 32768, .rms_eps = 1e-6, .head_dim = 256,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .partial_rotary_key = "partial_rotary_factor", .partial_rotary_default = 0.25,
    .layer_type = &qwen3_next_layer_type, .read_own = &qwen3_next_linear_layers, .moe = &qwen3_next_moe_config, .keys = qwen3_next_keys};

// Qwen3-Next: gated DeltaNet layers with gated full attention every fourth layer, mixtures with a
// gated shared expert.
template <shape S>
struct qwen3_next : decoder_family<qwen3_next_blocks, S> {
  static constexpr std::string_view family = qwen3_next_config.model_type;
  static constexpr std::string_view name = "qwen3_next";
};

// The linear layers of `layers` layers with full attention every `interval`-th.
constexpr std::int64_t linear_every_but(std::int64_t layers, std::int64_t interval) {
  std::int64_t bits = 0;
  for (std::int64_t i = 0; i < layers && i < 63; ++i)
    if ((i + 1) % interval != 0) bits |= std::int64_t{1} << i;
  return bits;
}

// Qwen3-Next-80B-A3B: 48 layers, every fourth full attention (16 q heads of 256 over 2 kv heads,
// RoPE on 64 of each head's dims), the others gated DeltaNet (16 key heads of 128, 32 value heads
// of 128, a conv of 4); 512 experts of 512, top 10 renormalised, a shared expert of 512; vocab
// 151936, untied.
struct qwen3_next_80b_a3b
    : qwen3_next<shape{.hidden = 2048, .layers = 48, .heads = 16, .kv_heads = 2, .ffn = 5120, .vocab = 151936,
                       .head_dim = 256, .max_positions = 262144, .rms_eps = 1e-6, .rope_theta = 10000000.0,
                       .rotary_fraction = 0.25, .experts = 512, .top_k = 10, .expert_ffn = 512, .shared_expert_ffn = 512,
                       .norm_topk = true, .linear_layers = linear_every_but(48, 4)}> {  // the DeltaNet's sizes: its keys' defaults
  static constexpr std::string_view name = "qwen3-next-80b-a3b";
  static constexpr std::string_view hf_repo = "Qwen/Qwen3-Next-80B-A3B-Instruct";
  // transformers' Qwen3NextForCausalLM built from the published config on the meta device (the
  // published files also hold a multi-token-prediction layer, mtp.*, which transformers skips).
  static constexpr std::int64_t published_params = 79'674'391'296;
};

}  // namespace megadsl
