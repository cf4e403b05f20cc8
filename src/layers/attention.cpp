// Grouped-query self-attention split over tp by kv groups: the fused q/k/v projection
// (column-parallel, per local group [q heads | k | v]), optional q/k norms, RoPE, causal attention
// over padded rows or packed sequences (cu_seqlens), the row-parallel output projection. Under
// context parallelism q, k and v travel by all-to-all from this rank's tokens of every head to the
// whole stream of 1/cp of the heads (Ulysses: the core sees whole sequences, any window or
// length), and the heads' output back. gpt-oss's learned sinks (one logit per query head) go with
// their heads: this rank's share over tp, and of that the cp rank's share.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "megadsl/blocks/attention.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/dropout.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/recompute.hpp"
#include "megadsl/layers/ring_attention.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/shard_plan.hpp"

namespace megadsl {
namespace {

// What the attention reads from the model once: this rank's heads, the score scale (Gemma2's
// query_pre_attn_scalar, or the knobs' key: Granite's attention_multiplier), soft-cap and
// window of its layer, and its q/k norm (the block's child, if any).
struct attention_settings {
  qkv_rank_layout qkv;      // this rank's kv groups and query heads
  double scale = 0;         // the scores' scale; 0: 1 / sqrt(head_dim)
  double softcap = 0;       // Gemma2's tanh soft-cap of the scores; 0: none
  std::int64_t window = 0;  // this layer's sliding window; 0: none
  std::int64_t chunk = 0;   // Llama 4's attention chunk of this layer; 0: none
  double floor_scale = 0, temperature = 0;  // Llama 4's NoPE layers' q scale per position; floor_scale 0: none
  bool rope = true;         // false: a NoPE layer (the block's setting 1)
  bool interleaved = false; // RoPE on interleaved pairs (the shape's rope_interleave: ERNIE 4.5)
  bool norm_after_rope = false;  // the q/k norm on the rotated q and k (HunYuan; cp 1 by its rule)
  bool selective_recompute = false;
  std::unique_ptr<qk_norm_module> qk_norm;  // null: none

  explicit attention_settings(const block_build& b) : qkv(qkv_layout(b.s(), b.args.l, b.args.tp_rank)) {
    const shape& s = b.s();
    // Gemma2 scales the scores by query_pre_attn_scalar^-1/2 (0: the kernels' 1 / sqrt(head_dim)).
    if (const double q = s.query_pre_attn_scalar.get(); q != 0) scale = std::pow(q, -0.5);  // as Python computes it
    softcap = s.attn_softcap.get();
    window = b.args.options.attention_window.of(b.params.layer);
    const blocks::attention_knobs& k = b.knobs<blocks::attention_knobs>();
    if (k.score_scale != nullptr) scale = b.setting(k.score_scale->key);  // Granite: the scale outright
    rope = k.rope;
    if (k.chunked) chunk = static_cast<std::int64_t>(b.setting(blocks::attention_chunk_size.key));
    if (k.temperature && b.setting(blocks::attn_temperature_tuning.key) != 0) {
      floor_scale = b.setting(blocks::floor_scale.key);
      temperature = b.setting(blocks::attn_scale.key);
    }
    interleaved = s.rope_interleave.get();
    selective_recompute = b.args.l.recompute.get() == recompute_kind::selective;
    if (b.children() > 0) qk_norm = b.child_as<qk_norm_module>(0);
    norm_after_rope = qk_norm != nullptr && qk_norm->after_rope();
  }
};

// RoPE tables (T, r) of the real tokens -> those of stream rows [first, first + rows), the rows
// past the real tokens zero (padding, which reaches no result).
rope_tables rows_of(const rope_tables& t, std::int64_t first, std::int64_t rows) {
  const std::int64_t start = std::min(first, t.cos.size(0)), real = std::min(rows, t.cos.size(0) - start);
  const auto cut = [&](const at::Tensor& x) { return at::constant_pad_nd(x.narrow(0, start, real), {0, 0, 0, rows - real}); };
  return {cut(t.cos), cut(t.sin)};
}

class attention final : public layer_module {
 public:
  explicit attention(const block_build& b)
      : qkv_(b.require("qkv.weight")), qkv_bias_(b.find("qkv.bias")), o_(b.require("o_proj.weight")),
        o_bias_(b.find("o_proj.bias")), sinks_(b.find("sinks")), s_(b) {
    // The recomputed core's backward returns gradients for q, k and v only, not for the sinks.
    if (sinks_.defined()) s_.selective_recompute = false;
  }

