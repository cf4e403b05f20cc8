// AllenAI's OLMoE as strong preset types: Llama's pre-norms and attention with OLMo's q/k norms over
// the full projection width (Llama's RMSNorm, before RoPE), and a mixture of experts in every layer
// behind HF's softmax top-k router (not renormalised unless norm_topk_prob), each expert a SwiGLU of
// intermediate_size, under Qwen's HF names (mlp.gate, mlp.experts.E.{gate,up,down}_proj).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using olmoe_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>,
                                   blocks::attention<blocks::attention_knobs{}, blocks::full_width_qk_norm<blocks::rms_norm<>>>>,
                  blocks::pre_norm<blocks::rms_norm<>, blocks::moe<>>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr moe_config olmoe_moe{.count_key = "num_experts", .reads_both_counts = true, .top_k = 8,
                                      .experts_as_wide_as_ffn = true, .norm_topk = false};
inline constexpr config_key_rule olmoe_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"num_experts", key_use::read},
    {"num_local_experts", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"norm_topk_prob", key_use::read},
    {"clip_qkv", key_use::refused},               // q, k and v clamped to [-c, c]: not implemented
    {"router_aux_loss_coef", key_use::no_effect}, // megadsl's own model_options::moe_aux_loss_coeff
    {"output_router_logits", key_use::no_effect},
};
inline constexpr family_config olmoe_config{
    .model_type = "olmoe", .hf_class = "Olmoe", .display = "OLMoE",
    .arch = &architecture_of<olmoe_blocks>, .max_positions = 4096, .rms_eps = 1e-5,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .moe = &olmoe_moe, .keys = olmoe_keys};

// OLMoE: full-width q/k norms and a mixture of experts of intermediate_size in every layer.
template <shape S>
struct olmoe : decoder_family<olmoe_blocks, S> {
  static constexpr std::string_view family = olmoe_config.model_type;
  static constexpr std::string_view name = "olmoe";
};

// 64 experts of 1024, top 8 not renormalised, multi-head attention.
struct olmoe_1b_7b : olmoe<shape{.hidden = 2048, .layers = 16, .heads = 16, .kv_heads = 16, .ffn = 1024,
                                 .vocab = 50304, .max_positions = 4096, .rms_eps = 1e-5, .rope_theta = 10000.0,
                                 .experts = 64, .top_k = 8, .expert_ffn = 0, .norm_topk = false}> {
  static constexpr std::string_view name = "olmoe-1b-7b";
  static constexpr std::string_view hf_repo = "allenai/OLMoE-1B-7B-0924";
  static constexpr std::int64_t published_params = 6'919'161'856;
};

}  // namespace megadsl
