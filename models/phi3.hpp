// Phi-3 as strong preset types: the phi3 composition (the Llama blocks, with HF's q/k/v stored as
// one qkv_proj tensor and gate/up as one gate_up_proj tensor, rows concatenated).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using phi3_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::pre_norm<blocks::rms_norm<>, blocks::attention<blocks::attention_knobs{.storage = tensor_storage::concatenated}>>,
                  blocks::pre_norm<blocks::rms_norm<>, blocks::gated_mlp<activation::silu, tensor_storage::concatenated>>>,
    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule phi3_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"sliding_window", key_use::read},
    {"embd_pdrop", key_use::no_effect, "transformers' Phi-3 applies no embedding dropout"},
    {"partial_rotary_factor", key_use::read},  // 4.x's place for it
    {"original_max_position_embeddings", key_use::no_effect},  // read by longrope only (refused)
};
inline constexpr dropout_key phi3_dropouts[] = {{.key = "resid_pdrop", .residual = true}};  // after each sublayer
inline constexpr family_config phi3_config{
    .model_type = "phi3", .hf_class = "Phi3", .display = "Phi-3",
    .arch = &architecture_of<phi3_blocks>, .max_positions = 4096, .rms_eps = 1e-5,
    .partial_rotary_key = "partial_rotary_factor", .window = window_rule::every_layer, .dropouts = phi3_dropouts, .keys = phi3_keys};

// Phi-3: the Llama blocks, with HF's q/k/v and gate/up each stored as one concatenated tensor.
template <shape S>
struct phi3 : decoder_family<phi3_blocks, S> {
  static constexpr std::string_view family = phi3_config.model_type;
  static constexpr std::string_view name = "phi3";
};

// The 4k-context model (its config.json's sliding_window 2047 becomes model_options::attention_window
// when loaded from the checkpoint; the 128k variants' longrope scaling is refused).
struct phi3_mini : phi3<shape{.hidden = 3072, .layers = 32, .heads = 32, .kv_heads = 32, .ffn = 8192,
                              .vocab = 32064, .max_positions = 4096, .rms_eps = 1e-5, .rope_theta = 10000.0}> {
  static constexpr std::string_view name = "phi3-mini";
  static constexpr std::string_view hf_repo = "microsoft/Phi-3-mini-4k-instruct";
  static constexpr std::int64_t published_params = 3'821'079'552;
};

}  // namespace megadsl
