// Mistral 7B (v0.1) as a strong preset type: the Llama architecture with GQA and a 32k context.
//
// Its sliding-window attention (4096) does not change any shape, shard or formula here; attention
// kernels that honour it are the runtime's business.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule mistral_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"sliding_window", key_use::read},
    {"layer_types", key_use::no_effect},  // MistralModel slides every layer whatever it says
};
inline constexpr family_config mistral_config{
    .model_type = "mistral", .hf_class = "Mistral", .display = "Mistral",
    .arch = &architecture_of<llama_blocks>, .max_positions = 4096 * 32, .rms_eps = 1e-6,
    .window = window_rule::every_layer, .keys = mistral_keys};

// Mistral: the Llama composition (its sliding window comes with the checkpoint's config.json).
template <shape S>
struct mistral : decoder_family<llama_blocks, S> {
  static constexpr std::string_view family = mistral_config.model_type;
  static constexpr std::string_view name = "mistral";
};

struct mistral_7b : mistral<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8,
                                .ffn = 14336, .vocab = 32000, .max_positions = 32768,
                                .rms_eps = 1e-5, .rope_theta = 10000.0}> {
  static constexpr std::string_view name = "mistral-7b";
  static constexpr std::string_view hf_repo = "mistralai/Mistral-7B-v0.1";
  static constexpr std::int64_t published_params = 7'241'732'096;
};

}  // namespace megadsl
