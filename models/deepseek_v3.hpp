// DeepSeek-V3 as strong preset types (and the checkpoints of its config class: Kimi K2, Moonlight,
// DeepSeek-R1): multi-head latent attention (blocks::mla); the first first_k_dense_replace layers a
// dense SwiGLU, the rest a mixture behind the grouped sigmoid router with its expert bias beside
// ungated shared experts, as GLM-4.5 has them (models/glm4_moe.hpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/deepseek_v3/mla.hpp"
#include "megadsl/models/glm4_moe.hpp"  // dense_first_layer
#include "megadsl/shape.hpp"

namespace megadsl {

// The mixture GLM-4.5 took from it (models/glm4_moe.hpp), its router's keys' defaults DeepseekV3Config's.
inline constexpr blocks::grouped_router_defaults deepseek_v3_routing{.routed_scaling_factor = 2.5, .n_group = 8, .topk_group = 4};
using deepseek_v3_mixture = glm4_moe_sparse_of<blocks::grouped_sigmoid_router<blocks::hf_grouped_router_names, deepseek_v3_routing>>;

template <class Mlp>
using deepseek_v3_block = blocks::block<blocks::pre_norm<blocks::rms_norm<>, blocks::mla>, blocks::pre_norm<blocks::rms_norm<>, Mlp>>;

using deepseek_v3_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::select<&dense_first_layer, deepseek_v3_block<blocks::gated_mlp<activation::silu>>,
                   deepseek_v3_block<deepseek_v3_mixture>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr moe_config deepseek_v3_moe{.count_key = "n_routed_experts", .top_k = 8, .expert_ffn = 2048, .norm_topk = true,
                                            .shared_count_key = "n_shared_experts", .shared_count = 1,
                                            .dense_first_key = "first_k_dense_replace", .dense_first = 3};
inline constexpr config_key_rule deepseek_v3_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"qk_rope_head_dim", key_use::read},  // head_dim (MLA's own keys are its block's)
    {"qk_head_dim", key_use::no_effect},           // DeepseekV3Config sets it to qk_nope + qk_rope itself
    {"rope_interleave", key_use::read},
    {"n_routed_experts", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"moe_intermediate_size", key_use::read},
    {"n_shared_experts", key_use::read},
    {"norm_topk_prob", key_use::read},
    {"first_k_dense_replace", key_use::read},
    {"attention_bias", key_use::refused},          // biases on q_a_proj, kv_a_proj_with_mqa, o_proj: not in this block
    {"pretraining_tp", key_use::no_effect},        // HF's sliced matmuls: the same product
    {"num_mtp_layers", key_use::no_effect},        // the multi-token-prediction layers HF does not run
    {"num_nextn_predict_layers", key_use::read},   // the MTP layers stored after the decoder's: not loaded
    {"output_router_logits", key_use::no_effect},
    {"router_aux_loss_coef", key_use::no_effect},  // megadsl's own model_options::moe_aux_loss_coeff
    {"scoring_func", key_use::no_effect},          // remote-code configs' "sigmoid": the class's only router
    {"topk_method", key_use::no_effect},           // remote-code configs' "noaux_tc": the same router
    {"ep_size", key_use::no_effect},
    {"moe_layer_freq", key_use::no_effect},        // 1 in every published config; the class ignores it
};
inline constexpr family_config deepseek_v3_config{
    .model_type = "deepseek_v3", .hf_class = "DeepseekV3", .display = "DeepSeek-V3/R1, Moonlight",
    .arch = &architecture_of<deepseek_v3_blocks>, .max_positions = 4096, .rms_eps = 1e-6, .head_dim = 64,
    .interleaved_rope = true, .rope_interleave_key = "rope_interleave", .head_dim_key = "qk_rope_head_dim",
    .mtp_key = "num_nextn_predict_layers", .moe = &deepseek_v3_moe, .keys = deepseek_v3_keys};
// Kimi K2's checkpoints say model_type "kimi_k2" (their config.json names DeepseekV3ForCausalLM and
// ships its own copy of the code for trust_remote_code): DeepSeek-V3's composition, keys and defaults.
inline constexpr family_config kimi_k2_config = [] {
  family_config f = deepseek_v3_config;
  f.model_type = "kimi_k2";
  f.display = "Kimi K2";
  return f;
}();

// DeepSeek-V3: multi-head latent attention, dense first layers, DeepSeek's router and shared experts.
template <shape S>
struct deepseek_v3 : decoder_family<deepseek_v3_blocks, S> {
  static constexpr std::string_view family = deepseek_v3_config.model_type;
  static constexpr std::string_view name = "deepseek_v3";
};

