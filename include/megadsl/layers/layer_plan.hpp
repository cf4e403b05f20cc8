// A model's layers as modules: each layer's kind of the architecture (architecture.hpp) built into
// its module tree once, when the stage is built, by calling the factory of each node. The stage
// then runs one module per layer and knows no block kind.
#pragma once

#include <cstdint>
#include <memory>

#include "megadsl/layers/module.hpp"

namespace megadsl {

// Layer `p.layer`: its kind's tree (its residual combinators around its norms, attention and MLP).
std::unique_ptr<layer_module> build_layer(const module_params& p, const layer_plan_args& a);
// The final norm (final_norm.weight, ...) and the token embedding over this rank's vocabulary rows.
std::unique_ptr<layer_module> build_final_norm(const module_params& p, const layer_plan_args& a);
std::unique_ptr<layer_module> build_embedding(const module_params& p, const layer_plan_args& a);
// The top-k slots of the routing the model records (0: no layer routes tokens to experts).
std::int64_t routing_slots(const shape& s);

}  // namespace megadsl
