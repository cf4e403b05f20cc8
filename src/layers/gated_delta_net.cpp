// The gated DeltaNet (Qwen3-Next's, Qwen3.5's) on this tp rank's key heads and their value heads:
// the column-parallel input projections (Qwen3-Next's in_proj_qkvz / in_proj_ba grouped per key
// head, or Qwen3.5's in_proj_qkv / in_proj_z / in_proj_b / in_proj_a: the block's setting 1), the
// causal depthwise conv and SiLU over this rank's channels of [q | k | v], the gated delta rule
// (chunked, layers/gated_delta_rule.hpp) from a zero state in each sequence, the gated RMSNorm per
// value head, the row-parallel out_proj. The conv and the rule run on the batch's rows: padded rows
// as transformers runs them (padding zeroed before the conv, so a left-padded row starts from
// zero), packed sequences unpacked to their rows, so each restarts its conv history and state.
// Under context parallelism (Ulysses) the per-key-head inputs of the conv and the rule go by one
// all-to-all from this cp rank's tokens to whole sequences of its share of the key heads, and the
// rule's output comes back by another; z, the norm and out_proj stay on this rank's tokens. Under
// selective recompute the rule keeps only its inputs and runs again in the backward.
#include <ATen/ATen.h>

#include "megadsl/layers/invariant.hpp"
#include "megadsl/blocks/gated_delta_net.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/gated_delta_rule.hpp"
#include "megadsl/layers/recompute.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace {

class gated_delta_net final : public layer_module {
 public:
  explicit gated_delta_net(const block_build& b)
      : split_(b.knobs<blocks::delta_net_knobs>().storage == blocks::delta_net_storage::split), conv_(b.require("conv1d.weight")), dt_bias_(b.require("dt_bias")),
        a_log_(b.require("A_log")), norm_(b.require("linear_norm.weight")), out_(b.require("out_proj.weight")) {
    if (split_) {
      qkv_ = b.require("in_proj_qkv.weight");
      z_ = b.require("in_proj_z.weight");
      b_ = b.require("in_proj_b.weight");
      a_ = b.require("in_proj_a.weight");
    } else {
      qkvz_ = b.require("in_proj_qkvz.weight");
      ba_ = b.require("in_proj_ba.weight");
    }
    const shape& s = b.s();
    const blocks::delta_net_sizes d = blocks::delta_net_sizes::of(s);  // its own keys
    key_heads_ = d.key_heads / b.args.l.tp.get();
    per_key_ = d.value_heads / d.key_heads;
    dk_ = d.key_dim;
    dv_ = d.value_dim;
    eps_ = s.rms_eps.get();
    selective_ = b.args.l.recompute.get() == recompute_kind::selective;
  }

  // Stream token t of sequence i at offset j -> i * S + j: each packed sequence from its row's start.
  static at::Tensor row_starts(const packed_tokens& pk) {
    std::vector<std::int64_t> at_row;
    at_row.reserve(static_cast<std::size_t>(pk.tokens));
    for (std::size_t i = 0; i + 1 < pk.cu_seqlens.size(); ++i)
      for (std::int64_t j = 0; j < pk.cu_seqlens[i + 1] - pk.cu_seqlens[i]; ++j)
        at_row.push_back(static_cast<std::int64_t>(i) * pk.seq + j);
    return at::tensor(at_row, at::kLong).to(pk.index.device());
  }

