// Llama 4's router (blocks::input_sigmoid_router, input_sigmoid_router.hpp beside this file).
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/moe.hpp"
#include "megadsl/models/llama4/input_sigmoid_router.hpp"

namespace megadsl {
namespace {

class input_sigmoid_router final : public router_module {
 public:
  explicit input_sigmoid_router(const block_build& b) : router_module(b) {}
  routing route(const at::Tensor& logits) const override { return route_sigmoid_on_input(logits, top_k_); }
  // Replayed experts: the live logits' sigmoid, neither renormalised nor scaled.
  at::Tensor weights_of(const at::Tensor& logits, const at::Tensor& indices) const override {
    return sigmoid_weights(logits, indices, false, 1.0);
  }
  at::Tensor balance_probs(const at::Tensor& logits) const override { return sigmoid_balance_probs(logits); }
};

}  // namespace

std::unique_ptr<block_module> modules::input_sigmoid_router(const block_build& b) {
  return std::make_unique<megadsl::input_sigmoid_router>(b);
}

}  // namespace megadsl
