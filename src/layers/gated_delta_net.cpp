// The gated DeltaNet (Qwen3-Next's, Qwen3.5's) on this tp rank's key heads and their value heads:
// the column-parallel input projections (Qwen3-Next's in_proj_qkvz / in_proj_ba grouped per key
// head, or Qwen3.5's in_proj_qkv / in_proj_z / in_proj_b / in_proj_a: the block's setting 1), the causal depthwise conv and SiLU over this rank's
// channels of [q | k | v], the gated delta rule (chunked, layers/gated_delta_rule.hpp) from a zero
// state in each sequence, the gated RMSNorm per value head, the row-parallel out_proj. The rule
// runs on the batch's rows: padded rows as transformers runs them (padding zeroed before the
// projections, so a left-padded row starts from zero), packed sequences unpacked to their rows, so
// each restarts its conv history and state.
#include <ATen/ATen.h>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/gated_delta_rule.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace {

class gated_delta_net final : public layer_module {
 public:
  explicit gated_delta_net(const block_build& b)
      : split_(b.setting() == 1), conv_(b.require("conv1d.weight")), dt_bias_(b.require("dt_bias")),
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
    const std::int64_t tp = b.args.l.tp.get(), rank = b.args.tp_rank;
    key_heads_ = s.linear_key_heads.get() / tp;
    per_key_ = s.linear_value_heads.get() / s.linear_key_heads.get();
    dk_ = s.linear_key_dim.get();
    dv_ = s.linear_value_dim.get();
    eps_ = s.rms_eps.get();
    // This rank's conv channels: its q heads', its k heads', its v heads' (HF orders the conv's
    // channels [all q | all k | all v]).
    const std::int64_t key_width = s.linear_key_heads.get() * dk_, local_key = key_heads_ * dk_,
                       local_value = key_heads_ * per_key_ * dv_;
    channels_ = {rank * local_key, key_width + rank * local_key, 2 * key_width + rank * local_value};
    widths_ = {local_key, local_key, local_value};
  }

  at::Tensor forward(const at::Tensor& h, layer_context& c) override {
    const packed_tokens& pk = c.sequences();
    const std::int64_t tokens = pk.tokens, stream = pk.ids.size(0), nk = key_heads_, r = per_key_, nv = nk * r;
    const std::int64_t rows = pk.batch, len = pk.seq;
    at::Tensor x = c.to_tp(h);                               // (T', H) on every tp rank
    if (x.size(0) != tokens) x = x.narrow(0, 0, tokens);     // SP padding rows: (T, H)
    // Each row of the batch, zeros at its padding: (B, S, ...). mixed: this rank's conv channels
    // [q | k | v]; z (B, S, nv, dv); the rate's and the decay's inputs b, a (B, S, nv).
    const auto rows_of = [&](const at::Tensor& weight) { return pk.unpack(at::linear(x, c.w(weight))); };
    at::Tensor mixed, z, b_in, a_in;
    if (split_) {  // Qwen3.5: in_proj_qkv's rows here are already [q_r | k_r | v_r]
      mixed = rows_of(qkv_);
      z = rows_of(z_).view({rows, len, nv, dv_});
      b_in = rows_of(b_);
      a_in = rows_of(a_);
    } else {  // Qwen3-Next: per key head [q | k | v | z] and [b | a]
      const at::Tensor qkvz = rows_of(qkvz_).view({rows, len, nk, 2 * dk_ + 2 * r * dv_});
      const at::Tensor ba = rows_of(ba_).view({rows, len, nk, 2 * r});
      const auto parts = qkvz.split_with_sizes({dk_, dk_, r * dv_, r * dv_}, -1);
      const auto gates = ba.split_with_sizes({r, r}, -1);
      mixed = at::cat({parts[0].reshape({rows, len, nk * dk_}), parts[1].reshape({rows, len, nk * dk_}),
                       parts[2].reshape({rows, len, nv * dv_})}, -1);
      z = parts[3].reshape({rows, len, nv, dv_});
      b_in = gates[0].reshape({rows, len, nv});
      a_in = gates[1].reshape({rows, len, nv});
    }
    const at::Tensor w = c.w(conv_);                                                  // (C, K) every channel
    const at::Tensor local_w = at::cat({w.narrow(0, channels_[0], widths_[0]), w.narrow(0, channels_[1], widths_[1]),
                                        w.narrow(0, channels_[2], widths_[2])});      // (this rank's channels, K)
    const auto qkv = causal_conv1d_silu(mixed, local_w).split_with_sizes({nk * dk_, nk * dk_, nv * dv_}, -1);
    const at::Tensor q = qkv[0].view({rows, len, nk, dk_}), k = qkv[1].view({rows, len, nk, dk_});
    const at::Tensor v = qkv[2].view({rows, len, nv, dv_});
    const at::Tensor beta = b_in.sigmoid();
    // g = -exp(A_log) * softplus(a + dt_bias), in fp32 (the master values of A_log and dt_bias).
    const at::Tensor g = -a_log_.to(at::kFloat).exp() * at::softplus(a_in.to(at::kFloat) +
                                                                     dt_bias_.to(at::kFloat));
    const at::Tensor core = chunk_gated_delta_rule(q, k, v, g, beta);  // (B, S, nv, dv)
    // Qwen3NextRMSNormGated: w * rms_normed(x).to(dtype), times silu(z) in fp32, cast back.
    const at::Tensor cf = core.to(at::kFloat);
    const at::Tensor normed = c.w(norm_) * (cf * at::rsqrt(cf.pow(2).mean(-1, true) + eps_)).to(core.scalar_type());
    at::Tensor a = (normed * at::silu(z.to(at::kFloat))).to(core.scalar_type()).reshape({rows * len, nv * dv_});
    if (pk.rmpad) a = a.index_select(0, pk.index);                                 // (T, nv*dv) the packed stream
    if (stream > tokens) a = at::constant_pad_nd(a, {0, 0, 0, stream - tokens});  // (T', nv*dv)
    return c.row(a, out_);  // (T'/tp or T', H)
  }

 private:
  bool split_ = false;        // Qwen3.5's projections (the block's setting 1)
  at::Tensor qkvz_, ba_;      // (nk/tp * (2 dk + 2 r dv), H), (nk/tp * 2 r, H): this rank's key heads
  at::Tensor qkv_, z_, b_, a_;  // ([q_r | k_r | v_r], H), (nv/tp * dv, H), (nv/tp, H) x2: Qwen3.5's
  at::Tensor conv_;           // (2 nk dk + nv dv, K) every channel, replicated
  at::Tensor dt_bias_, a_log_;  // (nv/tp) this rank's value heads
  at::Tensor norm_;           // (dv) replicated
  at::Tensor out_;            // (H, nv/tp * dv)
  std::int64_t key_heads_ = 0, per_key_ = 0, dk_ = 0, dv_ = 0;
  double eps_ = 1e-6;
  std::array<std::int64_t, 3> channels_{}, widths_{};  // this rank's q, k, v conv channels: first and count
};

}  // namespace

std::unique_ptr<block_module> modules::gated_delta_net(const block_build& b) {
  return std::make_unique<megadsl::gated_delta_net>(b);
}

}  // namespace megadsl
