// What the library's block modules share across their source files. Each block's module class
// and factory live in the block's own file under src/layers/ (factories declared torch-free in
// layers/block_factories.hpp, so that block types can name them); a user's block does the same in
// its own files (layers/module.hpp).
#pragma once

#include <cstdint>
#include <memory>

#include "megadsl/layers/block_factories.hpp"
#include "megadsl/layers/module.hpp"

namespace megadsl {

// ---- activations (src/layers/activations.cpp) ----
at::Tensor silu_activation(const at::Tensor& x);
at::Tensor gelu_tanh_activation(const at::Tensor& x);
at::Tensor gelu_activation(const at::Tensor& x);  // exact (erf)
// The function of an MLP block's activation (its node's setting).
activation_fn activation_fn_of(activation a);
// act(gate) * up on a fused [gate ; up] projection output (T, 2f) -> (T, f).
at::Tensor gated(const at::Tensor& gate_up, activation_fn act);
// gpt-oss's clamped SwiGLU on [gate ; up] (T, 2f) -> (T, f): gate <= limit, up in [-limit, limit],
// (up + 1) * gate * sigmoid(alpha * gate).
at::Tensor clamped_swiglu(const at::Tensor& gate_up, double alpha, double limit);

// ---- q/k norms before RoPE (src/layers/qk_norms.cpp): an attention block's child ----
// Applied to q (T, G, Q, d) and k (T, G, d) of this rank's heads.
class qk_norm_module : public block_module {
 public:
  virtual void apply(at::Tensor& q, at::Tensor& k, layer_context& c) const = 0;
  // Applied to the rotated q and k (HunYuan), not before RoPE.
  [[nodiscard]] virtual bool after_rope() const { return false; }
};

}  // namespace megadsl
