// Multi-head latent attention (DeepSeek-V3's DeepseekV3Attention; Kimi K2, Moonlight) on this tp
// rank's heads: the replicated down projections and their norms on the whole stream, the heads'
// up projections (column-parallel), RoPE on the decoupled part of q and on the one shared key,
// causal attention over padded rows or packed sequences, the row-parallel o_proj. Under context
// parallelism (Ulysses) q, k_nope and v go by one all-to-all to whole sequences of this cp rank's
// share of the heads, the shared rotary key by an all-gather, and the output comes back.
#include <ATen/ATen.h>

#include <cmath>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/dropout.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/ring_attention.hpp"
#include "megadsl/layers/recompute.hpp"
#include "megadsl/models/deepseek_v3/mla.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace {

// DeepseekV3RMSNorm of the latents: eps 1e-6 (its default; the layers' norms take rms_norm_eps),
// w * (x.float() * rsqrt(mean(x^2) + eps)).to(dtype).
at::Tensor latent_norm(const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor xf = x.to(at::kFloat);
  return w * (xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6)).to(x.scalar_type());
}

class mla final : public layer_module {
 public:
  explicit mla(const block_build& b)
      : q_down_(b.find("q_down.weight")), q_norm_(b.find("q_latent_norm.weight")), q_up_(b.find("q_up.weight")),
        q_proj_(b.find("q_proj.weight")), kv_down_(b.require("kv_down.weight")), kv_norm_(b.require("kv_latent_norm.weight")),
        kv_up_(b.require("kv_up.weight")), o_(b.require("o_proj.weight")) {
    const shape& s = b.s();
    heads_ = s.heads.get() / b.args.l.tp.get();
    const blocks::mla_sizes sizes = blocks::mla_sizes::of(s);  // its own keys
    nope_ = sizes.nope;
    rope_ = effective_head_dim(s).get();
    v_ = sizes.v;
    rank_ = sizes.kv_rank;
    interleave_ = s.rope_interleave.get();
    window_ = b.args.options.attention_window.of(b.params.layer);
    // dqk^-1/2, times m(factor, mscale_all_dim)^2 under a scaled RoPE with mscale_all_dim
    // (DeepSeek's yarn_apply_mscale, Megatron's MLA softmax_scale).
    scale_ = std::pow(static_cast<double>(nope_ + rope_), -0.5);
    if (s.rope.type.get() != rope_type::none && s.rope.mscale_all_dim.get() != 0) {
      const double m = yarn_mscale(s.rope.factor.get(), s.rope.mscale_all_dim.get());
      scale_ *= m * m;
    }
    selective_recompute_ = b.args.l.recompute.get() == recompute_kind::selective;
    if (!q_proj_.defined() && !(q_down_.defined() && q_norm_.defined() && q_up_.defined()))
      throw std::logic_error("megadsl: mla: layer " + std::to_string(b.params.layer) +
                             " has neither q_proj nor q_a_proj / q_a_layernorm / q_b_proj");
  }

  at::Tensor forward(const at::Tensor& h, layer_context& c) override {
    const packed_tokens& pk = c.sequences();  // the whole stream: this rank's share at cp > 1
    const std::int64_t tokens = pk.tokens, stream = pk.ids.size(0), dqk = nope_ + rope_;
    at::Tensor x = c.to_tp(h);                                        // (T'/cp, H) on every tp rank
    const std::int64_t rows = c.cp != nullptr ? x.size(0) : tokens;
    if (x.size(0) != rows) x = x.narrow(0, 0, rows);                 // SP padding rows: (T, H)
    const at::Tensor q = q_proj_.defined() ? c.linear(x, q_proj_)  // (rows, n*dqk) this rank's heads
                                           : c.linear(latent_norm(c.linear(x, q_down_), c.w(q_norm_)), q_up_);
    const auto latent = c.linear(x, kv_down_).split_with_sizes({rank_, rope_}, -1);  // (rows, r), (rows, dr)
    at::Tensor qs = q.view({rows, heads_, dqk});                                                              // (rows, n, dqk)
    at::Tensor kv = c.linear(latent_norm(latent[0], c.w(kv_norm_)), kv_up_).view({rows, heads_, nope_ + v_});  // (rows, n, dn+dv)
    at::Tensor k_shared = latent[1];                                                                          // (rows, dr)
    std::int64_t n = heads_;
    if (c.cp != nullptr && cp_ring(c.l)) return c.row(ring_core(qs, kv, k_shared, c), o_);  // (T'/cp/tp or T'/cp, H)
    if (c.cp != nullptr) {
      // Context parallelism (Ulysses): whole sequences of this cp rank's share of the heads, the
      // shared rotary key gathered whole (its gradient summed back over cp by the reduce-scatter).
      const auto parts = cp_tokens_to_heads(at::cat({qs, kv}, -1), *c.cp).narrow(0, 0, tokens).split_with_sizes({dqk, nope_ + v_}, -1);
      qs = parts[0];  // (T, n/cp, dqk)
      kv = parts[1];  // (T, n/cp, dn+dv)
      k_shared = gather_from_sp(k_shared.contiguous(), *c.cp).narrow(0, 0, tokens);  // (T, dr)
      n /= c.cp->size();
    }
    const auto q_parts = qs.split_with_sizes({nope_, rope_}, -1);   // (T, n, dn), (T, n, dr)
    const auto kv_parts = kv.split_with_sizes({nope_, v_}, -1);     // (T, n, dn), (T, n, dv)
    at::Tensor q_rot = q_parts[1], k_rot = k_shared.unsqueeze(1);   // (T, n, dr), (T, 1, dr)
    const rope_tables& rope = c.rope;  // the whole stream's positions; interleaved: DeepSeek's pairs, held as halves after
    q_rot = apply_rope(q_rot, rope, interleave_);
    k_rot = apply_rope(k_rot, rope, interleave_);
    // Each head is its own kv group (G = n, one query head each); v padded to q/k's width, since
    // the kernels take one head width, and cut back after.
    const at::Tensor qh = at::cat({q_parts[0], q_rot}, -1).unsqueeze(2);                          // (T, n, 1, dqk)
    const at::Tensor kh = at::cat({kv_parts[0], k_rot.expand({tokens, n, rope_})}, -1);           // (T, n, dqk)
    const at::Tensor vh = dqk > v_ ? at::constant_pad_nd(kv_parts[1], {0, dqk - v_}) : kv_parts[1];  // (T, n, dqk)
    const std::int64_t first_head = c.tp_rank * heads_ + (c.cp != nullptr ? c.cp->rank() * n : 0);  // n: the core's heads
    const attention_math math{scale_, 0.0, window_, 0, {}, attention_dropout_of(c, first_head)};
    attention_core core = attention_kernel::over(pk, math);
    at::Tensor a = selective_recompute_ ? recompute_in_backward(std::move(core), qh, kh, vh) : core(qh, kh, vh);
    a = a.view({tokens, n, dqk}).narrow(-1, 0, v_).reshape({tokens, n * v_});  // (T, n*dv)
    if (stream > tokens) a = at::constant_pad_nd(a, {0, 0, 0, stream - tokens});  // (T', n*dv)
    if (c.cp != nullptr) a = cp_heads_to_tokens(a, *c.cp);                         // (T'/cp, heads*dv)
    return c.row(a, o_);  // (T'/cp/tp or T'/cp, H)
  }

