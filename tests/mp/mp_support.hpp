// Shared pieces of the multi-process tests: the rank's job, batches, and comparisons of a
// distributed model with the single-process reference.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "megadsl/models/presets.hpp"  // every family (tiny and the real models)
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/runtime/shard_io.hpp"
#include "megadsl/runtime/trainer.hpp"

namespace megadsl::test {

distributed& dist();

// 8 layers, so pp 4 x vpp 2 has a layer per chunk; GQA with kv replication at tp 4.
// Any checkpoint of the registry's families: every size and its blocks read from config.json at run time.
struct any_llama : any_decoder<dynamic_shape> {
  static constexpr std::string_view name = "any-llama";
};

struct tiny8 : llama<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                           .vocab = 500, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny8";
};
struct tiny8_tied : llama<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                .vocab = 500, .max_positions = 256, .qkv_bias = true,
                                .tie_embeddings = true}> {
  static constexpr std::string_view name = "tiny8-tied";
};

// The same sizes in the qwen3 composition (per-head q/k norms: whole on every tp rank, gradients
// summed over tp, with kv replication at tp 4) and the gemma one ((1 + w) norms, scaled embedding,
// GeGLU, tied).
struct tiny8_qwen3 : qwen3<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                 .vocab = 500, .head_dim = 48, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny8-qwen3";
};
struct tiny8_gemma : gemma<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                 .vocab = 500, .max_positions = 256, .tie_embeddings = true}> {
  static constexpr std::string_view name = "tiny8-gemma";
};

// Gemma2's composition: sandwich norms, scores scaled by 24^-1/2 and soft-capped at 5, logits
// soft-capped at 2, a window of 5 tokens on the even layers (the test batches hold up to 12).
struct tiny8_gemma2 : gemma2<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                   .vocab = 500, .max_positions = 256, .tie_embeddings = true,
                                   .query_pre_attn_scalar = 24.0, .attn_softcap = 5.0, .final_softcap = 2.0}> {
  static constexpr std::string_view name = "tiny8-gemma2";
  static constexpr std::int64_t window = 5;
};

// GPT-NeoX's composition: q/k/v interleaved per head, RoPE on 8 of each head's 32 dims, attention
// and MLP side by side, exact GELU, biases everywhere, LayerNorms.
struct tiny8_neox : gpt_neox<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 4, .ffn = 352,
                                   .vocab = 500, .max_positions = 256, .qkv_bias = true, .out_bias = true,
                                   .rotary_fraction = 0.25}> {
  static constexpr std::string_view name = "tiny8-neox";
};

// The options a test model is built with: seeded test weights, and its window when it has one
// (Gemma2's on alternate layers from the first, as its config class derives them).
template <class M>
model_options test_options() {
  model_options o{.test_init = true};
  if constexpr (requires { M::window; }) {
    o.attention_window.size = M::window;
    for (std::int64_t i = 0; i < M::shape.layers.get(); ++i) o.attention_window.layers.push_back(i % 2 == 0);
  }
  return o;
}

// OLMo2's composition: post norms, full-width q/k norms (their squares summed over tp).
struct tiny8_olmo2 : olmo2<shape{.hidden = 128, .layers = 8, .heads = 8, .kv_heads = 4, .ffn = 352,
                                 .vocab = 500, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny8-olmo2";
};

// Phi-3's composition: HF's concatenated qkv_proj / gate_up_proj (the shard math is Llama's).
struct tiny8_phi3 : phi3<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                               .vocab = 500, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny8-phi3";
};

// StarCoder2's composition: LayerNorms with biases, a plain GELU-tanh MLP with biases, o_proj bias.
struct tiny8_starcoder2 : starcoder2<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                           .vocab = 500, .max_positions = 256, .qkv_bias = true,
                                           .tie_embeddings = true, .out_bias = true}> {
  static constexpr std::string_view name = "tiny8-starcoder2";
};

// The mixtures of experts at the same sizes: 8 experts, top 2 (Mixtral: renormalised, experts as
// wide as ffn), top 3 of 8 beside a shared expert, not renormalised (Qwen2-MoE), and Qwen3-MoE's
// per-head q/k norms with renormalised top 2.
struct tiny8_mixtral : mixtral<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 96,
                                     .vocab = 500, .max_positions = 256, .experts = 8, .top_k = 2, .norm_topk = true}> {
  static constexpr std::string_view name = "tiny8-mixtral";
};
struct tiny8_qwen2_moe : qwen2_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                         .vocab = 500, .max_positions = 256, .qkv_bias = true, .experts = 8,
                                         .top_k = 3, .expert_ffn = 64, .shared_expert_ffn = 160}> {
  static constexpr std::string_view name = "tiny8-qwen2-moe";
};
struct tiny8_qwen3_moe : qwen3_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                         .vocab = 500, .head_dim = 48, .max_positions = 256, .experts = 8, .top_k = 2,
                                         .expert_ffn = 64, .norm_topk = true}> {
  static constexpr std::string_view name = "tiny8-qwen3-moe";
};

