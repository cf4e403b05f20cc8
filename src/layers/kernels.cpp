#include "megadsl/layers/kernels.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <utility>
#include <vector>

#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/dropout.hpp"
#include "megadsl/layers/fused_ops.hpp"
#include "megadsl/runtime/packing.hpp"

namespace megadsl {

attention_kernel attention_kernel::over(const packed_tokens& pk, const attention_math& m) {
  return {m, pk.rmpad, pk.cu_seqlens, pk.no_padding ? at::Tensor() : pk.attention_mask, pk.batch, pk.seq};
}

at::Tensor rope_inv_freq(const shape& s, std::int64_t seq_len) {
  // Partial rotary (GPT-NeoX): the frequencies of the rotated dimensions only.
  const std::int64_t d = rotary_dim(effective_head_dim(s).get(), s.rotary_fraction.get());
  double base = s.rope_theta;
  const rope_scaling& r = s.rope;
  const rope_type type = r.type;
  if (type == rope_type::dynamic_ntk && seq_len > s.max_positions.get()) {
    const double factor = r.factor;
    const double ratio = factor * static_cast<double>(seq_len) / static_cast<double>(s.max_positions.get()) - (factor - 1.0);
    base = base * std::pow(ratio, static_cast<double>(d) / static_cast<double>(d - 2));
  }
  // HF: 1 / base^(arange(0, d, 2) / d), computed in fp32 from int64 exponents.
  at::Tensor exponent = at::arange(0, d, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) / static_cast<double>(d);
  at::Tensor inv = 1.0 / at::pow(at::scalar_tensor(base, at::kFloat), exponent);
  if (type == rope_type::linear) inv = inv / static_cast<double>(r.factor);
  if (type == rope_type::llama3) {
    const double factor = r.factor, low = r.low_freq_factor, high = r.high_freq_factor;
    const double original = static_cast<double>(r.original_max_positions.get());
    const double low_wavelen = original / low, high_wavelen = original / high;
    const at::Tensor wavelen = 2.0 * std::numbers::pi / inv;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv / factor, inv);
    // (Llama 4 Scout's low = high = 1 leaves no medium band: the smooth factor's inf is never picked.)
    const at::Tensor smooth = (original / wavelen - low) / (high - low);
    const at::Tensor smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
    inv = at::where(medium, smoothed, scaled);
  }
  if (type == rope_type::yarn) {
    // transformers' _compute_yarn_parameters: interpolated (/ factor) below the ramp's low end,
    // extrapolated (as is) above its high end, blended linearly between, in fp32.
    const double factor = r.factor, original = static_cast<double>(r.original_max_positions.get());
    const double dd = static_cast<double>(d);
    const auto correction = [&](double rotations) {
      return dd * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    double low = correction(r.beta_fast), high = correction(r.beta_slow);
    if (r.truncate.get()) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dd - 1);
    if (low == high) high += 0.001;  // (transformers': no singularity)
    const at::Tensor pos_freqs = at::pow(at::scalar_tensor(base, at::kFloat), exponent);
    const at::Tensor extrapolation = 1.0 / pos_freqs, interpolation = 1.0 / (factor * pos_freqs);
    const at::Tensor ramp = at::clamp((at::arange(d / 2, at::TensorOptions().dtype(at::kFloat)) - low) / (high - low), 0, 1);
    const at::Tensor keep = 1 - ramp;  // the extrapolation's share
    inv = interpolation * (1 - keep) + extrapolation * keep;
  }
  return inv;
}

rope_tables rope_for_positions(const at::Tensor& inv_freq, const at::Tensor& positions, const shape& s) {
  const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);  // (T, d/2)
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                                        // (T, d)
  const double scale = rope_attention_factor(s.rope);  // YaRN's, on cos and sin alike (1 otherwise)
  if (scale != 1.0) return {emb.cos() * scale, emb.sin() * scale};
  return {emb.cos(), emb.sin()};
}

