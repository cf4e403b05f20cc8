// OLMo 2 as strong preset types: the olmo2 composition (norms after each sublayer, full-width q/k
// RMSNorm, (w * x) norm cast order), multi-head attention, untied embeddings.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using olmo2_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::post_norm<blocks::rms_norm<norm_kind::rms_wmul>, blocks::attention<blocks::attention_knobs{}, blocks::full_width_qk_norm<blocks::rms_norm<norm_kind::rms_wmul>>>>,
                  blocks::post_norm<blocks::rms_norm<norm_kind::rms_wmul>, blocks::gated_mlp<activation::silu>>>,
    blocks::rms_norm<norm_kind::rms_wmul>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule olmo2_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},
};
inline constexpr family_config olmo2_config{
    .model_type = "olmo2", .hf_class = "Olmo2", .display = "OLMo2",
    .arch = &architecture_of<olmo2_blocks>, .max_positions = 2048, .rms_eps = 1e-5,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key}, .keys = olmo2_keys};

// OLMo2: norms after each sublayer (before the residual add), full-width q/k norms, (w * x) norms.
template <shape S>
struct olmo2 : decoder_family<olmo2_blocks, S> {
  static constexpr std::string_view family = olmo2_config.model_type;
  static constexpr std::string_view name = "olmo2";
};

struct olmo2_7b : olmo2<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 32, .ffn = 11008,
                              .vocab = 100352, .max_positions = 4096, .rms_eps = 1e-6,
                              .rope_theta = 500000.0}> {
  static constexpr std::string_view name = "olmo2-7b";
  static constexpr std::string_view hf_repo = "allenai/OLMo-2-1124-7B";
  static constexpr std::int64_t published_params = 7'298'617'344;
};

}  // namespace megadsl
