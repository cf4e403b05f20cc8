// The residual combinators: how a layer's sublayers meet their norms and the residual stream.
//   pre_norm   x + f(n(x))             (Llama)
//   post_norm  x + n(f(x))             (OLMo2)
//   sandwich   x + n'(f(n(x)))         (Gemma2)
//   parallel   x + attn(n1(x)) + mlp(n2(x)), summed as HF does: mlp + attn + x   (GPT-NeoX):
//              a `branch` f(n(x)) per sublayer, summed by `parallel_sum`
//   sequence   the second sublayer on the first's output (a layer of two sublayers)
//   parallel_shared_norm  x + attn(n(x)) + mlp(n(x)), one norm for both, summed as HF does:
//              (x + attn) + mlp   (Cohere)
// Each sublayer's output is multiplied by the config key its residual's knobs name before it joins
// the stream (Granite's residual_multiplier: residual + out * m; none elsewhere), and takes
// the residual dropout in a training step (layers/dropout.hpp; the combinator's block node and the
// sublayer's slot name the place, so each sublayer has masks of its own).
#include <ATen/ATen.h>

#include "megadsl/blocks/residuals.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/dropout.hpp"

namespace megadsl {
namespace {

// A sublayer's output as it joins the residual stream; `place` numbers its dropout masks.
at::Tensor scaled(at::Tensor out, const layer_context& c, std::int64_t place, double multiplier = 1) {
  out = residual_dropout(out, c, place);
  if (multiplier != 1) return out * multiplier;
  return out;
}
// The value of the config key the residual's knobs name, or 1.
double multiplier_of(const block_build& b) {
  const config_setting* key = b.knobs<blocks::residual_knobs>().scale;
  return key != nullptr ? b.setting(key->key) : 1.0;
}

class pre_norm final : public layer_module {
 public:
  explicit pre_norm(const block_build& b)
      : n_(b.child_as<norm_module>(0)), f_(b.child_as<layer_module>(1)), place_(2 * b.node()), m_(multiplier_of(b)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    return x + scaled(f_->forward(n_->forward(x, c), c), c, place_, m_);
  }

 private:
  std::unique_ptr<norm_module> n_;
  std::unique_ptr<layer_module> f_;
  std::int64_t place_;  // its dropout masks' number in the layer
  double m_;            // its output's multiplier (residual_knobs)
};

class post_norm final : public layer_module {
 public:
  explicit post_norm(const block_build& b)
      : n_(b.child_as<norm_module>(0)), f_(b.child_as<layer_module>(1)), place_(2 * b.node()), m_(multiplier_of(b)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    return x + scaled(n_->forward(f_->forward(x, c), c), c, place_, m_);
  }

 private:
  std::unique_ptr<norm_module> n_;
  std::unique_ptr<layer_module> f_;
  std::int64_t place_;  // its dropout masks' number in the layer
  double m_;            // its output's multiplier (residual_knobs)
};

class sandwich final : public layer_module {
 public:
  explicit sandwich(const block_build& b)
      : pre_(b.child_as<norm_module>(0)), f_(b.child_as<layer_module>(1)), post_(b.child_as<norm_module>(2)),
        place_(2 * b.node()), m_(multiplier_of(b)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    return x + scaled(post_->forward(f_->forward(pre_->forward(x, c), c), c), c, place_, m_);
  }

 private:
  std::unique_ptr<norm_module> pre_;
  std::unique_ptr<layer_module> f_;
  std::unique_ptr<norm_module> post_;
  std::int64_t place_;  // its dropout masks' number in the layer
  double m_;            // its output's multiplier (residual_knobs)
};

// One side of a parallel layer: f(n(x)), no residual of its own.
class branch final : public layer_module {
 public:
  explicit branch(const block_build& b)
      : n_(b.child_as<norm_module>(0)), f_(b.child_as<layer_module>(1)), place_(2 * b.node()), m_(multiplier_of(b)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    return scaled(f_->forward(n_->forward(x, c), c), c, place_, m_);
  }

 private:
  std::unique_ptr<norm_module> n_;
  std::unique_ptr<layer_module> f_;
  std::int64_t place_;  // its dropout masks' number in the layer
  double m_;            // its output's multiplier (residual_knobs)
};

class parallel_sum final : public layer_module {
 public:
  explicit parallel_sum(const block_build& b) : attn_(b.child_as<layer_module>(0)), mlp_(b.child_as<layer_module>(1)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor attn_out = attn_->forward(x, c);
    const at::Tensor mlp_out = mlp_->forward(x, c);
    return mlp_out + attn_out + x;
  }

 private:
  std::unique_ptr<layer_module> attn_, mlp_;
};

class sequence final : public layer_module {
 public:
  explicit sequence(const block_build& b) : a_(b.child_as<layer_module>(0)), b_(b.child_as<layer_module>(1)) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override { return b_->forward(a_->forward(x, c), c); }

 private:
  std::unique_ptr<layer_module> a_, b_;
};

class parallel_shared_norm final : public layer_module {
 public:
  explicit parallel_shared_norm(const block_build& b)
      : n_(b.child_as<norm_module>(0)), attn_(b.child_as<layer_module>(1)), mlp_(b.child_as<layer_module>(2)),
        place_(2 * b.node()) {}
  at::Tensor forward(const at::Tensor& x, layer_context& c) override {
    const at::Tensor h = n_->forward(x, c);  // (T'/tp or T', h): both sublayers read it
    const at::Tensor attn_out = scaled(attn_->forward(h, c), c, place_);
    return x + attn_out + scaled(mlp_->forward(h, c), c, place_ + 1);
  }

 private:
  std::unique_ptr<norm_module> n_;
  std::unique_ptr<layer_module> attn_, mlp_;
  std::int64_t place_;  // its dropout masks' number in the layer
};

}  // namespace

namespace modules {
std::unique_ptr<block_module> pre_norm(const block_build& b) { return std::make_unique<megadsl::pre_norm>(b); }
std::unique_ptr<block_module> post_norm(const block_build& b) { return std::make_unique<megadsl::post_norm>(b); }
std::unique_ptr<block_module> sandwich(const block_build& b) { return std::make_unique<megadsl::sandwich>(b); }
std::unique_ptr<block_module> branch(const block_build& b) { return std::make_unique<megadsl::branch>(b); }
std::unique_ptr<block_module> parallel_sum(const block_build& b) { return std::make_unique<megadsl::parallel_sum>(b); }
std::unique_ptr<block_module> sequence(const block_build& b) { return std::make_unique<megadsl::sequence>(b); }
std::unique_ptr<block_module> parallel_shared_norm(const block_build& b) {
  return std::make_unique<megadsl::parallel_shared_norm>(b);
}
}  // namespace modules

}  // namespace megadsl
