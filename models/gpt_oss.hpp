// OpenAI's gpt-oss as strong preset types: pre-norm layers (RMSNorm multiplied in fp32), attention
// with q/k/v and o_proj biases and a learned sink logit per query head (self_attn.sinks), sliding
// (128 tokens) and full layers alternating from the first, YaRN RoPE; in every layer a mixture of
// experts behind a router with a bias (top-k of the raw logits, softmax over the k), each expert
// the clamped SwiGLU with biases, the experts stored as transformers writes them: one tensor per
// layer and projection, every expert's matrix (in, out), gate and up columns interleaved.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Its mixture (GptOssMLP): mlp.router with a bias, the experts stacked with their biases
// (mlp.experts.gate_up_proj (E, h, 2 f) with gate and up columns interleaved, down_proj (E, f, h),
// and _bias (E, 2 f), (E, h)), each the clamped SwiGLU.
inline constexpr blocks::router_names gpt_oss_router{.weight = "router.weight", .bias = "router.bias"};
inline constexpr blocks::stacked_expert_names gpt_oss_experts{.gate_up_bias = "experts.gate_up_proj_bias",
                                                              .down_bias = "experts.down_proj_bias"};
inline constexpr blocks::mixture_names gpt_oss_mixture_names{.signature = "gpt_oss"};
using gpt_oss_mixture = blocks::moe<blocks::softmax_router<gpt_oss_router>, blocks::clamped_swiglu_experts<gpt_oss_experts>,
                                    blocks::no_shared_expert, gpt_oss_mixture_names>;

using gpt_oss_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<norm_kind::rms_wmul>, blocks::attention<blocks::attention_knobs{.sinks = true}>>,
                  blocks::pre_norm<blocks::rms_norm<norm_kind::rms_wmul>,
                                   gpt_oss_mixture>>,
    blocks::rms_norm<norm_kind::rms_wmul>>;

// ---- config.json (megadsl/family_config.hpp) ----

// Every layer a mixture of experts as wide as intermediate_size; the k chosen weighed by a softmax
// over their logits, which is the renormalised top-k of the softmax over every expert.
inline constexpr moe_config gpt_oss_moe{.count_key = "num_local_experts", .reads_both_counts = true, .top_k = 4,
                                        .experts_as_wide_as_ffn = true, .reads_norm_topk = false, .norm_topk = true};
inline constexpr config_key_rule gpt_oss_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
    {"num_local_experts", key_use::read},
    {"num_experts", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"sliding_window", key_use::read},
    {"layer_types", key_use::read},
    // The experts apply their clamped SwiGLU whatever hidden_act says (GptOssExperts reads only
    // swiglu_alpha and swiglu_limit: its experts' own keys, blocks/experts.hpp).
    {"hidden_act", key_use::no_effect},
    {"router_aux_loss_coef", key_use::no_effect},  // megadsl's own model_options::moe_aux_loss_coeff
    {"output_router_logits", key_use::no_effect},
};
inline constexpr family_config gpt_oss_config{
    .model_type = "gpt_oss", .hf_class = "GptOss", .display = "gpt-oss",
    .arch = &architecture_of<gpt_oss_blocks>, .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 150000.0,
    .head_dim = 64, .bias = {.qkv = {"attention_bias", true, true}, .out = {"attention_bias", true, true}}, .default_window = 128,
    .window = window_rule::alternate, .reads_layer_types = true,
    .rope_must_be_stated = "gives no RoPE: GptOssConfig then substitutes YaRN (factor 32 over 4096 positions), which "
                           "megadsl reads only when stated; add the checkpoint's \"rope_parameters\"",
    .moe = &gpt_oss_moe, .keys = gpt_oss_keys};

template <shape S>
struct gpt_oss : decoder_family<gpt_oss_blocks, S> {
  static constexpr std::string_view family = gpt_oss_config.model_type;
  static constexpr std::string_view name = "gpt_oss";
};

// The published models' shape: 64 query heads of 64 over 8 kv heads, experts of 2880, top 4,
// YaRN x32 over 4096 positions (beta 32 / 1, not truncated), theta 150000, untied.
inline constexpr shape gpt_oss_shape{
    .hidden = 2880, .heads = 64, .kv_heads = 8, .ffn = 2880, .vocab = 201088, .head_dim = 64,
    .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 150000.0,
    .rope = {.type = rope_type::yarn, .factor = 32.0, .original_max_positions = 4096, .beta_fast = 32.0,
             .beta_slow = 1.0, .truncate = false},
    .qkv_bias = true, .out_bias = true, .top_k = 4, .norm_topk = true};

constexpr shape gpt_oss_with(std::int64_t layers, std::int64_t experts) {
  shape s = gpt_oss_shape;
  s.layers = layers;
  s.experts = experts;
  return s;
}

// 24 layers of 32 experts.
struct gpt_oss_20b : gpt_oss<gpt_oss_with(24, 32)> {
  static constexpr std::string_view name = "gpt-oss-20b";
  static constexpr std::string_view hf_repo = "openai/gpt-oss-20b";
  static constexpr std::int64_t published_params = 20'914'757'184;
};

// 36 layers of 128 experts.
struct gpt_oss_120b : gpt_oss<gpt_oss_with(36, 128)> {
  static constexpr std::string_view name = "gpt-oss-120b";
  static constexpr std::string_view hf_repo = "openai/gpt-oss-120b";
  static constexpr std::int64_t published_params = 116'829'156'672;
};

}  // namespace megadsl
