// The xIELU MLP, down(xielu(up x)) (Apertus): up column-parallel, down row-parallel; xIELU's
// scalars as XIELUActivation's Python path computes them (the path transformers takes without its
// optional CUDA kernel).
#include <ATen/ATen.h>

#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/models/apertus/xielu_mlp.hpp"

namespace megadsl {
namespace {

class xielu_mlp final : public layer_module {
 public:
  explicit xielu_mlp(const block_build& b)
      : up_(b.require("up.weight")), down_(b.require("down.weight")), alpha_p_(b.require("act.alpha_p")),
        alpha_n_(b.require("act.alpha_n")), beta_(b.require("act.beta")), eps_(b.require("act.eps")) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor u = c.column(x, up_);  // (T', ffn/tp)
    // beta and eps are HF's buffers: fixed, outside the gradient.
    const at::Tensor beta = c.w(beta_).detach(), eps = c.w(eps_).detach();  // (1)
    const at::Tensor alpha_p = at::softplus(c.w(alpha_p_));                   // (1)
    const at::Tensor alpha_n = beta + at::softplus(c.w(alpha_n_));
    const at::Tensor y = at::where(u > 0, alpha_p * u * u + beta * u,
                                   (pointwise(at::minimum(u, eps), [](const at::Tensor& t) { return at::expm1(t); }) - u) * alpha_n + beta * u);
    return c.row(y, down_);  // (T'/tp or T', h)
  }

 private:
  at::Tensor up_;    // (ffn/tp, h)
  at::Tensor down_;  // (h, ffn/tp)
  at::Tensor alpha_p_, alpha_n_, beta_, eps_;  // (1) each, replicated
};

}  // namespace

std::unique_ptr<block_module> modules::xielu_mlp(const block_build& b) { return std::make_unique<megadsl::xielu_mlp>(b); }

}  // namespace megadsl