namespace {

// x's first 2h dimensions rotated by the half tables c, s (broadcastable to x's halves):
// o1 = x1 c - x2 s, o2 = x2 c + x1 s, which is HF's x * cos + rotate_half(x) * sin in the same
// roundings, written into one new tensor with one half-size temporary (the expression takes five
// full-size ones, and its backward zero-fills two more). With s negated it is its own backward.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s) {
  const std::int64_t half = c.size(-1);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  at::Tensor o1 = out.narrow(-1, 0, half), o2 = out.narrow(-1, half, half);
  at::Tensor t = at::mul(x2, s);
  at::mul_out(o1, x1, c).sub_(t);
  at::mul_out(t, x1, s);
  at::mul_out(o2, x2, c).add_(t);
  return out;
}

struct rope_fn : torch::autograd::Function<rope_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& c,
                            const at::Tensor& s) {
    ctx->save_for_backward({c, s});
    return rotate(x, c, s);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rotate(grads[0], saved[0], saved[1].neg()), {}, {}};  // the transposed rotation
  }
};

}  // namespace

at::Tensor apply_rope(const at::Tensor& x, const rope_tables& t, bool interleaved) {
  const std::int64_t rotated_dims = t.cos.size(-1);
  if (rotated_dims < x.size(-1)) {  // partial rotary: the first dims rotate, the rest pass through
    const auto parts = x.split_with_sizes({rotated_dims, x.size(-1) - rotated_dims}, -1);
    return at::cat({apply_rope(parts[0], t, interleaved), parts[1]}, -1);
  }
  if (interleaved)  // pairs as halves, then the rotation of halves
    return apply_rope(at::cat({x.slice(-1, 0, rotated_dims, 2), x.slice(-1, 1, rotated_dims, 2)}, -1), t);
  // The tables are cat(freqs, freqs): both halves of cos (of sin) are the same numbers.
  const std::int64_t half = rotated_dims / 2;
  if (fused_kernels_take(x) && x.dim() >= 2 && x.dim() <= 4 && x.stride(-1) == 1)  // one kernel each way
    return fused_rope(x, t.cos.narrow(-1, 0, half).reshape({x.size(0), half}),
                      t.sin.narrow(-1, 0, half).reshape({x.size(0), half}));
  std::vector<std::int64_t> view(static_cast<std::size_t>(x.dim()), 1);
  view.front() = x.size(0);
  view.back() = half;
  const at::Tensor cos = t.cos.narrow(-1, 0, half).to(x.scalar_type()).reshape(view);  // (T, 1.., d/2)
  const at::Tensor sin = t.sin.narrow(-1, 0, half).to(x.scalar_type()).reshape(view);
  return rope_fn::apply(x, cos, sin);
}

// Attention goes through LibTorch's fused scaled-dot-product kernels (flash on CUDA and on the
// CPU, memory-efficient where flash does not apply): no (s, s) score matrix is kept for the backward.
// Grouped-query heads are passed as they are (enable_gqa): query head g*Q + i reads kv head g. A
// soft-cap is not something the fused kernels do: those layers take the explicit path, as HF's
// eager attention does (HF has no fused path for Gemma2 either). gpt-oss's sinks take the CPU
// flash kernel with its log-sum-exp (sink_attention_fn) where every row has a visible key, and the
// explicit path elsewhere (a padded batch, CUDA).

