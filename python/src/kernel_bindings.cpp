// megadsl's kernels that a block is built of, callable on their own (benchmarks against
// transformers' functions, and the tests that hold them to those): megadsl._C.kernels.
#include <torch/extension.h>

#include "bindings.hpp"
#include "megadsl/layers/gated_delta_rule.hpp"

namespace megadsl::python {

void bind_kernels(pybind11::module_& m) {
  auto k = m.def_submodule("kernels", "megadsl's kernels on their own (local math: no collective)");
  k.def("chunk_gated_delta_rule", &chunk_gated_delta_rule, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("g"), pybind11::arg("beta"), pybind11::arg("chunk") = 64,
        R"(The gated delta rule in chunked form (Qwen3-Next's linear attention), differentiable: q, k (B, L, Hk, dk),
v (B, L, Hv, dv), g (log decay) and beta (B, L, Hv); q and k L2-normed and q scaled by dk^-1/2 inside, as
transformers' torch_chunk_gated_delta_rule(..., use_qk_l2norm_in_kernel=True). Returns (B, L, Hv, dv).)");
  k.def("recurrent_gated_delta_rule", &recurrent_gated_delta_rule, pybind11::arg("q"), pybind11::arg("k"),
        pybind11::arg("v"), pybind11::arg("g"), pybind11::arg("beta"),
        "The same rule token by token (the oracle of the chunked form).");
  k.def("causal_conv1d_silu", &causal_conv1d_silu, pybind11::arg("x"), pybind11::arg("w"),
        "SiLU of a causal depthwise conv: x (B, L, C), w (C, K), zero history.");
}

}  // namespace megadsl::python
