// The norms, one class each: RMSNorm in HF's three cast orders and LayerNorm with its bias.
//   rms_norm       y = w * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)                 (Llama, Qwen, Mistral)
//   rms_norm_1p    y = ((x * rsqrt(mean(x^2) + eps)) * (1 + w.float())).to(x.dtype)  (Gemma)
//   rms_norm_wmul  y = (w * (x * rsqrt(mean(x^2) + eps))).to(x.dtype)               (OLMo2)
//   layer_norm     nn.LayerNorm with its bias                                         (StarCoder2, NeoX)
//   layer_norm_no_bias  y = (w.float() * (x - mean) * rsqrt(var + eps)).to(x.dtype), in fp32 (Cohere)
#include <ATen/ATen.h>

#include <string>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/fused_ops.hpp"

namespace megadsl {
namespace {

// RMSNorm over the last dimension in fp32; the subclass applies the weight.
class rms_norm_base : public norm_module {
 public:
  explicit rms_norm_base(const block_build& b) : weight_(b.require("weight")), eps_(b.s().rms_eps.get()) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor xf = x.to(at::kFloat);
    return apply_weight(xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps_), x.scalar_type(), c);
  }

 protected:
  at::Tensor weight_;  // (n): (h) replicated, (d) per head, or a tp shard of a full-width q/k norm
  double eps_;
};

class rms_norm final : public rms_norm_base {
 public:
  using rms_norm_base::rms_norm_base;
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    // bf16/fp16 on CUDA: ATen's fused RMSNorm (one kernel each way; fp32 inside, one rounding).
    if (fused_kernels_take(x)) return at::rms_norm(x, {x.size(-1)}, c.w(weight_), eps_);
    return rms_norm_base::forward(x, c);
  }
  at::Tensor apply_weight(const at::Tensor& normed, at::ScalarType dtype, const layer_context& c) const override {
    return c.w(weight_) * normed.to(dtype);
  }
};

class rms_norm_1p final : public rms_norm_base {
 public:
  using rms_norm_base::rms_norm_base;
  at::Tensor apply_weight(const at::Tensor& normed, at::ScalarType dtype, const layer_context& c) const override {
    return (normed * (1.0 + c.w(weight_).to(at::kFloat))).to(dtype);
  }
};

class rms_norm_wmul final : public rms_norm_base {
 public:
  using rms_norm_base::rms_norm_base;
  at::Tensor apply_weight(const at::Tensor& normed, at::ScalarType dtype, const layer_context& c) const override {
    return (c.w(weight_) * normed).to(dtype);
  }
};

class layer_norm final : public norm_module {
 public:
  explicit layer_norm(const block_build& b)
      : weight_(b.require("weight")), bias_(b.require("bias")), eps_(b.s().rms_eps.get()) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    return at::layer_norm(x, {x.size(-1)}, c.w(weight_), c.w(bias_), eps_);
  }
  at::Tensor apply_weight(const at::Tensor& normed, at::ScalarType dtype, const layer_context& c) const override {
    return c.w(weight_) * normed.to(dtype) + c.w(bias_);
  }

 private:
  at::Tensor weight_, bias_;  // (h) replicated
  double eps_;
};

// CohereLayerNorm: centred and scaled in fp32, the weight applied in fp32, no bias.
class layer_norm_no_bias final : public norm_module {
 public:
  explicit layer_norm_no_bias(const block_build& b) : weight_(b.require("weight")), eps_(b.s().rms_eps.get()) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor centred = xf - xf.mean(-1, true);
    return apply_weight(centred * at::rsqrt(centred.pow(2).mean(-1, true) + eps_), x.scalar_type(), c);
  }
  at::Tensor apply_weight(const at::Tensor& normed, at::ScalarType dtype, const layer_context& c) const override {
    return (c.w(weight_).to(at::kFloat) * normed).to(dtype);
  }

 private:
  at::Tensor weight_;  // (h) replicated
  double eps_;
};

}  // namespace

namespace modules {
std::unique_ptr<block_module> rms_norm(const block_build& b) { return std::make_unique<megadsl::rms_norm>(b); }
std::unique_ptr<block_module> rms_norm_1p(const block_build& b) { return std::make_unique<megadsl::rms_norm_1p>(b); }
std::unique_ptr<block_module> rms_norm_wmul(const block_build& b) { return std::make_unique<megadsl::rms_norm_wmul>(b); }
std::unique_ptr<block_module> layer_norm(const block_build& b) { return std::make_unique<megadsl::layer_norm>(b); }
std::unique_ptr<block_module> layer_norm_no_bias(const block_build& b) { return std::make_unique<megadsl::layer_norm_no_bias>(b); }
}  // namespace modules

}  // namespace megadsl