  at::Tensor forward(const at::Tensor& h, layer_context& c) override {
    const packed_tokens& pk = c.sequences();  // the whole stream: this rank's share at cp > 1
    const std::int64_t tokens = pk.tokens, stream = pk.ids.size(0);
    const qkv_rank_layout& g = s_.qkv;
    at::Tensor qkv = c.column(h, qkv_, qkv_bias_);            // (T'/cp, G*(Q+2)*d)
    const std::int64_t rows = c.cp != nullptr ? qkv.size(0) : tokens;
    if (qkv.size(0) != rows) qkv = qkv.narrow(0, 0, rows);   // SP padding rows: (T, ...)
    const at::Tensor grouped = qkv.view({rows, g.groups, g.q_per_group + 2, g.head_dim});
    // One split (its backward is one concatenation), not three views whose backwards each
    // zero-fill a buffer of qkv's size.
    const auto parts = grouped.split_with_sizes({g.q_per_group, 1, 1}, 2);
    at::Tensor q = parts[0], k = parts[1].squeeze(2), v = parts[2].squeeze(2);  // (rows, G, Q, d), (rows, G, d) x2
    if (s_.qk_norm && !s_.norm_after_rope) s_.qk_norm->apply(q, k, c);  // this rank's tokens of all its heads (a full-width norm spans them)
    if (s_.norm_after_rope) {  // HunYuan: RoPE, then the norm; the core rotates nothing more
      if (s_.rope) {
        // At cp > 1 this rank holds rows [rank rows, (rank + 1) rows) of the stream: their tables.
        // (Under ring cp `rope` is already this rank's rows' tables.)
        const rope_tables mine = c.cp != nullptr && !cp_ring(c.l) ? rows_of(c.rope, c.cp->rank() * rows, rows) : c.rope;
        q = apply_rope(q, mine, s_.interleaved);
        k = apply_rope(k, mine, s_.interleaved);
      }
      s_.qk_norm->apply(q, k, c);
    }
    if (c.cp != nullptr && cp_ring(c.l)) return c.row(ring_core(q, k, v, c), o_, o_bias_);  // (T'/cp/tp or T'/cp, h)
    if (c.cp != nullptr) cp_whole_stream_heads(s_.qk_norm ? at::Tensor() : grouped, q, k, v, tokens, *c.cp);
    at::Tensor sinks;  // (heads of the core): this rank's, of them this cp rank's share
    if (sinks_.defined()) {
      sinks = c.w(sinks_);
      if (c.cp != nullptr) {
        const std::int64_t share = sinks.size(0) / c.cp->size();
        sinks = sinks.narrow(0, c.cp->rank() * share, share);
      }
    }
    // The core's first global query head: this rank's first, and at cp > 1 its cp rank's share of them.
    const std::int64_t first_head = g.first_q_head + (c.cp != nullptr ? c.cp->rank() * g.groups * g.q_per_group / c.cp->size() : 0);
    const attention_math math{s_.scale, s_.softcap, s_.window, s_.chunk, sinks, attention_dropout_of(c, first_head)};
    // Llama 4's temperature tuning (NoPE layers): q times 1 + attn_scale * ln(1 + floor((p + 1) /
    // floor_scale)) at each token's position p in its sequence, in fp32 (HF counts the row index,
    // which is the position in an unpadded or right-padded row).
    at::Tensor q_scale;  // (T, 1, 1, 1) fp32: the whole stream's real tokens
    if (s_.floor_scale != 0)
      q_scale = (at::log1p(at::floor((pk.positions.narrow(0, 0, tokens).to(at::kFloat) + 1.0) / s_.floor_scale)) * s_.temperature + 1.0)
                    .view({tokens, 1, 1, 1});
    // The attention core, RoPE then the kernel: (T, G, Q, d), (T, G, d) x2 -> (T, G*Q*d). Under
    // selective recompute only q, k, v are kept and the core runs again in the backward.
    attention_core core = [rope = c.rope, rotate = s_.rope && !s_.norm_after_rope, pairs = s_.interleaved,
                           kernel = attention_kernel::over(pk, math), q_scale](
                              const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in) {
      const at::Tensor qt = q_scale.defined() ? (q_in.to(at::kFloat) * q_scale).to(q_in.scalar_type()) : q_in;
      const at::Tensor qr = rotate ? apply_rope(qt, rope, pairs) : qt, kr = rotate ? apply_rope(k_in, rope, pairs) : k_in;
      return kernel(qr, kr, v_in);
    };
    at::Tensor a = s_.selective_recompute ? recompute_in_backward(std::move(core), q, k, v) : core(q, k, v);
    if (stream > tokens) a = at::constant_pad_nd(a, {0, 0, 0, stream - tokens});  // (T', G*Q*d)
    if (c.cp != nullptr) a = cp_heads_to_tokens(a, *c.cp);                         // (T'/cp, G*Q*d)
    return c.row(a, o_, o_bias_);  // (T'/cp/tp or T'/cp, h)
  }

