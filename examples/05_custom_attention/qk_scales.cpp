// The learned q/k scales' run-time module: compiled once, here, whatever the shape or layout.
#include "qk_scales.hpp"

#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"

namespace example {
namespace {

class qk_scales_module final : public megadsl::qk_norm_module {
 public:
  explicit qk_scales_module(const megadsl::block_build& b)
      : q_(b.require("q_scale")), k_(b.require("k_scale")), cap_(b.setting("qk_scale_cap")) {}
  // q: (T, G, Q, d) this rank's query heads by kv group (HF's head order); k: (T, G, d) its kv heads.
  void apply(at::Tensor& q, at::Tensor& k, megadsl::layer_context& c) const override {
    q = q * capped(c.w(q_)).view({1, q.size(1), q.size(2), 1});
    k = k * capped(c.w(k_)).view({1, k.size(1), 1});
  }

 private:
  [[nodiscard]] at::Tensor capped(const at::Tensor& w) const { return cap_ * at::tanh(w / cap_); }
  at::Tensor q_, k_;  // (heads / tp), (kv_heads / tp or 1): this rank's heads' scales
  double cap_;        // config.json's qk_scale_cap
};

}  // namespace

std::unique_ptr<megadsl::block_module> make_qk_scales(const megadsl::block_build& b) {
  return std::make_unique<qk_scales_module>(b);
}

}  // namespace example
