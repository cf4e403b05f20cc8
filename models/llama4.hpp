// Meta's Llama 4 (text) as strong preset types: pre-norm layers of two attentions and two MLPs,
// chosen per layer from config.json. The RoPE layers (no_rope_layers 1; all but every fourth by
// default) rotate pairs of each head, norm q and k per head without a weight (use_qk_norm) and
// attend within chunks of attention_chunk_size tokens; the NoPE layers attend over the whole
// causal prefix with q scaled by ln(position) (attention temperature tuning). Every
// interleave_moe_layer_step-th layer (or those moe_layers lists) has the mixture: the top-k of the
// router's logits, each chosen expert fed the token times sigmoid(logit), its experts stacked as
// transformers stores them, beside an ungated shared expert; the others a SwiGLU of
// intermediate_size_mlp. Both MLPs sit under HF's `feed_forward`.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/llama4/input_sigmoid_router.hpp"
#include "megadsl/models/llama4/l2_qk_norm.hpp"
#include "megadsl/models/qwen_moe.hpp"  // qwen_sparse_layer: the same rule for which layers route
#include "megadsl/shape.hpp"

namespace megadsl {

// use_qk_norm (Llama4TextConfig's, tested for truth: null is off) picks the RoPE layers' attention
// with or without the q/k L2 norm.
inline constexpr config_setting llama4_use_qk_norm[] = {
    {.key = "use_qk_norm", .fallback = 1, .kind = setting_kind::truthy,
     .meaning = "the RoPE layers L2-norm q and k per head, without a weight"}};

// Layer i's kind: its attention (0 RoPE with the q/k norm, 1 RoPE without, 2 NoPE) plus 3 where
// it routes.
constexpr int llama4_layer(const shape& s, std::int64_t layer) {
  const int attention = nope_layer(s, layer) ? 2 : setting(s, "use_qk_norm") != 0 ? 0 : 1;
  return attention + 3 * qwen_sparse_layer(s, layer);
}
inline constexpr blocks::layer_choice llama4_choice{&llama4_layer, llama4_use_qk_norm};

// The layer_types entry of layer i (config.json's, where given, must say it): the RoPE layers chunk.
constexpr std::string_view llama4_layer_type(const shape& s, std::int64_t layer) {
  return nope_layer(s, layer) ? "full_attention" : "chunked_attention";
}

using llama4_rope_attention = blocks::attention<blocks::attention_knobs{.chunked = true}, blocks::l2_qk_norm>;
using llama4_rope_attention_unnormed = blocks::attention<blocks::attention_knobs{.chunked = true}>;
using llama4_nope_attention = blocks::attention<blocks::attention_knobs{.rope = false, .temperature = true}>;
using llama4_dense_mlp = blocks::gated_mlp<activation::silu, tensor_storage::separate, blocks::feed_forward_module>;
// Its mixture under feed_forward: the router on the experts' input, the experts stacked as
// transformers stores them (gate_up_proj (E, h, 2 f) with [gate | up] columns, down_proj (E, f, h)),
// the ungated shared_expert.
inline constexpr blocks::router_names llama4_router{.weight = "router.weight"};
inline constexpr blocks::stacked_expert_names llama4_experts{};
inline constexpr blocks::shared_expert_names llama4_shared_expert{};
inline constexpr blocks::mixture_names llama4_mixture_names{.module = "feed_forward", .signature = "llama4"};
using llama4_moe = blocks::moe<blocks::input_sigmoid_router<llama4_router>, blocks::stacked_experts<activation::silu, llama4_experts>,
                               blocks::shared_expert<llama4_shared_expert>, llama4_mixture_names>;

template <class Attention, class Mlp>
using llama4_block = blocks::block<blocks::pre_norm<blocks::rms_norm<>, Attention>, blocks::pre_norm<blocks::rms_norm<>, Mlp>>;

using llama4_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::select<&llama4_choice, llama4_block<llama4_rope_attention, llama4_dense_mlp>,
                   llama4_block<llama4_rope_attention_unnormed, llama4_dense_mlp>, llama4_block<llama4_nope_attention, llama4_dense_mlp>,
                   llama4_block<llama4_rope_attention, llama4_moe>, llama4_block<llama4_rope_attention_unnormed, llama4_moe>,
                   llama4_block<llama4_nope_attention, llama4_moe>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

// Experts and the shared expert of intermediate_size, the dense layers' MLP of
// intermediate_size_mlp; top 1 by default, never renormalised (each weight is its own sigmoid).
inline constexpr moe_config llama4_moe_config{.count_key = "num_local_experts", .top_k = 1, .reads_norm_topk = false,
                                              .expert_ffn = 8192, .expert_ffn_key = "intermediate_size",
                                              .shared_as_wide_as_experts = true,
                                              .sparse_step_key = "interleave_moe_layer_step", .sparse_layers_key = "moe_layers"};
inline constexpr config_key_rule llama4_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},  // q/k/v and o_proj biases
    {"intermediate_size_mlp", key_use::read},
    {"num_local_experts", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"interleave_moe_layer_step", key_use::read},
    {"moe_layers", key_use::read},
    {"no_rope_layers", key_use::read},
    {"no_rope_layer_interval", key_use::read},
    {"layer_types", key_use::read},
    // attention_chunk_size, attn_temperature_tuning, floor_scale and attn_scale: the attention
    // blocks' own keys (blocks/attention.hpp); use_qk_norm: the layer choice's (above).
    // Llama4Router never reads it (no jitter in transformers' Llama 4).
    {"router_jitter_noise", key_use::no_effect},
    {"router_aux_loss_coef", key_use::no_effect},  // megadsl's own model_options::moe_aux_loss_coeff
    {"output_router_logits", key_use::no_effect},
    {"for_llm_compressor", key_use::no_effect},    // early Hub configs' flag for a quantization tool
};
inline constexpr family_config llama4_config{
    .model_type = "llama4_text", .hf_class = "Llama4", .display = "Llama 4 (text)",
    .arch = &architecture_of<llama4_blocks>, .max_positions = 131072, .rms_eps = 1e-5, .rope_theta = 500000.0,
    .head_dim = 128, .ffn_key = "intermediate_size_mlp", .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .reads_no_rope_layers = true,
    .empty_no_rope_is_default = true, .layer_type = &llama4_layer_type, .interleaved_rope = true, .moe = &llama4_moe_config,
    .keys = llama4_keys, .multimodal = {"llama4", "Llama4ForConditionalGeneration", false}};

