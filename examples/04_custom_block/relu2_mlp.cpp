// The squared-ReLU MLP's run-time module: compiled once, here, whatever the shape or layout.
#include "relu2_mlp.hpp"

#include <ATen/ATen.h>

#include "megadsl/layers/module.hpp"

namespace example {
namespace {

class relu2_mlp_module final : public megadsl::layer_module {
 public:
  explicit relu2_mlp_module(const megadsl::block_build& b) : up_(b.require("up.weight")), down_(b.require("down.weight")) {}
  at::Tensor forward(const at::Tensor& x, megadsl::layer_context& c) override {
    const at::Tensor h = at::relu(c.column(x, up_));  // (T', ffn/tp): the stream gathered from SP shards
    return c.row(h * h, down_);                        // (T'/tp or T', hidden): reduced over tp
  }

 private:
  at::Tensor up_, down_;  // (ffn/tp, hidden), (hidden, ffn/tp)
};

}  // namespace

std::unique_ptr<megadsl::block_module> make_relu2_mlp(const megadsl::block_build& b) {
  return std::make_unique<relu2_mlp_module>(b);
}

}  // namespace example
