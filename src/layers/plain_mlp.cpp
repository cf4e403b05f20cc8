// The plain MLP, proj(act(fc x + b)) + b (StarCoder2, GPT-NeoX): fc column-parallel with its bias
// split, the output projection row-parallel with its bias added after the reduction.
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"

namespace megadsl {
namespace {

class plain_mlp final : public layer_module {
 public:
  plain_mlp(const module_params& p, activation_fn act)
      : fc_(p.require("fc.weight")), fc_bias_(p.find("fc.bias")), down_(p.require("down.weight")),
        down_bias_(p.find("down.bias")), act_(act) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor up = c.column(x, fc_, fc_bias_);  // (T', ffn/tp)
    return c.row(act_(up), down_, down_bias_);         // (T'/tp or T', h)
  }

 private:
  at::Tensor fc_, fc_bias_;      // (ffn/tp, h), (ffn/tp)
  at::Tensor down_, down_bias_;  // (h, ffn/tp), (h)
  activation_fn act_;
};

}  // namespace

std::unique_ptr<layer_module> make_plain_mlp(const module_params& p, activation_fn act) {
  return std::make_unique<plain_mlp>(p, act);
}

}  // namespace megadsl