// Llama 4 (text): chunked RoPE layers with the q/k L2 norm, temperature-tuned NoPE layers, dense
// and sparse layers interleaved.
template <shape S>
struct llama4 : decoder_family<llama4_blocks, S> {
  static constexpr std::string_view family = llama4_config.model_type;
  static constexpr std::string_view name = "llama4";
};

// The published models' text shape: 48 layers of 40 query heads of 128 over 8 kv heads, every
// fourth layer (3, 7, ..., 47) without RoPE, chunks of 8192, temperature tuning (8192, 0.1),
// experts and the shared expert of 8192, dense layers of 16384, top 1, vocab 202048, untied.
constexpr shape llama4_with(std::int64_t experts, std::int64_t sparse_step, bool qk_norm, rope_scaling rope,
                            std::int64_t max_positions) {
  shape s{.hidden = 5120, .layers = 48, .heads = 40, .kv_heads = 8, .ffn = 16384, .vocab = 202048, .head_dim = 128,
          .max_positions = max_positions, .rms_eps = 1e-5, .rope_theta = 500000.0, .rope = rope,
          .rope_interleave = true, .experts = experts, .top_k = 1, .expert_ffn = 8192, .shared_expert_ffn = 8192,
          .sparse_step = sparse_step};
  // attention_chunk_size 8192, attn_temperature_tuning on with floor_scale 8192 and attn_scale 0.1:
  // the blocks' defaults.
  if (!qk_norm) s.settings = settings_given({{"use_qk_norm", 0}});
  for (std::int64_t i = 3; i < 48; i += 4) s.nope_layers = s.nope_layers.get() | (std::int64_t{1} << i);
  return s;
}

// Llama-4-Scout-17B-16E (its text model): 16 experts in every layer, the q/k norm, llama3 RoPE
// scaling x16 over 8192 positions. The count is the text model's (Llama4ForCausalLM), without the
// vision tower of the published multimodal checkpoint.
struct llama4_scout : llama4<llama4_with(16, 1, true,
                                         rope_scaling{.type = rope_type::llama3, .factor = 16.0, .low_freq_factor = 1.0,
                                                      .high_freq_factor = 1.0, .original_max_positions = 8192},
                                         10485760)> {
  static constexpr std::string_view name = "llama4-scout";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-4-Scout-17B-16E";
  static constexpr std::int64_t published_params = 107'769'861'120;
};

// Llama-4-Maverick-17B-128E (its text model): 128 experts on every other layer (1, 3, ..., 47),
// dense layers of 16384 between, no q/k norm, no RoPE scaling, 1,048,576 positions: the text config
// TensorRT-LLM's tests carry as Maverick's; transformers' Llama4ForCausalLM of it counts 400.7B,
// the "400B total" Meta publishes (the vision tower of the multimodal checkpoint not counted).
struct llama4_maverick : llama4<llama4_with(128, 2, false, rope_scaling{}, 1048576)> {
  static constexpr std::string_view name = "llama4-maverick";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-4-Maverick-17B-128E";
  static constexpr std::int64_t published_params = 400'711'848'960;
};

}  // namespace megadsl
