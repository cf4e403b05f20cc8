// Norms: rms_norm<rms | rms_1p | rms_wmul>, layer_norm, layer_norm_no_bias.
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// ---- norms ----------------------------------------------------------------------------------------

template <norm_kind K = norm_kind::rms>
struct rms_norm {
  static constexpr std::string_view label = K == norm_kind::rms ? "rms_norm<rms>" : K == norm_kind::rms_1p ? "rms_norm<rms_1p>" : "rms_norm<rms_wmul>";
  static constexpr module_factory module = K == norm_kind::rms      ? &modules::rms_norm
                                           : K == norm_kind::rms_1p ? &modules::rms_norm_1p
                                                                    : &modules::rms_norm_wmul;
  static constexpr param_init init = K == norm_kind::rms_1p ? param_init::zeros : param_init::ones;  // (1 + w): zero-centred
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.costs(b.leaf(at, std::array{block_param{"weight", &geo::hidden, {"weight"}, 1, presence::always, false, false, init}},
                          module, label),
                   {.whole = 2});  // its input
  }
};

// LayerNorm with a weight and a bias (StarCoder2, GPT-NeoX).
struct layer_norm {
  static constexpr std::string_view label = "layer_norm (+ bias)";
  static constexpr module_factory module = &modules::layer_norm;
  static constexpr param_init init = param_init::ones;
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.costs(b.leaf(at, std::array{block_param{"weight", &geo::hidden, {"weight"}, 1, presence::always, false, false,
                                                     param_init::ones},
                                         block_param{"bias", &geo::hidden, {"bias"}, 1, presence::always, false, false, param_init::zeros}},
                          module, "layer_norm", label),
                   {.whole = 2});  // its input
  }
};

// LayerNorm without a bias, in fp32 with its weight (CohereLayerNorm).
struct layer_norm_no_bias {
  static constexpr std::string_view label = "layer_norm_no_bias (fp32)";
  static constexpr module_factory module = &modules::layer_norm_no_bias;
  static constexpr param_init init = param_init::ones;
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.costs(b.leaf(at, std::array{block_param{"weight", &geo::hidden, {"weight"}, 1, presence::always, false, false,
                                                     param_init::ones}},
                          module, "layer_norm_no_bias", label),
                   {.whole = 2});  // its input
  }
};

}  // namespace megadsl::blocks
