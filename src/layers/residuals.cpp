// The residual combinators: how a layer's sublayers meet their norms and the residual stream.
//   pre_norm   x + f(n(x))             (Llama)
//   post_norm  x + n(f(x))             (OLMo2)
//   sandwich   x + n'(f(n(x)))         (Gemma2)
//   parallel   x + attn(n1(x)) + mlp(n2(x)), summed as HF does: mlp + attn + x   (GPT-NeoX)
//   sequence   the second sublayer on the first's output (a layer of two sublayers)
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"

namespace megadsl {
namespace {

class pre_norm final : public layer_module {
 public:
  pre_norm(std::unique_ptr<norm_module> n, std::unique_ptr<layer_module> f) : n_(std::move(n)), f_(std::move(f)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override { return x + f_->forward(n_->forward(x, c), c); }

 private:
  std::unique_ptr<norm_module> n_;
  std::unique_ptr<layer_module> f_;
};

class post_norm final : public layer_module {
 public:
  post_norm(std::unique_ptr<norm_module> n, std::unique_ptr<layer_module> f) : n_(std::move(n)), f_(std::move(f)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override { return x + n_->forward(f_->forward(x, c), c); }

 private:
  std::unique_ptr<norm_module> n_;
  std::unique_ptr<layer_module> f_;
};

class sandwich final : public layer_module {
 public:
  sandwich(std::unique_ptr<norm_module> pre, std::unique_ptr<layer_module> f, std::unique_ptr<norm_module> post)
      : pre_(std::move(pre)), f_(std::move(f)), post_(std::move(post)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    return x + post_->forward(f_->forward(pre_->forward(x, c), c), c);
  }

 private:
  std::unique_ptr<norm_module> pre_;
  std::unique_ptr<layer_module> f_;
  std::unique_ptr<norm_module> post_;
};

class parallel final : public layer_module {
 public:
  parallel(std::unique_ptr<norm_module> n1, std::unique_ptr<layer_module> attn, std::unique_ptr<norm_module> n2,
           std::unique_ptr<layer_module> mlp)
      : n1_(std::move(n1)), attn_(std::move(attn)), n2_(std::move(n2)), mlp_(std::move(mlp)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor attn_out = attn_->forward(n1_->forward(x, c), c);
    const at::Tensor mlp_out = mlp_->forward(n2_->forward(x, c), c);
    return mlp_out + attn_out + x;
  }

 private:
  std::unique_ptr<norm_module> n1_;
  std::unique_ptr<layer_module> attn_;
  std::unique_ptr<norm_module> n2_;
  std::unique_ptr<layer_module> mlp_;
};

class sequence final : public layer_module {
 public:
  sequence(std::unique_ptr<layer_module> a, std::unique_ptr<layer_module> b) : a_(std::move(a)), b_(std::move(b)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override { return b_->forward(a_->forward(x, c), c); }

 private:
  std::unique_ptr<layer_module> a_, b_;
};

}  // namespace

std::unique_ptr<layer_module> make_pre_norm(std::unique_ptr<norm_module> norm, std::unique_ptr<layer_module> inner) {
  return std::make_unique<pre_norm>(std::move(norm), std::move(inner));
}
std::unique_ptr<layer_module> make_post_norm(std::unique_ptr<norm_module> norm, std::unique_ptr<layer_module> inner) {
  return std::make_unique<post_norm>(std::move(norm), std::move(inner));
}
std::unique_ptr<layer_module> make_sandwich(std::unique_ptr<norm_module> pre, std::unique_ptr<layer_module> inner,
                                            std::unique_ptr<norm_module> post) {
  return std::make_unique<sandwich>(std::move(pre), std::move(inner), std::move(post));
}
std::unique_ptr<layer_module> make_parallel(std::unique_ptr<norm_module> attn_norm, std::unique_ptr<layer_module> attn,
                                            std::unique_ptr<norm_module> mlp_norm, std::unique_ptr<layer_module> mlp) {
  return std::make_unique<parallel>(std::move(attn_norm), std::move(attn), std::move(mlp_norm), std::move(mlp));
}
std::unique_ptr<layer_module> make_sequence(std::unique_ptr<layer_module> first, std::unique_ptr<layer_module> second) {
  return std::make_unique<sequence>(std::move(first), std::move(second));
}

}  // namespace megadsl