// Dense layers among the sparse ones: experts on the odd layers but layer 5, the dense MLP on the
// rest (Qwen's decoder_sparse_step 2 and mlp_only_layers [5]).
struct tiny8_qwen2_moe_mixed : qwen2_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                               .vocab = 500, .max_positions = 256, .qkv_bias = true, .experts = 8,
                                               .top_k = 3, .expert_ffn = 64, .shared_expert_ffn = 160,
                                               .sparse_step = 2, .dense_layers = 1 << 5}> {
  static constexpr std::string_view name = "tiny8-qwen2-moe-mixed";
};

// OLMoE's composition: full-width q/k norms (their squares summed over tp) and experts as wide as
// ffn in every layer, top 2 of 8 not renormalised.
struct tiny8_olmoe : olmoe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 4, .ffn = 64, .vocab = 500,
                                 .max_positions = 256, .experts = 8, .top_k = 2, .norm_topk = false}> {
  static constexpr std::string_view name = "tiny8-olmoe";
};

// GLM-4.5's composition: layer 0 dense, then DeepSeek-V3's router (sigmoid scores, an expert bias
// that selects, 8 experts in 4 groups of 2 with the best 2 kept, top 2 renormalised and scaled by
// 2.5) beside an ungated shared expert; q/k/v biases, RoPE on half of each head.
struct tiny8_glm4_moe : glm4_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                       .max_positions = 256, .qkv_bias = true, .rotary_fraction = 0.5, .experts = 8,
                                       .top_k = 2, .expert_ffn = 64, .shared_expert_ffn = 64, .norm_topk = true,
                                       .dense_layers = 1,
                                       .settings = settings_given({{"routed_scaling_factor", 2.5}, {"n_group", 4},
                                                                   {"topk_group", 2}})}> {
  static constexpr std::string_view name = "tiny8-glm4-moe";
};
// GLM-4.5 itself: the same with per-head q/k RMS norms before RoPE (use_qk_norm) and two dense layers.
struct tiny8_glm4_5 : glm4_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                     .max_positions = 256, .qkv_bias = true, .rotary_fraction = 0.5, .experts = 8,
                                     .top_k = 2, .expert_ffn = 64, .shared_expert_ffn = 64, .norm_topk = true,
                                     .dense_layers = 0b11,
                                     .settings = settings_given({{"use_qk_norm", 1}, {"routed_scaling_factor", 2.5}})}> {
  static constexpr std::string_view name = "tiny8-glm4-5";
};

// DeepSeek-V3's composition: multi-head latent attention (the query through rank 48, the kv through
// rank 64 and a shared 16-wide RoPE key on pairs, heads [nope 32 | rope 16], values 24), then
// GLM-4.5's mixture; and Moonlight's form with the query direct and RoPE on halves.
struct tiny8_deepseek_v3 : deepseek_v3<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 4, .ffn = 352, .vocab = 500,
                                             .head_dim = 16, .max_positions = 256, .rope_interleave = true, .experts = 8,
                                             .top_k = 2, .expert_ffn = 64, .shared_expert_ffn = 64, .norm_topk = true,
                                             .dense_layers = 1,
                                             .settings = settings_given({{"q_lora_rank", 48}, {"kv_lora_rank", 64},
                                                                         {"qk_nope_head_dim", 32}, {"v_head_dim", 24},
                                                                         {"routed_scaling_factor", 2.5}, {"n_group", 4},
                                                                         {"topk_group", 2}})}> {
  static constexpr std::string_view name = "tiny8-deepseek-v3";
};
struct tiny8_moonlight : deepseek_v3<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 4, .ffn = 352, .vocab = 500,
                                           .head_dim = 16, .max_positions = 256, .experts = 8, .top_k = 2, .expert_ffn = 64,
                                           .shared_expert_ffn = 128, .norm_topk = true, .dense_layers = 3,
                                           .settings = settings_given({{"q_lora_rank", 0}, {"kv_lora_rank", 64},
                                                                       {"qk_nope_head_dim", 32}, {"v_head_dim", 48},
                                                                       {"routed_scaling_factor", 1}, {"n_group", 1},
                                                                       {"topk_group", 1}})}> {
  static constexpr std::string_view name = "tiny8-moonlight";
};

