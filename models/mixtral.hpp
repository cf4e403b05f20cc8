// Mixtral as strong preset types: the Llama composition with a mixture of eight gated experts in
// place of the MLP (top 2, renormalised), under Mixtral's HF names (block_sparse_moe.*).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Its mixture's HF names: block_sparse_moe.gate, block_sparse_moe.experts.E.{w1, w3, w2}.
inline constexpr blocks::mixture_names mixtral_mixture{.module = "block_sparse_moe", .signature = "mixtral"};
inline constexpr blocks::expert_names mixtral_expert_names{"experts.{expert}.w1.weight", "experts.{expert}.w3.weight",
                                                           "experts.{expert}.w2.weight"};
using mixtral_mixture_block =
    blocks::moe<blocks::softmax_router<>, blocks::experts<activation::silu, mixtral_expert_names>, blocks::no_shared_expert,
                mixtral_mixture>;

using mixtral_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>, blocks::attention<>>, blocks::pre_norm<blocks::rms_norm<>, mixtral_mixture_block>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr moe_config mixtral_moe{.count_key = "num_local_experts", .reads_both_counts = true, .top_k = 2,
                                        .experts_as_wide_as_ffn = true, .reads_norm_topk = false};
inline constexpr config_key_rule mixtral_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"num_experts_per_tok", key_use::read},
    {"num_local_experts", key_use::read},
    {"num_experts", key_use::read},
    {"router_jitter_noise", key_use::refused},  // training-time noise on the router's input
    // The load-balancing loss's weight and whether HF returns the router logits: the trainer's
    // business (its own coefficient), not the log-probs'.
    {"router_aux_loss_coef", key_use::no_effect},
    {"output_router_logits", key_use::no_effect},
    {"sliding_window", key_use::read},
    {"layer_types", key_use::no_effect},  // its attention slides every layer whatever it says
};
inline constexpr family_config mixtral_config{
    .model_type = "mixtral", .hf_class = "Mixtral", .display = "Mixtral",
    .arch = &architecture_of<mixtral_blocks>, .max_positions = 4096 * 32, .rms_eps = 1e-5, .rope_theta = 1000000.0,
    .window = window_rule::every_layer, .moe = &mixtral_moe, .keys = mixtral_keys};

// Mixtral: each expert is intermediate_size wide (expert_ffn 0 = ffn); the top-k weights are
// always renormalised (MixtralConfig has no norm_topk_prob).
template <shape S>
struct mixtral : decoder_family<mixtral_blocks, S> {
  static constexpr std::string_view family = mixtral_config.model_type;
  static constexpr std::string_view name = "mixtral";
};

struct mixtral_8x7b : mixtral<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8, .ffn = 14336,
                                    .vocab = 32000, .max_positions = 32768, .rms_eps = 1e-5,
                                    .rope_theta = 1000000.0, .experts = 8, .top_k = 2, .norm_topk = true}> {
  static constexpr std::string_view name = "mixtral-8x7b";
  static constexpr std::string_view hf_repo = "mistralai/Mixtral-8x7B-v0.1";
  static constexpr std::int64_t published_params = 46'702'792'704;
};

}  // namespace megadsl
