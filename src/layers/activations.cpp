// The MLPs' activations, each a plain function a gated or plain MLP block is given.
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"

namespace megadsl {

at::Tensor silu_activation(const at::Tensor& x) { return at::silu(x); }
at::Tensor gelu_tanh_activation(const at::Tensor& x) { return at::gelu(x, "tanh"); }
at::Tensor gelu_activation(const at::Tensor& x) { return at::gelu(x); }

at::Tensor gated(const at::Tensor& gate_up, activation_fn act) {
  const auto halves = gate_up.chunk(2, -1);
  return act(halves[0]) * halves[1];
}

}  // namespace megadsl