 private:
  // Ring context parallelism: q (rows, G, Q, d), k and v (rows, G, d) of this cp rank's share
  // (chunks i and 2 cp - 1 - i of every sequence), rotated at its rows' positions, attending over
  // every rank's k/v blocks passed around the ring (layers/ring_attention.hpp) -> (rows, G*Q*d).
  // Under a2a+ring the rotated q, k, v first go by all-to-all within the a2a group (Ulysses' split
  // of the heads over cp_a2a ranks), the ring runs over the group's rows of this rank's heads, and
  // the output comes back by the inverse all-to-all.
  at::Tensor ring_core(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const layer_context& c) const {
    const packed_tokens& pk = c.pk;  // this rank's share: its real tokens, then padding rows
    const std::int64_t rows = q_in.size(0), groups = q_in.size(1), per_group = q_in.size(2), d = q_in.size(3);
    if (attention_dropout_of(c, 0).p > 0)
      throw std::invalid_argument("megadsl: attention dropout under ring context parallelism is not built yet; train with "
                                  "attention_dropout 0 or cp_comm a2a");
    at::Tensor q = q_in, k = k_in, v = v_in;
    if (s_.floor_scale != 0) {  // Llama 4's NoPE layers: q scaled at each row's position
      const at::Tensor scale = (at::log1p(at::floor((pk.positions.to(at::kFloat) + 1.0) / s_.floor_scale)) * s_.temperature + 1.0);
      q = (q.to(at::kFloat) * scale.view({rows, 1, 1, 1})).to(q.scalar_type());
    }
    if (s_.rope && !s_.norm_after_rope) q = apply_rope(q, c.rope, s_.interleaved), k = apply_rope(k, c.rope, s_.interleaved);
    at::Tensor sinks = sinks_.defined() ? c.w(sinks_) : at::Tensor();  // (G*Q) this tp rank's
    if (c.ring_a2a != nullptr) {  // (a rows, G', Q', d), (a rows, G', d) x2: this a2a rank's heads
      const std::int64_t a2a = c.ring_a2a->size(), share = groups * per_group / a2a;
      cp_whole_stream_heads({}, q, k, v, a2a * rows, *c.ring_a2a);
      if (sinks.defined()) sinks = sinks.narrow(0, c.ring_a2a->rank() * share, share);
    }
    const std::int64_t n = q.size(0), heads = q.size(1) * q.size(2);
    const double scale = s_.scale != 0 ? s_.scale : 1.0 / std::sqrt(static_cast<double>(d));
    at::Tensor a = ring_attention(q.permute({1, 2, 0, 3}).reshape({heads, n, d}), k.permute({1, 0, 2}).contiguous(),
                                  v.permute({1, 0, 2}).contiguous(), *c.ring_rows, scale,
                                  {.window = s_.window, .chunk = s_.chunk, .softcap = s_.softcap,
                                   .parts = c.ring_a2a != nullptr ? c.ring_a2a->size() : 1, .sinks = sinks},
                                  *c.ring);
    a = a.view({heads, n, d}).permute({1, 0, 2}).reshape({n, heads * d});  // (n, heads*d)
    return c.ring_a2a != nullptr ? cp_heads_to_tokens(a, *c.ring_a2a) : a;  // (rows, G*Q*d)
  }

  at::Tensor qkv_, qkv_bias_;  // (G*(Q+2)*d [, h]) this rank's groups
  at::Tensor o_, o_bias_;      // (h, heads*d/tp), (h)
  at::Tensor sinks_;           // (heads/tp): the learned sink logits of this rank's query heads (gpt-oss)
  attention_settings s_;
};

}  // namespace

std::unique_ptr<block_module> modules::attention(const block_build& b) { return std::make_unique<megadsl::attention>(b); }

}  // namespace megadsl
