// A model's layers as modules: the family's composition of blocks (its shape's block knobs,
// layers/blocks.hpp), turned into each layer's module tree once, when the stage is built. The
// stage then runs one module per layer and knows no block kind.
#pragma once

#include <cstdint>
#include <memory>

#include "megadsl/layers/module.hpp"

namespace megadsl {

struct layer_plan_args {
  const shape& s;
  const layout& l;
  const model_options& options;
  std::int64_t tp_rank = 0;
  std::int64_t first_expert = 0, experts_per_rank = 0;  // this ep rank's experts of a mixture
};

// Layer `p.layer`: its residual combinator around its norms, attention and MLP.
std::unique_ptr<layer_module> build_layer(const module_params& p, const layer_plan_args& a);
// The final norm (final_norm.weight, .bias).
std::unique_ptr<layer_module> build_final_norm(const module_params& p, const shape& s);
// The token embedding over this rank's vocabulary rows.
std::unique_ptr<layer_module> build_embedding(const at::Tensor& weight, const shape& s);
// Whether the norms' weights start at 0 (a (1 + w) norm, Gemma's zero-centred weights), not 1.
bool zero_centred_norms(const shape& s);
// The top-k slots of the routing the model records (0: no layer routes tokens to experts).
std::int64_t routing_slots(const shape& s);

}  // namespace megadsl
