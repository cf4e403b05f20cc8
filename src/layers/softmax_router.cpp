// HF's softmax router (blocks::softmax_router): softmax over every expert in fp32, the top k,
// renormalised per norm_topk (divided by their sum).
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/moe.hpp"

namespace megadsl {
namespace {

class softmax_router final : public router_module {
 public:
  explicit softmax_router(const block_build& b) : router_module(b) {}
  routing route(const at::Tensor& logits) const override { return megadsl::route(logits, top_k_, norm_topk_); }
  at::Tensor weights_of(const at::Tensor& logits, const at::Tensor& indices) const override {
    return softmax_weights(logits, indices, norm_topk_);
  }
  at::Tensor balance_probs(const at::Tensor& logits) const override { return at::softmax(logits, -1, at::kFloat); }
};

}  // namespace

std::unique_ptr<block_module> modules::softmax_router(const block_build& b) { return std::make_unique<megadsl::softmax_router>(b); }

}  // namespace megadsl