// RoPE per layer type: the sliding (even) layers a plain RoPE of base 1e4, the full ones base 1e6
// linearly scaled by 4 (Gemma 3's composition: sandwich norms, per-head (1 + w) q/k norms), or
// YaRN (OLMo 3's: OLMo 2's blocks).
struct tiny8_gemma3 : gemma3<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                   .head_dim = 32, .max_positions = 256, .rope_theta = 1000000.0,
                                   .rope = {.type = rope_type::linear, .factor = 4.0}, .local_rope_theta = 10000.0,
                                   .tie_embeddings = true, .query_pre_attn_scalar = 24.0}> {
  static constexpr std::string_view name = "tiny8-gemma3";
  static constexpr std::int64_t window = 5;
};
struct tiny8_olmo3 : olmo3<shape{.hidden = 128, .layers = 8, .heads = 8, .kv_heads = 4, .ffn = 352, .vocab = 500,
                                 .max_positions = 256, .rope_theta = 500000.0,
                                 .rope = {.type = rope_type::yarn, .factor = 4.0, .original_max_positions = 16},
                                 .local_rope_theta = 10000.0}> {
  static constexpr std::string_view name = "tiny8-olmo3";
  static constexpr std::int64_t window = 5;
};

// EXAONE 4's composition: post norms, per-head q/k norms; the even layers slide with RoPE, the odd
// (full) layers have none.
struct tiny8_exaone4 : exaone4<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                     .head_dim = 32, .max_positions = 256, .rope_theta = 1000000.0, .nope_layers = 0xAA}> {
  static constexpr std::string_view name = "tiny8-exaone4";
  static constexpr std::int64_t window = 5;
};

// ERNIE 4.5's composition: the Llama blocks, RoPE on interleaved pairs, biases on q/k/v, o_proj and
// the MLP.
struct tiny8_ernie4_5 : ernie4_5<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                       .head_dim = 32, .max_positions = 256, .rope_theta = 500000.0, .qkv_bias = true,
                                       .tie_embeddings = true, .out_bias = true, .mlp_bias = true, .rope_interleave = true}> {
  static constexpr std::string_view name = "tiny8-ernie4_5";
};

// GLM-4's composition: a sandwich of norms under GLM's names, q/k/v biases, gate/up fused, RoPE on
// interleaved pairs of half of each head.
struct tiny8_glm4 : glm4<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                               .head_dim = 32, .max_positions = 256, .qkv_bias = true, .rotary_fraction = 0.5,
                               .rope_interleave = true}> {
  static constexpr std::string_view name = "tiny8-glm4";
};

// HunYuan dense's composition: per-head q/k norms after RoPE, biases on q/k/v and o_proj.
struct tiny8_hunyuan : hunyuan_dense<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                           .head_dim = 32, .max_positions = 256, .qkv_bias = true, .out_bias = true}> {
  static constexpr std::string_view name = "tiny8-hunyuan";
};

// Granite's multipliers, each away from its neutral value, on the Llama composition.
// Apertus: xIELU's scalars per layer (alpha_p, alpha_n summed over tp), q/k norms, all four biases, Llama 3's RoPE.
struct tiny8_apertus : apertus<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                     .max_positions = 256, .rope_theta = 10000.0,
                                     .rope = {.type = rope_type::llama3, .factor = 8.0, .low_freq_factor = 1.0,
                                              .high_freq_factor = 4.0, .original_max_positions = 64},
                                     .qkv_bias = true, .out_bias = true}> {
  static constexpr std::string_view name = "tiny8-apertus";
};

// gpt-oss's composition: a learned sink per query head, even layers sliding (window 5), YaRN, q/k/v
// and o biases; every layer 8 experts (top 2, a softmax over the two) with biases, the clamped
// SwiGLU with a limit low enough to cut.
struct tiny8_gpt_oss : gpt_oss<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 64, .vocab = 500,
                                     .head_dim = 32, .max_positions = 256, .rope_theta = 10000.0,
                                     .rope = {.type = rope_type::yarn, .factor = 4.0, .original_max_positions = 32,
                                              .beta_fast = 32.0, .beta_slow = 1.0, .truncate = false},
                                     .qkv_bias = true, .out_bias = true, .experts = 8, .top_k = 2, .norm_topk = true,
                                     .settings = settings_given({{"swiglu_limit", 0.5}})}> {
  static constexpr std::string_view name = "tiny8-gpt-oss";
  static constexpr std::int64_t window = 5;
};

