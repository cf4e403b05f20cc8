// The gated MLP, down(act(gate x) * up x) (SwiGLU, GeGLU): gate/up fused column-parallel (per
// rank [gate_r ; up_r]), down row-parallel; with Llama's mlp_bias, their biases.
#include <ATen/ATen.h>

#include "megadsl/blocks/gated_mlp.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"

namespace megadsl {
namespace {

class gated_mlp final : public layer_module {
 public:
  explicit gated_mlp(const block_build& b)
      : gate_up_(b.require("gate_up.weight")), gate_up_bias_(b.find("gate_up.bias")), down_(b.require("down.weight")),
        down_bias_(b.find("down.bias")), act_(activation_fn_of(b.knobs<blocks::mlp_knobs>().act)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    // (T', 2f/tp) -> (T', f/tp) -> (T'/tp or T', h)
    return c.row(gated(c.column(x, gate_up_, gate_up_bias_), act_), down_, down_bias_);
  }

 private:
  at::Tensor gate_up_, gate_up_bias_;  // (2 ffn/tp, h), (2 ffn/tp): per rank [gate_r ; up_r]
  at::Tensor down_, down_bias_;        // (h, ffn/tp), (h) (Llama's mlp_bias; undefined without)
  activation_fn act_;
};

}  // namespace

std::unique_ptr<block_module> modules::gated_mlp(const block_build& b) { return std::make_unique<megadsl::gated_mlp>(b); }

}  // namespace megadsl
