// Qwen3-Next's output-gated attention on this tp rank's heads: q_proj gives each head [q | gate]
// (column-parallel), k_proj / v_proj (replicated) the kv heads this rank's query heads read (one of
// them for several ranks when there are fewer kv heads than ranks), the q/k norm per head before RoPE on the
// shape's rotary share, causal attention over padded rows or packed sequences, the output times
// sigmoid(gate), the row-parallel o_proj.
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/kernels.hpp"
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
  }

  at::Tensor forward(const at::Tensor& h, layer_context& c) override {
    const packed_tokens& pk = c.sequences();
    const std::int64_t tokens = pk.tokens, stream = pk.ids.size(0), n = heads_, g = groups_, d = d_;
    at::Tensor x = c.to_tp(h);                            // (T', H)
    if (x.size(0) != tokens) x = x.narrow(0, 0, tokens);  // SP padding rows: (T, H)
    const auto q_gate = at::linear(x, c.w(q_), c.w(q_bias_)).view({tokens, n, 2 * d}).split_with_sizes({d, d}, -1);
    at::Tensor q = q_gate[0].reshape({tokens, g, n / g, d});                       // (T, G, Q, d)
    // This rank's kv heads' rows of the replicated k_proj / v_proj (their gradients land in those rows).
    const auto mine = [&](const at::Tensor& p) { return p.defined() ? c.w(p).narrow(0, first_kv_ * d, g * d) : p; };
    at::Tensor k = at::linear(x, mine(k_), mine(k_bias_)).view({tokens, g, d});      // (T, G, d)
    const at::Tensor v = at::linear(x, mine(v_), mine(v_bias_)).view({tokens, g, d});
    qk_norm_->apply(q, k, c);
    q = apply_rope(q, c.rope);
    k = apply_rope(k, c.rope);
    const attention_math math{0.0, 0.0, window_};
    at::Tensor a = pk.rmpad ? attention_varlen(q, k, v, pk.cu_seqlens, math)
                            : attention_padded(q, k, v, pk.no_padding ? at::Tensor() : pk.attention_mask, pk.batch, pk.seq, math);
    a = a * at::sigmoid(q_gate[1].reshape({tokens, n * d}));                      // (T, n*d)
    if (stream > tokens) a = at::constant_pad_nd(a, {0, 0, 0, stream - tokens});  // (T', n*d)
    return c.row(a, o_, o_bias_);  // (T'/tp or T', H)
  }

 private:
  at::Tensor q_, q_bias_;  // (n/tp * 2d [, H]): this rank's heads, [q | gate] each
  at::Tensor k_, k_bias_, v_, v_bias_;  // (kv * d [, H]) every kv head, replicated
  at::Tensor o_, o_bias_;  // (H, n/tp * d), (H)
  std::unique_ptr<qk_norm_module> qk_norm_;
  std::int64_t heads_ = 0, groups_ = 0, first_kv_ = 0, d_ = 0, window_ = 0;  // groups_: this rank's kv heads
};

}  // namespace

std::unique_ptr<block_module> modules::gated_attention(const block_build& b) {
  return std::make_unique<megadsl::gated_attention>(b);
}

}  // namespace megadsl
