// ERNIE 4.5's router (blocks::biased_softmax_router, biased_softmax_router.hpp beside this file).
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/moe.hpp"
#include "megadsl/models/ernie4_5_moe/biased_softmax_router.hpp"

namespace megadsl {
namespace {

class biased_softmax_router final : public router_module {
 public:
  explicit biased_softmax_router(const block_build& b)
      : router_module(b), floor_(b.setting(blocks::moe_norm_min.key)) {}
  routing route(const at::Tensor& logits) const override {
    return route_softmax_biased(logits, load_.bias.detach(), top_k_, floor_);
  }
  at::Tensor weights_of(const at::Tensor& logits, const at::Tensor& indices) const override {
    return softmax_weights(logits, indices, norm_topk_, floor_);
  }
  at::Tensor balance_probs(const at::Tensor& logits) const override { return at::softmax(logits, -1, at::kFloat); }

 private:
  double floor_;  // moe_norm_min: the top-k weights divided by max(sum, it)
};

}  // namespace

std::unique_ptr<block_module> modules::biased_softmax_router(const block_build& b) {
  return std::make_unique<megadsl::biased_softmax_router>(b);
}

}  // namespace megadsl
