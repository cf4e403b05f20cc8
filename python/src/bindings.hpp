// The pieces of the `megadsl._C` extension module, each defined in the file named after it.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "megadsl/dropout.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/runtime/trainer.hpp"

namespace megadsl::python {

void bind_spec(pybind11::module_& m);         // spec_bindings.cpp: Layout, check, describe, plan, presets
void bind_distributed(pybind11::module_& m);  // distributed_bindings.cpp: init, shutdown, rank, world_size
void bind_model(pybind11::module_& m);        // model_bindings.cpp: Model, Trainer
void bind_losses(pybind11::module_& m);       // loss_bindings.cpp: policy_loss, actor_loss, value_loss, kl_penalty
void bind_kernels(pybind11::module_& m);      // kernel_bindings.cpp: kernels.chunk_gated_delta_rule, ...
void bind_schedule(pybind11::module_& m);     // schedule_bindings.cpp: LrScheduler (Megatron's)

// What Model.trainer() and the loss functions take as keywords (verl's names); an unknown keyword
// or a bad value is one line (TypeError / ValueError) naming it. loss_bindings.cpp.
struct loss_options {
  optimizer_config opt;
  actor_loss_config actor;
  critic_loss_config critic;
};
loss_options loss_options_of(const pybind11::kwargs& kwargs, const char* where, bool with_optimizer);

// "none" | "selective" | "full" (a ValueError otherwise); spec_bindings.cpp.
recompute_kind recompute_of(const std::string& name);
cp_comm_kind cp_comm_of(const std::string& name);

// {"attention": ..., "residual": ..., "embedding": ...}; spec_bindings.cpp.
pybind11::dict dict_of(const dropout_rates& r);

}  // namespace megadsl::python
