// The pieces of the `megadsl._C` extension module, each defined in the file named after it.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "megadsl/layout.hpp"

namespace megadsl::python {

void bind_spec(pybind11::module_& m);         // spec_bindings.cpp: Layout, check, describe, plan, presets
void bind_distributed(pybind11::module_& m);  // distributed_bindings.cpp: init, shutdown, rank, world_size
void bind_model(pybind11::module_& m);        // model_bindings.cpp: Model, Trainer

// "none" | "selective" | "full" (a ValueError otherwise); spec_bindings.cpp.
recompute_kind recompute_of(const std::string& name);

}  // namespace megadsl::python