// Llama 4's composition: layers 3 and 7 without RoPE (their q temperature-tuned from position 3 on),
// the others chunked by 5 with q/k L2 norms and RoPE on pairs; odd layers route (8 experts, top 2,
// each fed x * sigmoid(logit), beside the shared expert), even layers a dense SwiGLU; q/k/v and o
// biases.
struct tiny8_llama4 : llama4<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 96, .vocab = 500,
                                   .head_dim = 32, .max_positions = 256, .rope_theta = 10000.0, .qkv_bias = true,
                                   .out_bias = true, .rope_interleave = true, .experts = 8, .top_k = 2, .expert_ffn = 64,
                                   .shared_expert_ffn = 64, .sparse_step = 2,
                                   .nope_layers = (std::int64_t{1} << 3) | (std::int64_t{1} << 7),
                                   .settings = settings_given({{"attention_chunk_size", 5}, {"floor_scale", 4.0}, {"attn_scale", 0.3}})}> {
  static constexpr std::string_view name = "tiny8-llama4";
};

// Qwen3-Next's composition: gated DeltaNet layers (4 key heads of 32, each serving 2 value heads of
// 16, a conv of 4) with output-gated attention on layers 3 and 7 (zero-centred q/k norms, RoPE on a
// quarter of each head); every layer but layer 1 a mixture of 8 experts (top 2, renormalised)
// beside the shared expert behind its sigmoid gate.
struct tiny8_qwen3_next
    : qwen3_next<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 96, .vocab = 500, .head_dim = 32,
                       .max_positions = 256, .rope_theta = 10000.0, .rotary_fraction = 0.25, .experts = 8, .top_k = 2,
                       .expert_ffn = 64, .shared_expert_ffn = 96, .norm_topk = true, .dense_layers = 0b10,
                       .linear_layers = linear_every_but(8, 4),
                       .settings = settings_given({{"linear_num_key_heads", 4}, {"linear_num_value_heads", 8},
                                                   {"linear_key_head_dim", 32}, {"linear_value_head_dim", 16},
                                                   {"linear_conv_kernel_dim", 4}})}> {
  static constexpr std::string_view name = "tiny8-qwen3-next";
};

// Qwen3.5-MoE's composition: tiny8_qwen3_next's sizes with the DeltaNet's projections stored apart
// (in_proj_qkv's q, k and v slots each split over tp) and a mixture in every layer.
struct tiny8_qwen3_5_moe
    : qwen3_5_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 64, .vocab = 500, .head_dim = 32,
                        .max_positions = 256, .rope_theta = 10000.0, .rotary_fraction = 0.25, .experts = 8, .top_k = 2,
                        .expert_ffn = 64, .shared_expert_ffn = 96, .norm_topk = true,
                        .linear_layers = linear_every_but(8, 4),
                        .settings = settings_given({{"linear_num_key_heads", 2}, {"linear_num_value_heads", 4},
                                                    {"linear_key_head_dim", 32}, {"linear_value_head_dim", 16},
                                                    {"linear_conv_kernel_dim", 4}})}> {
  static constexpr std::string_view name = "tiny8-qwen3.5-moe";
};

// ERNIE 4.5 MoE's composition: layers 1-6 sparse (0 and 7 dense, as moe_layer_start_index 1 and
// moe_layer_end_index 6 say), ERNIE's router (softmax in fp32, an expert bias that selects, the top
// 2 of 8 renormalised) beside one ungated shared expert; RoPE on interleaved pairs; tied.
struct tiny8_ernie4_5_moe
    : ernie4_5_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                         .max_positions = 256, .rope_theta = 500000.0, .tie_embeddings = true, .rope_interleave = true,
                         .experts = 8, .top_k = 2, .expert_ffn = 64, .shared_expert_ffn = 64, .norm_topk = true,
                         .dense_layers = 0b10000001}> {
  static constexpr std::string_view name = "tiny8-ernie4.5-moe";
};
// ... and without shared experts (moe_num_shared_experts 0, as ERNIE-4.5-300B-A47B): no such rows.
struct tiny8_ernie4_5_moe_unshared
    : ernie4_5_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                         .max_positions = 256, .rope_theta = 500000.0, .rope_interleave = true, .experts = 8, .top_k = 2,
                         .expert_ffn = 64, .norm_topk = true, .dense_layers = 0b111}> {
  static constexpr std::string_view name = "tiny8-ernie4.5-moe-unshared";
};

