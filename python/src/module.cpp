// `megadsl._C`: the compiled half of the Python package (python/megadsl/__init__.py imports torch
// first, so that torch's tensor type is registered before any binding converts one).
#include "bindings.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "megadsl: Transformer models with their parallel layout, run on LibTorch (compiled part)";
  megadsl::python::bind_spec(m);
  megadsl::python::bind_distributed(m);
  megadsl::python::bind_model(m);
  megadsl::python::bind_losses(m);
  megadsl::python::bind_kernels(m);
  megadsl::python::bind_schedule(m);
}
