// The plain MLP, proj(act(fc x + b)) + b (StarCoder2, GPT-NeoX): fc column-parallel with its bias
// split, the output projection row-parallel with its bias added after the reduction.
#include <ATen/ATen.h>

#include "megadsl/blocks/gated_mlp.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/invariant.hpp"

namespace megadsl {
namespace {

class plain_mlp final : public layer_module {
 public:
  explicit plain_mlp(const block_build& b)
      : fc_(b.require("fc.weight")), fc_bias_(b.find("fc.bias")), down_(b.require("down.weight")),
        down_bias_(b.find("down.bias")), act_(activation_fn_of(b.knobs<blocks::mlp_knobs>().act)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor up = c.column(x, fc_, fc_bias_);  // (T', ffn/tp)
    return c.row(pointwise(up, act_), down_, down_bias_);       // (T'/tp or T', h)
  }

 private:
  at::Tensor fc_, fc_bias_;      // (ffn/tp, h), (ffn/tp)
  at::Tensor down_, down_bias_;  // (h, ffn/tp), (h)
  activation_fn act_;
};

}  // namespace

std::unique_ptr<block_module> modules::plain_mlp(const block_build& b) { return std::make_unique<megadsl::plain_mlp>(b); }

}  // namespace megadsl
