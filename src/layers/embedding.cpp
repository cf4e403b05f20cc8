// The vocab-parallel token embedding: ids (T',) -> (T'/tp or T', h). Rows outside this rank's
// vocabulary range read as zero, then the partial sums are reduced over tp (reduce-scattered to
// SP shards). Gemma scales the result by sqrt(hidden) rounded to the activations' dtype, Granite by
// its embedding_multiplier (the block's knobs name the key).
#include <ATen/ATen.h>

#include <cmath>

#include "megadsl/blocks/embedding.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/parallel/mappings.hpp"

namespace megadsl {
namespace {

class embedding final : public layer_module {
 public:
  explicit embedding(const block_build& b)
      : weight_(b.require("weight")), scaled_(b.knobs<blocks::embedding_knobs>().scale == embed_scale_kind::sqrt_hidden) {
    if (const config_setting* m = b.knobs<blocks::embedding_knobs>().multiplier) multiplier_ = b.setting(m->key);
  }
  at::Tensor forward(const at::Tensor& ids, layer_context& c) override {
    at::Tensor x;  // (T'/tp or T', h)
    if (c.tp == nullptr) x = at::embedding(c.w(weight_), ids);
    else {
      const std::int64_t rows = weight_.size(0), start = c.tp_rank * rows;
      const at::Tensor mine = (ids >= start) & (ids < start + rows);
      const at::Tensor local = at::embedding(c.w(weight_), (ids - start) * mine) * mine.unsqueeze(1);  // (T', h) partial
      x = c.from_tp(local);
    }
    // A tensor of the activations' dtype (rounded like HF's normalizer), after the reduction: the
    // partial sums are exact zeros elsewhere, so the bits are the same.
    if (scaled_) x = x * at::scalar_tensor(std::sqrt(static_cast<double>(c.s.hidden.get())), x.scalar_type());
    // Granite: times embedding_multiplier, a Python float (a scalar of the op's math type).
    if (multiplier_ != 1) x = x * multiplier_;
    return x;
  }

 private:
  at::Tensor weight_;  // (V'/tp, h)
  bool scaled_;
  double multiplier_ = 1;  // the knobs' config key's value (Granite's embedding_multiplier)
};

}  // namespace

std::unique_ptr<block_module> modules::embedding(const block_build& b) { return std::make_unique<megadsl::embedding>(b); }

}  // namespace megadsl
