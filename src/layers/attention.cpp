// Grouped-query self-attention split over tp by kv groups: the fused q/k/v projection
// (column-parallel, per local group [q heads | k | v]), optional q/k norms, RoPE, causal attention
// over padded rows or packed sequences (cu_seqlens), the row-parallel output projection.
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/recompute.hpp"
#include "megadsl/runtime/packing.hpp"

namespace megadsl {
namespace {

class attention final : public layer_module {
 public:
  attention(const module_params& p, attention_settings s)
      : qkv_(p.require("qkv.weight")), qkv_bias_(p.find("qkv.bias")), o_(p.require("o_proj.weight")),
        o_bias_(p.find("o_proj.bias")), s_(std::move(s)) {}

  at::Tensor forward(const at::Tensor& h, layer_context& c) override {
    const packed_tokens& pk = c.pk;
    const std::int64_t tokens = pk.tokens;
    const qkv_rank_layout& g = s_.qkv;
    at::Tensor qkv = c.column(h, qkv_, qkv_bias_);               // (T', G*(Q+2)*d)
    if (qkv.size(0) != tokens) qkv = qkv.narrow(0, 0, tokens);  // SP padding rows: (T, ...)
    const at::Tensor grouped = qkv.view({tokens, g.groups, g.q_per_group + 2, g.head_dim});
    // One split (its backward is one concatenation), not three views whose backwards each
    // zero-fill a buffer of qkv's size.
    const auto parts = grouped.split_with_sizes({g.q_per_group, 1, 1}, 2);
    at::Tensor q = parts[0], k = parts[1].squeeze(2);  // (T, G, Q, d), (T, G, d)
    if (s_.qk_norm) s_.qk_norm->apply(q, k, c);
    const at::Tensor v = parts[2].squeeze(2);          // (T, G, d)
    const attention_math math{s_.scale, s_.softcap, s_.window};
    // The attention core, RoPE then the kernel: (T, G, Q, d), (T, G, d) x2 -> (T, G*Q*d). Under
    // selective recompute only q, k, v are kept and the core runs again in the backward.
    attention_core core = [rope = c.rope, math, rmpad = pk.rmpad, cu = pk.cu_seqlens, batch = pk.batch, seq = pk.seq,
                           mask = pk.no_padding ? at::Tensor() : pk.attention_mask](
                              const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in) {
      const at::Tensor qr = apply_rope(q_in, rope), kr = apply_rope(k_in, rope);
      return rmpad ? attention_varlen(qr, kr, v_in, cu, math) : attention_padded(qr, kr, v_in, mask, batch, seq, math);
    };
    at::Tensor a = s_.selective_recompute ? recompute_in_backward(std::move(core), q, k, v) : core(q, k, v);
    if (pk.ids.size(0) > tokens) a = at::constant_pad_nd(a, {0, 0, 0, pk.ids.size(0) - tokens});
    return c.row(a, o_, o_bias_);  // (T'/tp or T', h)
  }

 private:
  at::Tensor qkv_, qkv_bias_;  // (G*(Q+2)*d [, h]) this rank's groups
  at::Tensor o_, o_bias_;      // (h, heads*d/tp), (h)
  attention_settings s_;
};

}  // namespace

std::unique_ptr<layer_module> make_attention(const module_params& p, attention_settings s) {
  return std::make_unique<attention>(p, std::move(s));
}

}  // namespace megadsl