  at::Tensor forward(const at::Tensor& h, layer_context& c) override {
    const packed_tokens& pk = c.sequences();  // the whole stream: this rank's share at cp > 1
    const std::int64_t tokens = pk.tokens, stream = pk.ids.size(0), nk = key_heads_, r = per_key_, nv = nk * r;
    const std::int64_t batch = pk.batch, len = pk.seq, dk = dk_, dv = dv_;
    const std::int64_t cp = c.cp != nullptr ? c.cp->size() : 1, cp_rank = c.cp != nullptr ? c.cp->rank() : 0;
    const std::int64_t nkc = nk / cp, nvc = nkc * r;  // the key and value heads the rule runs here
    at::Tensor x = c.to_tp(h);                        // (T'/cp, H) on every tp rank
    const std::int64_t rows = c.cp != nullptr ? x.size(0) : tokens;
    if (x.size(0) != rows) x = x.narrow(0, 0, rows);  // SP padding rows: (T, H)
    // Per key head [q | k | v | b | a] of its value heads: (rows, nk, 2 dk + r dv + 2 r), and z (rows, nv, dv).
    at::Tensor heads, z;
    if (split_) {  // Qwen3.5: in_proj_qkv's rows here are [q_r | k_r | v_r], z / b / a per value head
      const auto qkv = c.linear(x, qkv_).split_with_sizes({nk * dk, nk * dk, nv * dv}, -1);
      heads = at::cat({qkv[0].view({rows, nk, dk}), qkv[1].view({rows, nk, dk}), qkv[2].view({rows, nk, r * dv}),
                       c.linear(x, b_).view({rows, nk, r}), c.linear(x, a_).view({rows, nk, r})}, -1);
      z = c.linear(x, z_).view({rows, nv, dv});
    } else {  // Qwen3-Next: per key head [q | k | v | z] and [b | a]
      const auto qkvz = c.linear(x, qkvz_).view({rows, nk, 2 * dk + 2 * r * dv}).split_with_sizes({2 * dk + r * dv, r * dv}, -1);
      heads = at::cat({qkvz[0], c.linear(x, ba_).view({rows, nk, 2 * r})}, -1);
      z = qkvz[1].reshape({rows, nv, dv});
    }
    // A padded batch: transformers zeroes the padding's input to the layer, so its output there is
    // zero (silu(z) = 0); the rule's own inputs are zeroed at padding by `unpack` below.
    if (!pk.rmpad && !pk.no_padding) {
      const at::Tensor valid = c.pk.token_valid.to(z.scalar_type());  // this rank's real tokens, a prefix of its rows
      z = z * at::constant_pad_nd(valid, {0, rows - valid.size(0)}).view({rows, 1, 1});
    }
    // Context parallelism (Ulysses): the whole stream of this cp rank's share of the key heads.
    if (c.cp != nullptr) heads = cp_tokens_to_heads(heads, *c.cp).narrow(0, 0, tokens);  // (T, nk/cp, W)
    // Each row of the batch, zeros at its padding (packed sequences each in its own row): (B, S, nkc, W).
    // Invariant arithmetic: each sequence from its row's start (packed streams only), so that its
    // chunks of the rule begin at its first token whatever the padding was.
    packed_tokens laid = pk;  // (tensors shared)
    if (c.l.invariant.get() && pk.rmpad) laid.index = row_starts(pk);
    const auto parts = laid.unpack(heads).split_with_sizes({dk, dk, r * dv, r, r}, -1);
    const at::Tensor mixed = at::cat({parts[0].reshape({batch, len, nkc * dk}), parts[1].reshape({batch, len, nkc * dk}),
                                      parts[2].reshape({batch, len, nvc * dv})}, -1);  // the conv's channels [q | k | v]
    // The conv's rows here are [q_r | k_r | v_r] (geo::column_slots); of each, this cp rank's heads'.
    at::Tensor w = c.w(conv_);  // (2 nk dk + nv dv, K) of this tp rank
    if (cp > 1)
      w = at::cat({w.narrow(0, cp_rank * nkc * dk, nkc * dk), w.narrow(0, nk * dk + cp_rank * nkc * dk, nkc * dk),
                   w.narrow(0, 2 * nk * dk + cp_rank * nvc * dv, nvc * dv)});
    const auto qkv = causal_conv1d_silu(mixed, w).split_with_sizes({nkc * dk, nkc * dk, nvc * dv}, -1);
    const at::Tensor q = qkv[0].view({batch, len, nkc, dk}), k = qkv[1].view({batch, len, nkc, dk});
    const at::Tensor v = qkv[2].view({batch, len, nvc, dv});
    const at::Tensor beta = pointwise(parts[3].reshape({batch, len, nvc}), [](const at::Tensor& t) { return at::sigmoid(t); });
    // g = -exp(A_log) * softplus(a + dt_bias), in fp32 (the master values of A_log and dt_bias).
    const auto share = [&](const at::Tensor& p) { return cp > 1 ? p.narrow(0, cp_rank * nvc, nvc) : p; };
    const at::Tensor g = -share(a_log_).to(at::kFloat).exp() *
                         pointwise(parts[4].reshape({batch, len, nvc}).to(at::kFloat) + share(dt_bias_).to(at::kFloat),
                                   [](const at::Tensor& t) { return at::softplus(t); });
    // Under selective recompute only the rule's inputs are kept: its chunks' intermediates are
    // computed again in the backward.
    at::Tensor core = selective_ ? recompute_in_backward(core_region([](const std::vector<at::Tensor>& x) {
                                     return chunk_gated_delta_rule(x[0], x[1], x[2], x[3], x[4]);
                                   }), {q, k, v, g, beta})
                                 : chunk_gated_delta_rule(q, k, v, g, beta);
    core = core.reshape({batch * len, nvc * dv});  // (B S, nvc*dv)
    if (pk.rmpad) core = core.index_select(0, laid.index);                                  // (T, nvc*dv) the packed stream
    if (stream > tokens) core = at::constant_pad_nd(core, {0, 0, 0, stream - tokens});      // (T', nvc*dv)
    if (c.cp != nullptr) core = cp_heads_to_tokens(core, *c.cp);                            // (T'/cp, nv*dv)
    else if (stream > tokens) z = at::constant_pad_nd(z, {0, 0, 0, 0, 0, stream - tokens});  // (T', nv, dv)
    // Qwen3NextRMSNormGated: w * rms_normed(x).to(dtype), times silu(z) in fp32, cast back.
    const at::Tensor cf = core.view({-1, nv, dv}).to(at::kFloat);
    const at::Tensor normed = c.w(norm_) * (cf * at::rsqrt(cf.pow(2).mean(-1, true) + eps_)).to(core.scalar_type());
    const at::Tensor a = (normed * pointwise(z.to(at::kFloat), [](const at::Tensor& t) { return at::silu(t); })).to(core.scalar_type()).reshape({-1, nv * dv});
    return c.row(a, out_);  // (T'/cp/tp or T'/cp, H)
  }

 private:
  bool split_ = false;          // Qwen3.5's projections (the block's setting 1)
  bool selective_ = false;      // selective recompute: the rule runs again in the backward
  at::Tensor qkvz_, ba_;        // (nk/tp * (2 dk + 2 r dv), H), (nk/tp * 2 r, H): this rank's key heads
  at::Tensor qkv_, z_, b_, a_;  // ([q_r | k_r | v_r], H), (nv/tp * dv, H), (nv/tp, H) x2: Qwen3.5's
  at::Tensor conv_;             // ([q_r | k_r | v_r], K): this rank's heads' channels
  at::Tensor dt_bias_, a_log_;  // (nv/tp) this rank's value heads
  at::Tensor norm_;             // (dv) replicated
  at::Tensor out_;              // (H, nv/tp * dv)
  std::int64_t key_heads_ = 0, per_key_ = 0, dk_ = 0, dv_ = 0;
  double eps_ = 1e-6;
};

}  // namespace

std::unique_ptr<block_module> modules::gated_delta_net(const block_build& b) {
  return std::make_unique<megadsl::gated_delta_net>(b);
}

}  // namespace megadsl