// 61 layers (3 dense), 128 heads: q via rank 1536, kv via rank 512, heads [128 | 64], v 128; 256
// experts of 2048 in 8 groups, the best 4 kept, top 8 renormalised x 2.5, one shared expert; YaRN
// RoPE (factor 40 over 4096 positions, mscale and mscale_all_dim 1: the scores scaled by
// m(40)^2 = 1.369^2). The count is the checkpoint's tensors as transformers loads them (the expert
// biases included, the multi-token-prediction layer not).
struct deepseek_v3_671b
    : deepseek_v3<shape{.hidden = 7168, .layers = 61, .heads = 128, .kv_heads = 128, .ffn = 18432, .vocab = 129280,
                        .head_dim = 64, .max_positions = 163840, .rms_eps = 1e-6, .rope_theta = 10000.0,
                        .rope = {.type = rope_type::yarn, .factor = 40.0, .original_max_positions = 4096, .beta_fast = 32.0,
                                 .beta_slow = 1.0, .mscale = 1.0, .mscale_all_dim = 1.0},
                        .rope_interleave = true, .experts = 256, .top_k = 8, .expert_ffn = 2048, .shared_expert_ffn = 2048,
                        .norm_topk = true, .dense_layers = 7,
                        .settings = settings_given({{"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
                                                    {"v_head_dim", 128}, {"routed_scaling_factor", 2.5}, {"n_group", 8},
                                                    {"topk_group", 4}})}> {
  static constexpr std::string_view name = "deepseek-v3";
  static constexpr std::string_view hf_repo = "deepseek-ai/DeepSeek-V3";
  static constexpr std::int64_t published_params = 671'026'419'200;
};

// moonshotai/Kimi-K2-Instruct-0905 (model_type kimi_k2): DeepSeek-V3's blocks with 384 experts,
// 64 heads, one expert group, routed_scaling_factor 2.827, YaRN factor 64 over 4096 positions. Its
// count is the published safetensors': transformers' DeepseekV3ForCausalLM of that config
// (1,026,408,209,408 parameters) and the 60 routed layers' e_score_correction_bias of 384 (23,040),
// as for DeepSeek-V3.
struct kimi_k2
    : deepseek_v3<shape{.hidden = 7168, .layers = 61, .heads = 64, .kv_heads = 64, .ffn = 18432, .vocab = 163840,
                        .head_dim = 64, .max_positions = 262144, .rms_eps = 1e-6, .rope_theta = 50000.0,
                        .rope = {.type = rope_type::yarn, .factor = 64.0, .original_max_positions = 4096, .beta_fast = 1.0,
                                 .beta_slow = 1.0, .mscale = 1.0, .mscale_all_dim = 1.0},
                        .rope_interleave = true, .experts = 384, .top_k = 8, .expert_ffn = 2048, .shared_expert_ffn = 2048,
                        .norm_topk = true, .dense_layers = 1,
                        .settings = settings_given({{"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
                                                    {"v_head_dim", 128}, {"routed_scaling_factor", 2.827}, {"n_group", 1},
                                                    {"topk_group", 1}})}> {
  static constexpr std::string_view name = "kimi-k2";
  static constexpr std::string_view hf_repo = "moonshotai/Kimi-K2-Instruct-0905";
  static constexpr std::int64_t published_params = 1'026'408'232'448;
};

// Moonlight-16B-A3B: the query directly (no q rank), 64 experts of 1408, top 6 x 2.446, two shared
// experts, one dense layer.
struct moonlight_16b_a3b
    : deepseek_v3<shape{.hidden = 2048, .layers = 27, .heads = 16, .kv_heads = 16, .ffn = 11264, .vocab = 163840,
                        .head_dim = 64, .max_positions = 8192, .rms_eps = 1e-5, .rope_theta = 50000.0,
                        .rope_interleave = true, .experts = 64, .top_k = 6, .expert_ffn = 1408, .shared_expert_ffn = 2816,
                        .norm_topk = true, .dense_layers = 1,
                        .settings = settings_given({{"q_lora_rank", 0}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
                                                    {"v_head_dim", 128}, {"routed_scaling_factor", 2.446}, {"n_group", 1},
                                                    {"topk_group", 1}})}> {
  static constexpr std::string_view name = "moonlight-16b-a3b";
  static constexpr std::string_view hf_repo = "moonshotai/Moonlight-16B-A3B";
  static constexpr std::int64_t published_params = 15'960'110'208;
};

}  // namespace megadsl