namespace {

std::optional<double> scale_of(const attention_math& m) {
  return m.scale != 0 ? std::optional<double>(m.scale) : std::nullopt;
}

// (s, s) bool: causal, inside the window when there is one, and within one chunk when there are
// chunks (a sequence's positions 0, 1, ...).
at::Tensor causal_mask(std::int64_t seq, const attention_math& m, const at::TensorOptions& o) {
  at::Tensor causal = at::ones({seq, seq}, o.dtype(at::kBool)).tril();
  if (m.window > 0 && m.window < seq) causal = causal.triu(1 - m.window);
  if (m.chunk > 0 && m.chunk < seq) {
    const at::Tensor id = at::floor_divide(at::arange(seq, o.dtype(at::kLong)), m.chunk);  // (s)
    causal = causal & id.unsqueeze(1).eq(id.unsqueeze(0));
  }
  return causal;
}

// Whether the mask cuts a causal sequence of `seq` tokens (a window or chunks shorter than it).
bool cuts(const attention_math& m, std::int64_t seq) {
  return (m.window > 0 && m.window < seq) || (m.chunk > 0 && m.chunk < seq);
}

// softmax(cap * tanh(q k^T * scale / cap) masked) v, the softmax in fp32 (HF's eager order).
// qb: (b, H, s, d), kb, vb: (b, G, s, d), allowed: bool broadcastable to (b, H, s, s).
// With sinks (H): each row's softmax has one more logit, the head's sink, unscaled, unmasked and
// without a value (gpt-oss's eager_attention_forward): the column is appended, then dropped.
// With dropout the probabilities (without the sink's) are masked, m.dropout's keys and positions
// being the b * s rows' (HF: dropout after the softmax, before the product with v).
at::Tensor attention_explicit(const at::Tensor& qb, const at::Tensor& kb, const at::Tensor& vb,
                              const at::Tensor& allowed, const attention_math& m) {
  const std::int64_t per_group = qb.size(1) / kb.size(1);
  const at::Tensor k = per_group == 1 ? kb : kb.repeat_interleave(per_group, 1);
  const at::Tensor v = per_group == 1 ? vb : vb.repeat_interleave(per_group, 1);
  const double scale = m.scale != 0 ? m.scale : 1.0 / std::sqrt(static_cast<double>(qb.size(-1)));
  // The scores in fp32 whatever the compute dtype: the soft-cap's tanh, the mask's fill value
  // (float's lowest, which bf16 cannot hold) and the softmax over them.
  at::Tensor scores = at::matmul(qb, k.transpose(-1, -2)).to(at::kFloat) * scale;  // (b, H, s, s) fp32
  if (m.softcap != 0) scores = at::tanh(scores / m.softcap) * m.softcap;
  scores = scores.masked_fill(allowed.logical_not(), std::numeric_limits<float>::lowest());
  const std::int64_t b = scores.size(0), heads = scores.size(1), s = scores.size(2);
  at::Tensor probs;  // (b, H, s, s) fp32
  if (m.sinks.defined()) {
    const at::Tensor sink = m.sinks.to(at::kFloat).view({1, heads, 1, 1}).expand({b, heads, s, 1});
    probs = at::softmax(at::cat({scores, sink}, -1), -1).narrow(-1, 0, scores.size(3));
  } else {
    probs = at::softmax(scores, -1);
  }
  if (m.dropout.p > 0)
    probs = probs * attention_keep(m.dropout.keys.view({b, s}), m.dropout.positions.view({b, s}), heads, m.dropout);
  return at::matmul(probs.to(qb.scalar_type()), v);  // (b, H, s, d)
}

// gpt-oss's sinks through the fused CPU kernel (flash attention with its log-sum-exp L per row):
// softmax over [scores | sink] is the kernel's softmax times c = sigmoid(L - sink), so O' = O c,
// without the (s, s) scores. Backward: the kernel's own, given dO c and O' (its row term
// sum(dO c * O') is then the one the sink's softmax needs), and d sink = -sum (1 - c)(dO . O').
// q, k, v: (b, H, s, d) (kv heads already expanded); sinks (H); mask: additive (1, 1, s, s) or
// undefined with `causal`.
struct sink_attention_fn : torch::autograd::Function<sink_attention_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& sinks, const std::optional<at::Tensor>& m, bool causal,
                            double scale) {
    const std::optional<double> sc = scale != 0 ? std::optional<double>(scale) : std::nullopt;
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, m, sc);  // (b, H, s, d), (b, H, s)
    const at::Tensor c = pointwise(lse - sinks.to(at::kFloat).view({1, -1, 1}), [](const at::Tensor& t) { return at::sigmoid(t); }).unsqueeze(-1);  // (b, H, s, 1) fp32
    const at::Tensor out = (o.to(at::kFloat) * c).to(o.scalar_type());
    ctx->save_for_backward({q, k, v, out, lse, c});
    if (m) ctx->saved_data["mask"] = *m;  // (not a differentiable input: no gradient)
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4], &c = saved[5];
    const auto found = ctx->saved_data.find("mask");
    const std::optional<at::Tensor> mask =
        found != ctx->saved_data.end() ? std::optional<at::Tensor>(found->second.toTensor()) : std::nullopt;
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor g = grads[0].to(at::kFloat);
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        (g * c).to(q.scalar_type()).contiguous(), q, k, v, out, lse, 0.0, ctx->saved_data["causal"].toBool(), mask,
        scale != 0 ? std::optional<double>(scale) : std::nullopt);
    const at::Tensor dsinks = -((1.0 - c) * (g * out.to(at::kFloat)).sum(-1, true)).sum({0, 2, 3});  // (H)
    return {dq, dk, dv, dsinks, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Whether the sinks can take the fused kernel: on the CPU (the CUDA path keeps the explicit
// scores for now), without a soft-cap, every row with a visible key (no key mask: a padded batch's
// pad rows would have none, and the kernel's backward no finite log-sum-exp for them).
bool fused_sinks_apply(const at::Tensor& q, const at::Tensor& key_mask, const attention_math& m) {
  return m.sinks.defined() && m.softcap == 0 && m.dropout.p == 0 && !key_mask.defined() && q.device().is_cpu() &&
         (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16);
}

// (b, H, s, d) = the sinks' attention of one batch of equal rows: causal, cut by the window or chunks.
at::Tensor attention_sinks_fused(const at::Tensor& qb, const at::Tensor& kb, const at::Tensor& vb, const attention_math& m) {
  const std::int64_t per_group = qb.size(1) / kb.size(1), seq = qb.size(2);
  const at::Tensor k = per_group == 1 ? kb : kb.repeat_interleave(per_group, 1);
  const at::Tensor v = per_group == 1 ? vb : vb.repeat_interleave(per_group, 1);
  at::Tensor mask;  // additive: 0 where visible, -inf elsewhere
  if (cuts(m, seq))
    mask = at::zeros({1, 1, seq, seq}, qb.options())
               .masked_fill(causal_mask(seq, m, qb.options()).logical_not().view({1, 1, seq, seq}),
                            -std::numeric_limits<double>::infinity());
  return sink_attention_fn::apply(qb, k, v, m.sinks, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
                                  !mask.defined(), m.scale);
}

}  // namespace

at::Tensor attention_padded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_mask, std::int64_t batch, std::int64_t seq,
                            const attention_math& m) {
  const std::int64_t groups = q.size(1), per_group = q.size(2), d = q.size(3);
  const at::Tensor qb = q.reshape({batch, seq, groups * per_group, d}).transpose(1, 2);  // (b, G*Q, s, d)
  const at::Tensor kb = k.view({batch, seq, groups, d}).transpose(1, 2);                  // (b, G, s, d)
  const at::Tensor vb = v.view({batch, seq, groups, d}).transpose(1, 2);
  // Without padding (no key mask) and without a window the fused kernel's own causal flag: no mask
  // is built and the blocks above the diagonal are skipped, half the work of a masked call.
  if (!key_mask.defined() && m.softcap == 0 && !m.sinks.defined() && m.dropout.p == 0 && !cuts(m, seq))
    return at::scaled_dot_product_attention(qb, kb, vb, std::nullopt, 0.0, /*is_causal=*/true, scale_of(m),
                                            /*enable_gqa=*/true)
        .transpose(1, 2)
        .reshape({batch * seq, groups * per_group * d});
  if (fused_sinks_apply(q, key_mask, m))
    return attention_sinks_fused(qb, kb, vb, m).transpose(1, 2).reshape({batch * seq, groups * per_group * d});
  // (b, 1, s, s) bool: causal (within the window) and a real key. A query with no visible key (a
  // left-pad row) gets zeros or a uniform mix from the kernel; its row never reaches a result.
  at::Tensor allowed;
  if (key_mask.defined() && m.chunk > 0 && m.chunk < seq) {
    // Chunks by each row's positions (its real tokens counted from 0, as pack_tokens numbers them:
    // HF's chunks start at a row's first real token too).
    attention_math unchunked = m;
    unchunked.chunk = 0;
    const at::Tensor real = key_mask.to(at::kBool);                                           // (b, s)
    const at::Tensor id = at::floor_divide((real.to(at::kLong).cumsum(1) - 1).clamp_min(0), m.chunk);  // (b, s)
    allowed = causal_mask(seq, unchunked, q.options()).view({1, 1, seq, seq}) & real.view({batch, 1, 1, seq}) &
              id.unsqueeze(2).eq(id.unsqueeze(1)).unsqueeze(1);
  } else {
    const at::Tensor causal = causal_mask(seq, m, q.options()).view({1, 1, seq, seq});
    allowed = key_mask.defined() ? causal & key_mask.to(at::kBool).view({batch, 1, 1, seq}) : causal;
  }
  const at::Tensor out = m.softcap != 0 || m.sinks.defined() || m.dropout.p > 0
                             ? attention_explicit(qb, kb, vb, allowed, m)
                             : at::scaled_dot_product_attention(qb, kb, vb, allowed, 0.0, false, scale_of(m),
                                                                /*enable_gqa=*/true);  // (b, G*Q, s, d)
  return out.transpose(1, 2).reshape({batch * seq, groups * per_group * d});
}

