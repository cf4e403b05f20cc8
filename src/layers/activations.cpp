// The MLPs' activations, each a plain function a gated or plain MLP block is given.
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/fused_ops.hpp"
#include "megadsl/layers/invariant.hpp"

namespace megadsl {

at::Tensor silu_activation(const at::Tensor& x) { return at::silu(x); }
at::Tensor gelu_tanh_activation(const at::Tensor& x) { return at::gelu(x, "tanh"); }
at::Tensor gelu_activation(const at::Tensor& x) { return at::gelu(x); }

// The function of architecture.hpp's `activation`, as an MLP block's knobs name it (xIELU, with
// learned scalars, is its own block's).
activation_fn activation_fn_of(activation a) {
  switch (a) {
    case activation::silu: return silu_activation;
    case activation::gelu_tanh: return gelu_tanh_activation;
    case activation::gelu: return gelu_activation;
    case activation::xielu: break;
  }
  throw std::logic_error("megadsl: an MLP block's knobs name the activation " + std::string(name_of(a)) +
                         ", which only its own block (xielu_mlp) computes");
}

at::Tensor gated(const at::Tensor& gate_up, activation_fn act) {
  if (act == silu_activation && fused_kernels_take(gate_up)) return fused_swiglu(gate_up);  // bf16 on CUDA
  const auto halves = gate_up.chunk(2, -1);
  return pointwise(halves[0], act) * halves[1];
}

// gpt-oss's (GptOssExperts._apply_gate), in its order: the gate clamped from above, up from both
// sides, (up + 1) * (gate * sigmoid(alpha * gate)).
at::Tensor clamped_swiglu(const at::Tensor& gate_up, double alpha, double limit) {
  const auto halves = gate_up.chunk(2, -1);
  const at::Tensor gate = at::clamp_max(halves[0], limit), up = at::clamp(halves[1], -limit, limit);
  return (up + 1) * (gate * pointwise(gate * alpha, [](const at::Tensor& t) { return at::sigmoid(t); }));
}

}  // namespace megadsl
