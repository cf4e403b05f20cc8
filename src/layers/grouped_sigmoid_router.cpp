// DeepSeek-V3's router (blocks::grouped_sigmoid_router): sigmoid scores in fp32, the experts chosen
// by scores + the expert bias within the best groups, the chosen scores renormalised and scaled.
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/moe.hpp"

namespace megadsl {
namespace {

class grouped_sigmoid_router final : public router_module {
 public:
  explicit grouped_sigmoid_router(const block_build& b)
      : router_module(b),
        groups_(static_cast<std::int64_t>(b.setting("n_group"))),
        group_top_k_(static_cast<std::int64_t>(b.setting("topk_group"))),
        scale_(b.setting("routed_scaling_factor")) {}
  routing route(const at::Tensor& logits) const override {
    return route_sigmoid_grouped(logits, load_.bias.detach(), top_k_, groups_, group_top_k_, norm_topk_, scale_);
  }
  at::Tensor weights_of(const at::Tensor& logits, const at::Tensor& indices) const override {
    return sigmoid_weights(logits, indices, norm_topk_, scale_);
  }
  // Megatron's compute_routing_scores_for_aux_loss: the sigmoid scores normalised over the experts.
  at::Tensor balance_probs(const at::Tensor& logits) const override { return sigmoid_balance_probs(logits); }

 private:
  std::int64_t groups_, group_top_k_;  // n_group, topk_group
  double scale_;                       // routed_scaling_factor
};

}  // namespace

std::unique_ptr<block_module> modules::grouped_sigmoid_router(const block_build& b) {
  return std::make_unique<megadsl::grouped_sigmoid_router>(b);
}

}  // namespace megadsl