namespace {

// The variable-length flash kernel (CUDA, bf16/fp16): one call for the whole packed stream, a
// window as the kernel's own left window, chunks as sequences of their own.
bool varlen_flash_applies(const at::Tensor& q, const attention_math& m) {
  return q.is_cuda() && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) && q.size(-1) <= 256 &&
         q.size(-1) % 8 == 0 && m.softcap == 0 && !m.sinks.defined() && m.dropout.p == 0;
}

// The offsets as the kernel takes them (int32 on q's device), made once per packing: every layer of
// a step passes the same ones (or one of two, where chunked layers alternate with others), and
// each copy from pageable host memory waits for the GPU to reach it (a host synchronisation per
// layer, which keeps the host from running ahead of the GPU). The last 4 are kept.
at::Tensor device_offsets(const std::vector<std::int64_t>& offsets, const at::Device& device) {
  thread_local std::vector<std::pair<std::vector<std::int64_t>, at::Tensor>> recent;  // newest first
  for (std::size_t i = 0; i < recent.size(); ++i)
    if (recent[i].second.device() == device && recent[i].first == offsets) {
      std::rotate(recent.begin(), recent.begin() + static_cast<std::ptrdiff_t>(i),
                  recent.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return recent.front().second;
    }
  at::Tensor value = at::tensor(std::vector<std::int32_t>(offsets.begin(), offsets.end()),
                                at::TensorOptions().dtype(at::kInt))
                         .to(device);
  recent.insert(recent.begin(), {offsets, value});
  if (recent.size() > 4) recent.pop_back();
  return value;
}

at::Tensor attention_varlen_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::vector<std::int64_t>& cu_seqlens, const attention_math& m) {
  const std::int64_t tokens = q.size(0), groups = q.size(1), per_group = q.size(2), d = q.size(3);
  // Llama 4's chunks: each sequence cut every `chunk` tokens from its first (its positions count
  // from 0 there), each piece a sequence of its own: the block-diagonal mask, without a mask.
  std::vector<std::int64_t> bounds;
  if (m.chunk > 0) {
    bounds.push_back(cu_seqlens.front());
    for (std::size_t i = 0; i + 1 < cu_seqlens.size(); ++i) {
      for (std::int64_t cut = cu_seqlens[i] + m.chunk; cut < cu_seqlens[i + 1]; cut += m.chunk) bounds.push_back(cut);
      bounds.push_back(cu_seqlens[i + 1]);
    }
  }
  const std::vector<std::int64_t>& cu_rows = m.chunk > 0 ? bounds : cu_seqlens;
  std::int64_t longest = 0;
  for (std::size_t i = 0; i + 1 < cu_rows.size(); ++i) longest = std::max(longest, cu_rows[i + 1] - cu_rows[i]);
  const at::Tensor cu = device_offsets(cu_rows, q.device());
  // The window: query i sees key j when i - j < window, the kernel's left window of window - 1 (its
  // backward keeps it); none where no sequence is longer than the window.
  std::optional<std::int64_t> left, right;
  if (m.window > 0 && m.window < longest) {
    left = m.window - 1;
    right = 0;
  }
  const auto out = at::_flash_attention_forward(
      q.reshape({tokens, groups * per_group, d}), k, v, cu, cu, longest, longest, 0.0, /*is_causal=*/true,
      /*return_debug_mask=*/false, scale_of(m), left, right);
  return std::get<0>(out).reshape({tokens, groups * per_group * d});
}

}  // namespace

