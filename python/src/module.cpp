// `megadsl._C`: the compiled half of the Python package (python/megadsl/__init__.py imports torch
// first, so that torch's tensor type is registered before any binding converts one).
#include "bindings.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/require_valid.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "megadsl: Transformer models with their parallel layout, run on LibTorch (compiled part)";
  // The library's error types, as subclasses of the built-ins they were raised as before.
  pybind11::register_exception<megadsl::config_error>(m, "ConfigError", PyExc_ValueError);
  pybind11::register_exception<megadsl::layout_error>(m, "LayoutError", PyExc_ValueError);
  pybind11::register_exception<megadsl::checkpoint_error>(m, "CheckpointError", PyExc_RuntimeError);
  megadsl::python::bind_spec(m);
  megadsl::python::bind_distributed(m);
  megadsl::python::bind_model(m);
  megadsl::python::bind_losses(m);
  megadsl::python::bind_kernels(m);
  megadsl::python::bind_schedule(m);
}
