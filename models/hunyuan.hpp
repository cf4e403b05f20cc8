// Tencent HunYuan dense and MoE (model_type hunyuan_v1_dense, hunyuan_v1_moe) as strong preset
// types: the Llama blocks with per-head q/k RMSNorms applied after RoPE (query_layernorm,
// key_layernorm), biases on q/k/v and o_proj by `attention_bias`, and its fixed NTK-alpha RoPE read as
// plain RoPE on the stretched base. The MoE's every layer routes each token to its top-k of
// num_experts experts (softmax, renormalised) and adds one ungated shared MLP, all of
// intermediate_size.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/hunyuan/ntk_alpha_rope.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Its q/k norms' HF names.
inline constexpr blocks::qk_norm_names hunyuan_qk_norm_names{"query_layernorm", "key_layernorm"};

using hunyuan_dense_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>,
                                   blocks::attention<blocks::attention_knobs{},
                                                     blocks::per_head_qk_norm<blocks::rms_norm<>, hunyuan_qk_norm_names,
                                                                              /*AfterRope=*/true>>>,
                  blocks::pre_norm<blocks::rms_norm<>, blocks::gated_mlp<activation::silu>>>,
    blocks::rms_norm<>>;

using hunyuan_attention =
    blocks::attention<blocks::attention_knobs{}, blocks::per_head_qk_norm<blocks::rms_norm<>, hunyuan_qk_norm_names, /*AfterRope=*/true>>;
// Its mixture: the softmax router in fp32 at mlp.gate.wg, Qwen's experts, one ungated shared MLP
// (mlp.shared_mlp).
inline constexpr blocks::router_names hunyuan_router{.weight = "gate.wg.weight"};
inline constexpr blocks::shared_expert_names hunyuan_shared_mlp{.module = "shared_mlp"};
inline constexpr blocks::mixture_names hunyuan_mixture_names{.signature = "hunyuan"};
using hunyuan_mixture = blocks::moe<blocks::softmax_router<hunyuan_router, true>, blocks::experts<>,
                                    blocks::shared_expert<hunyuan_shared_mlp>, hunyuan_mixture_names>;

using hunyuan_moe_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>, hunyuan_attention>,
                  blocks::pre_norm<blocks::rms_norm<>, hunyuan_mixture>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule hunyuan_dense_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},       // q/k/v and o_proj biases
    {"pretraining_tp", key_use::no_effect},  // HF's sliced matmuls: the same product
    {"eod_token_id", key_use::no_effect},    // a token id (kept in config.json)
};
inline constexpr family_config hunyuan_dense_config{
    .model_type = "hunyuan_v1_dense", .hf_class = "HunYuanDenseV1", .display = "HunYuan dense",
    .arch = &architecture_of<hunyuan_dense_blocks>, .max_positions = 2048, .rms_eps = 1e-5,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .read_own = &hunyuan_ntk_alpha_rope,
    .keys = hunyuan_dense_keys};

// HunYuan dense: q and k rotated, then normed per head; biases per the shape.
template <shape S>
struct hunyuan_dense : decoder_family<hunyuan_dense_blocks, S> {
  static constexpr std::string_view family = hunyuan_dense_config.model_type;
  static constexpr std::string_view name = "hunyuan_v1_dense";
};

inline constexpr moe_config hunyuan_moe_moe{.count_key = "num_experts", .top_k = 1, .top_k_key = "moe_topk",
                                            .shared_as_wide_as_ffn = true, .experts_as_wide_as_ffn = true,
                                            .reads_norm_topk = false};
inline constexpr config_key_rule hunyuan_moe_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},        // q/k/v and o_proj biases
    {"num_experts", key_use::read},           // (num_local_experts maps to it)
    {"moe_topk", key_use::read},              // (num_experts_per_tok maps to it); one per layer, all equal
    {"pretraining_tp", key_use::no_effect},   // HF's sliced matmuls: the same product
    {"eod_token_id", key_use::no_effect},     // a token id (kept in config.json)
    {"output_router_logits", key_use::no_effect},  // what the forward returns
};
inline constexpr family_config hunyuan_moe_config{
    .model_type = "hunyuan_v1_moe", .hf_class = "HunYuanMoEV1", .display = "HunYuan MoE (Hunyuan-A13B)",
    .arch = &architecture_of<hunyuan_moe_blocks>, .max_positions = 2048, .rms_eps = 1e-5,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .read_own = &hunyuan_ntk_alpha_rope,
    .moe = &hunyuan_moe_moe, .keys = hunyuan_moe_keys};

// HunYuan MoE: HunYuan dense's attention; every layer a softmax top-k mixture plus a shared MLP.
template <shape S>
struct hunyuan_moe : decoder_family<hunyuan_moe_blocks, S> {
  static constexpr std::string_view family = hunyuan_moe_config.model_type;
  static constexpr std::string_view name = "hunyuan_v1_moe";
};

// Hunyuan-A13B: 32 layers, 32 query heads of 128 over 8 kv heads (q/k norms after RoPE), every
// layer 64 experts of 3072, top 8 renormalised, beside the shared MLP of 3072; tied; its NTK-alpha
// RoPE (alpha 1000 on theta 10000) as the plain RoPE it is, theta 10000 x 1000^(128/126) as Python
// computes it. Its sizes as the GitHub release's config.json (tianyu1412/Hunyuan-A13B) and test
// fixtures naming A13B agree; the count, 80,393,183,232, is the safetensors headers' total as an
// article's ledger and a hub measurement (80.39B) give it, and transformers' count of the config.
struct hunyuan_a13b
    : hunyuan_moe<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8, .ffn = 3072, .vocab = 128167,
                        .head_dim = 128, .max_positions = 32768, .rms_eps = 1e-5, .rope_theta = 11158839.92507748,
                        .tie_embeddings = true, .experts = 64, .top_k = 8, .shared_expert_ffn = 3072, .norm_topk = true}> {
  static constexpr std::string_view name = "hunyuan-a13b";
  static constexpr std::string_view hf_repo = "tencent/Hunyuan-A13B-Instruct";
  static constexpr std::int64_t published_params = 80'393'183'232;
};

}  // namespace megadsl