at::Tensor attention_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<std::int64_t>& cu_seqlens, const attention_math& m) {
  const std::int64_t groups = q.size(1), per_group = q.size(2), d = q.size(3);
  if (varlen_flash_applies(q, m)) return attention_varlen_flash(q, k, v, cu_seqlens, m);
  // Sequences all of one length (a batch without padding): one batched call, as the padded path
  // makes for it, instead of a call per sequence and the concatenation of their outputs.
  const std::int64_t count = static_cast<std::int64_t>(cu_seqlens.size()) - 1;
  if (count > 1 && cu_seqlens.front() == 0 && cu_seqlens.back() == q.size(0) && q.size(0) % count == 0) {
    const std::int64_t len = q.size(0) / count;
    bool equal = true;
    for (std::int64_t i = 0; i < count && equal; ++i) equal = cu_seqlens[static_cast<std::size_t>(i + 1)] - cu_seqlens[static_cast<std::size_t>(i)] == len;
    if (equal && len > 0) return attention_padded(q, k, v, at::Tensor(), count, len, m);
  }
  // Elsewhere one fused causal call per sequence: cost sum(s_i^2), no mask unless a window cuts
  // the sequence. The stream is split once (split_with_sizes: its backward is one concatenation),
  // not narrowed per sequence, whose backward would add a zero-filled full-size gradient per sequence.
  std::vector<std::int64_t> lengths;
  lengths.reserve(cu_seqlens.size());
  for (std::size_t i = 0; i + 1 < cu_seqlens.size(); ++i) lengths.push_back(cu_seqlens[i + 1] - cu_seqlens[i]);
  TORCH_CHECK(!cu_seqlens.empty() && cu_seqlens.front() == 0 && cu_seqlens.back() == q.size(0),
              "megadsl: attention_varlen: cu_seqlens must cover the ", q.size(0), " packed rows");
  const auto q_parts = q.split_with_sizes(lengths, 0), k_parts = k.split_with_sizes(lengths, 0),
             v_parts = v.split_with_sizes(lengths, 0);
  std::vector<at::Tensor> parts;
  parts.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int64_t len = lengths[i];
    if (len == 0) continue;
    const at::Tensor qs = q_parts[i].reshape({len, groups * per_group, d}).transpose(0, 1).unsqueeze(0);
    const at::Tensor ks = k_parts[i].transpose(0, 1).unsqueeze(0);  // (1, G, len, d)
    const at::Tensor vs = v_parts[i].transpose(0, 1).unsqueeze(0);
    at::Tensor out;  // (1, H, len, d)
    if (fused_sinks_apply(q, at::Tensor(), m))
      out = attention_sinks_fused(qs, ks, vs, m);
    else if (m.dropout.p > 0) {
      attention_math mine = m;  // the dropout keys of this sequence's rows
      mine.dropout.keys = m.dropout.keys.narrow(0, cu_seqlens[i], len);
      mine.dropout.positions = m.dropout.positions.narrow(0, cu_seqlens[i], len);
      out = attention_explicit(qs, ks, vs, causal_mask(len, m, q.options()), mine);
    } else if (m.softcap != 0 || m.sinks.defined())
      out = attention_explicit(qs, ks, vs, causal_mask(len, m, q.options()), m);
    else if (cuts(m, len))
      out = at::scaled_dot_product_attention(qs, ks, vs, causal_mask(len, m, q.options()), 0.0, false,
                                             scale_of(m), /*enable_gqa=*/true);
    else
      out = at::scaled_dot_product_attention(qs, ks, vs, std::nullopt, 0.0, /*is_causal=*/true, scale_of(m),
                                             /*enable_gqa=*/true);
    parts.push_back(out.squeeze(0).transpose(0, 1).reshape({len, groups * per_group * d}));
  }
  if (parts.empty()) return at::zeros({0, groups * per_group * d}, q.options());
  return at::cat(parts, 0);
}

}  // namespace megadsl
