// Qwen3-Next's output-gated attention on this tp rank's heads: q_proj gives each head [q | gate]
// (column-parallel), k_proj / v_proj (replicated) the kv heads this rank's query heads read (one of
// them for several ranks when there are fewer kv heads than ranks), the q/k norm per head before RoPE on the
// shape's rotary share, causal attention over padded rows or packed sequences (under context
// parallelism over whole sequences of this cp rank's share of the heads, Ulysses), the output times
// sigmoid(gate), the row-parallel o_proj.
#include <ATen/ATen.h>

#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/dropout.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/layers/recompute.hpp"
#include "megadsl/models/qwen3_next/gated_attention.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace {

class gated_attention final : public layer_module {
 public:
  explicit gated_attention(const block_build& b)
      : q_(b.require("q_proj.weight")), q_bias_(b.find("q_proj.bias")), k_(b.require("k_proj.weight")),
        k_bias_(b.find("k_proj.bias")), v_(b.require("v_proj.weight")), v_bias_(b.find("v_proj.bias")),
        o_(b.require("o_proj.weight")), o_bias_(b.find("o_proj.bias")), qk_norm_(b.child_as<qk_norm_module>(0)) {
    const shape& s = b.s();
    const std::int64_t tp = b.args.l.tp.get();
    heads_ = s.heads.get() / tp;
    d_ = effective_head_dim(s).get();
    // The kv heads this rank's query heads read: whole groups of them, or a share of one group's
    // query heads (kv_heads a multiple or a divisor of tp: rule kv_heads_fit_tp).
    const std::int64_t group = s.heads.get() / s.kv_heads.get();
    groups_ = std::max<std::int64_t>(1, heads_ / group);
    first_kv_ = b.args.tp_rank * heads_ / group;
    window_ = b.args.options.attention_window.of(b.params.layer);
    selective_ = b.args.l.recompute.get() == recompute_kind::selective;
  }

  at::Tensor forward(const at::Tensor& h, layer_context& c) override {
    const packed_tokens& pk = c.sequences();  // the whole stream: this rank's share at cp > 1
    const std::int64_t tokens = pk.tokens, stream = pk.ids.size(0), n = heads_, g = groups_, d = d_;
    at::Tensor x = c.to_tp(h);                                  // (T'/cp, H)
    const std::int64_t rows = c.cp != nullptr ? x.size(0) : tokens;
    if (x.size(0) != rows) x = x.narrow(0, 0, rows);            // SP padding rows: (T, H)
    const auto q_gate = c.linear(x, q_, q_bias_).view({rows, n, 2 * d}).split_with_sizes({d, d}, -1);
    at::Tensor q = q_gate[0].reshape({rows, g, n / g, d});                       // (rows, G, Q, d)
    // This rank's kv heads' rows of the replicated k_proj / v_proj (their gradients land in those
    // rows); with a LoRA adapter on it, the whole projection (the adapter's update is whole), narrowed.
    const auto mine = [&](const at::Tensor& p) { return p.defined() ? c.w(p).narrow(0, first_kv_ * d, g * d) : p; };
    const auto kv = [&](const at::Tensor& w, const at::Tensor& b) {
      if (c.lora != nullptr && c.lora->adapts(w)) return c.linear(x, w, b).narrow(-1, first_kv_ * d, g * d);
      return c.linear(x, mine(w), mine(b));
    };
    at::Tensor k = kv(k_, k_bias_).view({rows, g, d});  // (rows, G, d)
    at::Tensor v = kv(v_, v_bias_).view({rows, g, d});
    qk_norm_->apply(q, k, c);  // per head: on this rank's rows
    // Context parallelism (Ulysses): whole sequences of this cp rank's share of the heads.
    if (c.cp != nullptr) cp_whole_stream_heads({}, q, k, v, tokens, *c.cp);     // (T, G/cp, Q, d) or (T, 1, Q/cp, d)
    // The attention core, RoPE then the kernel; under selective recompute only q, k, v are kept
    // and the core runs again in the backward.
    const std::int64_t first_head = c.tp_rank * heads_ + (c.cp != nullptr ? c.cp->rank() * heads_ / c.cp->size() : 0);
    const attention_math math{0.0, 0.0, window_, 0, {}, attention_dropout_of(c, first_head)};
    attention_core core = [rope = c.rope, kernel = attention_kernel::over(pk, math)](
                              const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in) {
      return kernel(apply_rope(q_in, rope), apply_rope(k_in, rope), v_in);
    };
    at::Tensor a = selective_ ? recompute_in_backward(std::move(core), q, k, v) : core(q, k, v);
    const at::Tensor gate = pointwise(q_gate[1].reshape({rows, n * d}), [](const at::Tensor& t) { return at::sigmoid(t); });// (rows, n*d)
    if (c.cp == nullptr) a = a * gate;                                            // (T, n*d)
    if (stream > tokens) a = at::constant_pad_nd(a, {0, 0, 0, stream - tokens});  // (T', n*d)
    if (c.cp != nullptr) a = cp_heads_to_tokens(a, *c.cp) * gate;                 // (T'/cp, n*d)
    return c.row(a, o_, o_bias_);  // (T'/cp/tp or T'/cp, H)
  }

 private:
  at::Tensor q_, q_bias_;  // (n/tp * 2d [, H]): this rank's heads, [q | gate] each
  at::Tensor k_, k_bias_, v_, v_bias_;  // (kv * d [, H]) every kv head, replicated
  at::Tensor o_, o_bias_;  // (H, n/tp * d), (H)
  std::unique_ptr<qk_norm_module> qk_norm_;
  std::int64_t heads_ = 0, groups_ = 0, first_kv_ = 0, d_ = 0, window_ = 0;  // groups_: this rank's kv heads
  bool selective_ = false;  // selective recompute: the core runs again in the backward
};

}  // namespace

std::unique_ptr<block_module> modules::gated_attention(const block_build& b) {
  return std::make_unique<megadsl::gated_attention>(b);
}

}  // namespace megadsl