struct tiny8_granite : granite<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                     .max_positions = 256, .qkv_bias = true, .tie_embeddings = true, .out_bias = true,
                                     .settings = settings_given({{"embedding_multiplier", 4.0}, {"residual_multiplier", 0.4},
                                                                 {"attention_multiplier", 0.125}, {"logits_scaling", 3.0}})}> {
  static constexpr std::string_view name = "tiny8-granite";
};

// Cohere2's composition: one bias-free LayerNorm for attention and MLP side by side, RoPE on pairs
// on the even (sliding) layers only, the logits scaled.
struct tiny8_cohere2 : cohere2<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                     .max_positions = 256, .rms_eps = 1e-5, .qkv_bias = true, .tie_embeddings = true,
                                     .out_bias = true, .rope_interleave = true, .nope_layers = 0xAA,
                                     .settings = settings_given({{"logit_scale", 0.25}})}> {
  static constexpr std::string_view name = "tiny8-cohere2";
  static constexpr std::int64_t window = 5;
};

// HunYuan MoE's composition: q/k norms after RoPE, every layer a softmax top-2 of 8 experts
// (renormalised) plus an ungated shared MLP, all of ffn.
struct tiny8_hunyuan_moe : hunyuan_moe<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 64, .vocab = 500,
                                             .head_dim = 32, .max_positions = 256, .qkv_bias = true, .out_bias = true,
                                             .experts = 8, .top_k = 2, .shared_expert_ffn = 64, .norm_topk = true}> {
  static constexpr std::string_view name = "tiny8-hunyuan-moe";
};

// Cohere's composition: Cohere2's layer with RoPE on pairs on every layer.
struct tiny8_cohere : cohere<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                   .max_positions = 256, .rms_eps = 1e-5, .tie_embeddings = true, .rope_interleave = true,
                                   .settings = settings_given({{"logit_scale", 0.25}})}> {
  static constexpr std::string_view name = "tiny8-cohere";
};

// Command R+'s attention on Cohere's layer: q and k LayerNorm-ed per head with a weight for every
// head (use_qk_norm), split over tp with the heads (at tp 4 each rank its kv group's k weight,
// replicated over 2 ranks); q/k/v and o_proj biases.
struct tiny8_cohere_plus : cohere<shape{.hidden = 128, .layers = 8, .heads = 8, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                        .max_positions = 256, .rms_eps = 1e-5, .qkv_bias = true, .tie_embeddings = true,
                                        .out_bias = true, .rope_interleave = true,
                                        .settings = settings_given({{"logit_scale", 0.25}, {"use_qk_norm", 1}})}> {
  static constexpr std::string_view name = "tiny8-cohere-plus";
};

// Seed-OSS's numbers: q/k/v biases without o_proj's, head_dim 48 != 128 / 4.
struct tiny8_seed_oss : seed_oss<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                       .head_dim = 48, .max_positions = 256, .qkv_bias = true}> {
  static constexpr std::string_view name = "tiny8-seed-oss";
};

// SmolLM3's composition: the odd layers without RoPE (two kinds of layer on every pp stage).
struct tiny8_smollm3 : smollm3<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352, .vocab = 500,
                                     .max_positions = 256, .tie_embeddings = true, .nope_layers = 0xAA}> {
  static constexpr std::string_view name = "tiny8-smollm3";
};

// A PPO-shaped global batch of 8 rows (prompt + response, left-padded).
rollout_batch make_rollout(std::int64_t vocab);

// Left- and right-padded rows, including a row with a single token.
struct padded_batch {
  at::Tensor ids, mask;
};
padded_batch make_batch(std::int64_t vocab, bool left_padding, std::uint64_t seed = 7);

// Every parameter of a model gathered to its HF tensors (values or gradients), keyed by HF name.
std::map<std::string, at::Tensor> gather_hf_tensors(std::vector<named_parameter>& params,
                                                    const runtime_config& c, const comm_group* tp,
                                                    bool gradients);

// A scalar that touches every output (so every gradient is exercised), with fixed weights.
at::Tensor probe_loss(const model_output& out, bool actor);

double max_abs_diff(const at::Tensor& a, const at::Tensor& b);

}  // namespace megadsl::test
