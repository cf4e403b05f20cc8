// Q/K norms before RoPE: per head over head_dim (Qwen3) or over the full projection width
// (OLMo2), each with the layer's kind of norm.
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/parallel/mappings.hpp"

namespace megadsl {
namespace {

class per_head_qk_norm final : public qk_norm_module {
 public:
  per_head_qk_norm(std::unique_ptr<norm_module> q, std::unique_ptr<norm_module> k) : q_(std::move(q)), k_(std::move(k)) {}
  void apply(at::Tensor& q, at::Tensor& k, layer_context& c) const override {
    q = q_->forward(q, c);  // (T, G, Q, d), a (d) weight
    k = k_->forward(k, c);  // (T, G, d)
  }

 private:
  std::unique_ptr<norm_module> q_, k_;
};

class full_width_qk_norm final : public qk_norm_module {
 public:
  full_width_qk_norm(std::unique_ptr<norm_module> q, std::unique_ptr<norm_module> k, double eps, std::int64_t q_width,
                     std::int64_t k_width)
      : q_(std::move(q)), k_(std::move(k)), eps_(eps), q_width_(q_width), k_width_(k_width) {}
  void apply(at::Tensor& q, at::Tensor& k, layer_context& c) const override {
    const std::int64_t tokens = q.size(0);
    q = norm(q.reshape({tokens, -1}), *q_, q_width_, c).view(q.sizes());
    k = norm(k.reshape({tokens, -1}), *k_, k_width_, c).view(k.sizes());
  }

 private:
  // RMSNorm over a width split across tp ranks (this rank's heads): the fp32 sum of squares is
  // summed over tp in the forward, and its gradient in the backward (each rank's normalised
  // values depend on every rank's squares). x: (T, width / tp), the weight (width / tp).
  at::Tensor norm(const at::Tensor& x, const norm_module& n, std::int64_t width, const layer_context& c) const {
    const at::Tensor xf = x.to(at::kFloat);
    at::Tensor squares = xf.pow(2).sum(-1, true);  // (T, 1)
    if (c.tp != nullptr) squares = reduce_from_tp(copy_to_tp(squares, *c.tp), *c.tp);
    const at::Tensor normed = xf * at::rsqrt(squares / static_cast<double>(width) + eps_);
    return n.apply_weight(normed, x.scalar_type(), c);
  }

  std::unique_ptr<norm_module> q_, k_;  // weights (heads * d / tp), (kv_heads * d / tp): split with the heads
  double eps_;
  std::int64_t q_width_, k_width_;
};

}  // namespace

std::unique_ptr<qk_norm_module> make_per_head_qk_norm(std::unique_ptr<norm_module> q, std::unique_ptr<norm_module> k) {
  return std::make_unique<per_head_qk_norm>(std::move(q), std::move(k));
}
std::unique_ptr<qk_norm_module> make_full_width_qk_norm(std::unique_ptr<norm_module> q, std::unique_ptr<norm_module> k,
                                                        double eps, std::int64_t q_width, std::int64_t k_width) {
  return std::make_unique<full_width_qk_norm>(std::move(q), std::move(k), eps, q_width, k_width);
}

}  // namespace megadsl
