// Baidu ERNIE 4.5 MoE as strong preset types: ERNIE 4.5's attention (RoPE on interleaved pairs,
// Llama's pre-norms) and, in the layers from moe_layer_start_index to moe_layer_end_index whose
// (i + 1) % moe_layer_interval == 0, a mixture behind ERNIE's router: softmax scores in fp32, the
// experts chosen by scores + an expert bias (mlp.moe_statics.e_score_correction_bias, stored
// (1, E); selecting only, balanced by load in training like DeepSeek-V3's), their unbiased scores
// renormalised with the floor moe_norm_min; beside ungated shared experts (mlp.shared_experts.*,
// moe_num_shared_experts x moe_intermediate_size wide; none at 0, as ERNIE-4.5-300B-A47B has). The
// other layers have a dense SwiGLU.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/ernie4_5_moe/biased_softmax_router.hpp"
#include "megadsl/models/qwen_moe.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Its mixture: its router (the expert bias stored as one row (1, E) at mlp.moe_statics), Qwen's
// experts, DeepSeek's shared experts (none where moe_num_shared_experts is 0).
inline constexpr blocks::router_names ernie4_5_router{.expert_bias = "moe_statics.e_score_correction_bias",
                                                      .expert_bias_form = hf_form::one_row};
inline constexpr blocks::mixture_names ernie4_5_mixture_names{.signature = "ernie"};
using ernie4_5_mixture = blocks::moe<blocks::biased_softmax_router<ernie4_5_router>, blocks::experts<>,
                                     blocks::shared_expert<blocks::hf_shared_experts_names, presence::shared_experts>,
                                     ernie4_5_mixture_names>;

// The layers: Qwen's choice of dense or sparse per layer (the shape's sparse_step and dense_layers
// say ERNIE's range and interval), its attention Llama's with the shape's interleaved RoPE.
using ernie4_5_moe_blocks = blocks::decoder<
    blocks::embedding<>,
    qwen_moe_layers<blocks::attention<>, ernie4_5_mixture>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr moe_config ernie4_5_moe_moe{
    .count_key = "moe_num_experts", .top_k = 6, .top_k_key = "moe_k", .reads_norm_topk = false, .expert_ffn = 1536,
    .sparse_step_key = "moe_layer_interval", .norm_topk = true, .shared_count_key = "moe_num_shared_experts",
    .shared_count = 2, .shared_count_least = 0, .sparse_first_key = "moe_layer_start_index", .sparse_first = 1,
    .sparse_last_key = "moe_layer_end_index",
    .count_alias = "num_experts", .top_k_alias = "num_experts_per_tok"};
inline constexpr config_key_rule ernie4_5_moe_keys[] = {
    {"attention_dropout", key_use::no_effect, "transformers' ERNIE 4.5 attention applies no dropout"},
    {"rms_norm_eps", key_use::read},
    {"use_bias", key_use::refused,
     "biases on every projection, the shared experts' and lm_head's among them: not in this composition yet; "
     "ERNIE 4.5's published checkpoints have none"},
    {"moe_num_experts", key_use::read},
    {"num_experts", key_use::read},          // (the class maps it onto moe_num_experts)
    {"moe_k", key_use::read},
    {"num_experts_per_tok", key_use::read},  // (onto moe_k)
    {"moe_intermediate_size", key_use::read},
    {"moe_num_shared_experts", key_use::read},
    {"moe_layer_start_index", key_use::read},
    {"moe_layer_end_index", key_use::read},
    {"moe_layer_interval", key_use::read},
    {"output_router_logits", key_use::no_effect},
    {"router_aux_loss_coef", key_use::no_effect},  // megadsl's own model_options::moe_aux_loss_coeff
};
inline constexpr family_config ernie4_5_moe_config{
    .model_type = "ernie4_5_moe", .hf_class = "Ernie4_5_Moe", .display = "ERNIE 4.5 MoE",
    .arch = &architecture_of<ernie4_5_moe_blocks>, .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 500000.0,
    .tie_embeddings = true, .interleaved_rope = true, .ignored_tensors = "mtp", .moe = &ernie4_5_moe_moe,
    .keys = ernie4_5_moe_keys};

// ERNIE 4.5 MoE: RoPE on pairs, dense and sparse layers, the biased softmax router, shared experts.
template <shape S>
struct ernie4_5_moe : decoder_family<ernie4_5_moe_blocks, S> {
  static constexpr std::string_view family = ernie4_5_moe_config.model_type;
  static constexpr std::string_view name = "ernie4_5_moe";
};

// ERNIE-4.5-21B-A3B: 28 layers (layer 0 dense, 1-27 sparse), 20 query heads of 128 over 4 kv heads;
// 64 experts of 1536, top 6, two shared (3072 wide); tied; theta 500000. Its sizes are where
// transformers' Ernie4_5_MoeConfig defaults (documented as this model's) and the configs summarised
// from the hub agree. The count is the hub's safetensors total of ERNIE-4.5-21B-A3B-Thinking (the
// same architecture, no MTP weights): 4,425,408 fp32 (27 routers and expert biases) and
// 21,821,012,480 bf16.
struct ernie4_5_21b_a3b
    : ernie4_5_moe<shape{.hidden = 2560, .layers = 28, .heads = 20, .kv_heads = 4, .ffn = 12288, .vocab = 103424,
                         .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 500000.0, .tie_embeddings = true,
                         .rope_interleave = true, .experts = 64, .top_k = 6, .expert_ffn = 1536,
                         .shared_expert_ffn = 3072, .norm_topk = true, .dense_layers = 1}> {
  static constexpr std::string_view name = "ernie-4.5-21b-a3b";
  static constexpr std::string_view hf_repo = "baidu/ERNIE-4.5-21B-A3B-PT";
  static constexpr std::int64_t published_params = 21'825'437'888;
};

}  // namespace megadsl
