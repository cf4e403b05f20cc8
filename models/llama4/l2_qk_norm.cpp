// Llama 4's L2 q/k norm (blocks::l2_qk_norm, l2_qk_norm.hpp beside this file).
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/models/llama4/l2_qk_norm.hpp"

namespace megadsl {
namespace {

// Llama 4's L2 norm (Llama4TextL2Norm): each head's q and k over head_dim, x * rsqrt(mean(x^2) +
// eps) in fp32, no weight; before RoPE here (the rotation keeps a head's RMS, blocks::l2_qk_norm).
class l2_qk_norm final : public qk_norm_module {
 public:
  explicit l2_qk_norm(const block_build& b) : eps_(b.s().rms_eps.get()) {}
  void apply(at::Tensor& q, at::Tensor& k, layer_context&) const override {
    q = norm(q);  // (T, G, Q, d)
    k = norm(k);  // (T, G, d)
  }

 private:
  at::Tensor norm(const at::Tensor& x) const {
    const at::Tensor xf = x.to(at::kFloat);
    return (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps_)).to(x.scalar_type());
  }
  double eps_;
};

}  // namespace

std::unique_ptr<block_module> modules::l2_qk_norm(const block_build& b) { return std::make_unique<megadsl::l2_qk_norm>(b); }

}  // namespace megadsl
