// Q/K norms before RoPE: per head over head_dim (Qwen3; Command R+ with a weight for every head) or
// over the full projection width (OLMo2), each with the norm block it is given (its children: the
// q norm, the k norm).
#include <ATen/ATen.h>

#include <vector>

#include "megadsl/blocks/qk_norms.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/invariant.hpp"
#include "megadsl/parallel/mappings.hpp"

namespace megadsl {
namespace {

class per_head_qk_norm final : public qk_norm_module {
 public:
  explicit per_head_qk_norm(const block_build& b)
      : q_(b.child_as<norm_module>(0)), k_(b.child_as<norm_module>(1)),
        after_rope_(b.knobs<blocks::qk_norm_knobs>().after_rope),
        weight_per_head_(b.knobs<blocks::qk_norm_knobs>().weight_per_head) {}
  void apply(at::Tensor& q, at::Tensor& k, layer_context& c) const override {
    if (weight_per_head_) {
      // Weights (G*Q, d) for q, (G, d) for k: this rank's heads in HF's order (kv group, then query).
      const std::vector<std::int64_t> grouped = q.sizes().vec();  // (T, G, Q, d)
      q = q_->forward(q.reshape({grouped[0], grouped[1] * grouped[2], grouped[3]}), c).view(grouped);
    } else {
      q = q_->forward(q, c);  // (T, G, Q, d), a (d) weight
    }
    k = k_->forward(k, c);  // (T, G, d): a (d) or a (G, d) weight
  }
  [[nodiscard]] bool after_rope() const override { return after_rope_; }

 private:
  std::unique_ptr<norm_module> q_, k_;
  bool after_rope_ = false;       // HunYuan's: on the rotated q and k
  bool weight_per_head_ = false;  // Command R+'s: a weight for every head, held per tp rank
};

class full_width_qk_norm final : public qk_norm_module {
 public:
  explicit full_width_qk_norm(const block_build& b)
      : q_(b.child_as<norm_module>(0)), k_(b.child_as<norm_module>(1)), eps_(b.s().rms_eps.get()),
        q_width_(b.s().heads.get() * effective_head_dim(b.s()).get()),
        k_width_(b.s().kv_heads.get() * effective_head_dim(b.s()).get()) {}
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
    at::Tensor squares;  // (T, 1)
    if (c.l.invariant.get()) {
      // Invariant arithmetic: the squares by chunk of width / invariant_k_chunks, summed in a fixed
      // tree over all chunks whatever tp (the gradient summed over tp as below).
      const std::int64_t local = invariant_k_chunks / (c.tp != nullptr ? c.tp->size() : 1);
      TORCH_CHECK(width % invariant_k_chunks == 0, "megadsl: invariant arithmetic sums the full-width q/k norm's ", width,
                  " squares in ", invariant_k_chunks, " equal chunks, and they do not divide; this model cannot run with invariant");
      at::Tensor parts = xf.pow(2).view({x.size(0), local, -1}).sum(-1).t().unsqueeze(-1);  // (local, T, 1)
      if (c.tp != nullptr) parts = copy_to_tp(parts, *c.tp);
      squares = invariant_chunk_sum(parts, c.tp, false);
    } else {
      squares = xf.pow(2).sum(-1, true);
      if (c.tp != nullptr) squares = reduce_from_tp(copy_to_tp(squares, *c.tp), *c.tp);
    }
    const at::Tensor normed = xf * at::rsqrt(squares / static_cast<double>(width) + eps_);
    return n.apply_weight(normed, x.scalar_type(), c);
  }

  std::unique_ptr<norm_module> q_, k_;  // weights (heads * d / tp), (kv_heads * d / tp): split with the heads
  double eps_;
  std::int64_t q_width_, k_width_;
};

}  // namespace

namespace modules {
std::unique_ptr<block_module> per_head_qk_norm(const block_build& b) { return std::make_unique<megadsl::per_head_qk_norm>(b); }
std::unique_ptr<block_module> full_width_qk_norm(const block_build& b) {
  return std::make_unique<megadsl::full_width_qk_norm>(b);
}
}  // namespace modules

}  // namespace megadsl