 private:
  // Ring context parallelism: this cp rank's rows (its share, chunks i and 2 cp - 1 - i of every
  // sequence) of every head of its tp rank, attending over every rank's k/v blocks passed around
  // the ring (layers/ring_attention.hpp; v at its own width) -> (rows, n*dv). Under a2a+ring the
  // rotated [q | k_nope | v] of each head go by all-to-all within the a2a group (the a2a group's
  // rows of 1/cp_a2a of the heads), the shared rotary key is gathered over it, and the output
  // comes back by the inverse all-to-all (Ulysses' traffic over cp_a2a ranks).
  // qs (rows, n, dqk), kv (rows, n, dn+dv), k_shared (rows, dr).
  at::Tensor ring_core(const at::Tensor& qs, const at::Tensor& kv, const at::Tensor& k_shared, const layer_context& c) const {
    if (attention_dropout_of(c, c.tp_rank * heads_).p > 0)
      throw std::invalid_argument("megadsl: attention dropout under ring context parallelism is not built yet; train with "
                                  "attention_dropout 0 or cp_comm a2a");
    const auto q_parts = qs.split_with_sizes({nope_, rope_}, -1);   // (rows, n, dn), (rows, n, dr)
    // (Under the ring c.rope is already this rank's rows' tables.)
    at::Tensor q_rot = apply_rope(q_parts[1], c.rope, interleave_);              // (rows, n, dr)
    at::Tensor k_rot = apply_rope(k_shared.unsqueeze(1), c.rope, interleave_);  // (rows, 1, dr)
    at::Tensor q_nope = q_parts[0], kv_heads = kv;
    if (c.ring_a2a != nullptr) {  // -> (a rows, n/a, ...) of this a2a rank's heads; k_rot (a rows, 1, dr)
      const auto parts = cp_tokens_to_heads(at::cat({q_nope, q_rot, kv_heads}, -1), *c.ring_a2a)
                             .split_with_sizes({nope_, rope_, nope_ + v_}, -1);
      q_nope = parts[0], q_rot = parts[1], kv_heads = parts[2];
      k_rot = gather_from_sp(k_rot.squeeze(1).contiguous(), *c.ring_a2a).unsqueeze(1);
    }
    const std::int64_t t = q_nope.size(0), n = q_nope.size(1);
    const auto kv_parts = kv_heads.split_with_sizes({nope_, v_}, -1);  // (t, n, dn), (t, n, dv)
    const at::Tensor qh = at::cat({q_nope, q_rot}, -1).permute({1, 0, 2});  // (n, t, dqk)
    const at::Tensor kh = at::cat({kv_parts[0], k_rot.expand({t, n, rope_})}, -1).permute({1, 0, 2}).contiguous();
    const at::Tensor vh = kv_parts[1].permute({1, 0, 2}).contiguous();  // (n, t, dv)
    const at::Tensor a = ring_attention(qh, kh, vh, *c.ring_rows, scale_, {.window = window_, .parts = c.ring_a2a != nullptr ? c.ring_a2a->size() : 1}, *c.ring)
                             .permute({1, 0, 2})
                             .reshape({t, n * v_});  // (t, n*dv)
    return c.ring_a2a != nullptr ? cp_heads_to_tokens(a, *c.ring_a2a) : a;  // (rows, heads*dv)
  }

  at::Tensor q_down_, q_norm_, q_up_, q_proj_;  // (rq, H), (rq) replicated; (n*dqk/tp, rq | H) this rank's heads
  at::Tensor kv_down_, kv_norm_, kv_up_;        // (r + dr, H), (r) replicated; (n*(dn+dv)/tp, r)
  at::Tensor o_;                                // (H, n*dv/tp)
  std::int64_t heads_ = 0, nope_ = 0, rope_ = 0, v_ = 0, rank_ = 0, window_ = 0;
  double scale_ = 0;  // the scores' scale
  bool interleave_ = false, selective_recompute_ = false;
};

}  // namespace

std::unique_ptr<block_module> modules::mla(const block_build& b) { return std::make_unique<megadsl::mla>(b); }

}  // namespace megadsl
