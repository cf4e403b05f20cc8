#include "megadsl/layers/vocab_parallel.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <vector>

#include "megadsl/layers/fused_ops.hpp"
#include "megadsl/layers/invariant.hpp"

namespace megadsl {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void all_reduce(at::Tensor& t, const comm_group* g, reduce_op op) {
  if (g != nullptr) g->all_reduce(t, op);
}

// Invariant mode: the sums over the vocabulary of each of `rows` (T, valid), as (k, T): each block
// of invariant_sum_block columns summed apart (this rank's blocks whole: shards start at multiples
// of the block), the blocks of the whole true vocabulary gathered over tp in vocabulary order and
// summed in a fixed tree.
at::Tensor vocab_sums(const std::vector<at::Tensor>& rows, std::int64_t width, std::int64_t true_vocab, const comm_group* tp) {
  const std::int64_t block = invariant_sum_block;
  TORCH_CHECK(width % block == 0, "megadsl: invariant log-probs need vocabulary shards of whole ", block,
              "-column blocks; this one is ", width, " wide (vocab_pad_multiple must be a multiple of ", block, ")");
  std::vector<at::Tensor> sums;  // each (T, width / block), zero past the valid columns
  for (const at::Tensor& r : rows) {
    const at::Tensor whole = r.size(1) == width ? r : at::constant_pad_nd(r, {0, width - r.size(1)});
    sums.push_back(whole.view({r.size(0), width / block, block}).sum(-1));
  }
  at::Tensor blocks = at::stack(sums);                                   // (k, T, width / block)
  if (tp != nullptr) blocks = tp->all_gather(blocks.contiguous(), 2);  // (k, T, V' / block), in vocabulary order
  const std::int64_t used = (true_vocab + block - 1) / block;
  return tree_sum(blocks.narrow(2, 0, used).movedim(2, 0));
}

// Per token of `logits` (T, width) this rank's columns: the log-prob of its label and its entropy,
// with what the backward needs, m (the max), s (sum exp(z - m)) and a (sum p z), all (T) over the
// whole vocabulary; z the valid columns in the math dtype (T, valid).
struct row_stats {
  at::Tensor log_probs, entropy, z, m, s, a;
};
row_stats stats_of(const at::Tensor& logits, const at::Tensor& labels, std::int64_t start, std::int64_t true_vocab,
                   const comm_group* tp, bool with_entropy, bool invariant) {
  const std::int64_t width = logits.size(1);
  const std::int64_t valid = std::max<std::int64_t>(0, std::min(width, true_vocab - start));
  // fp32 math (fp64 when given fp64, for finite-difference checks); a copy unless already so.
  const auto math = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor z = logits.narrow(1, 0, valid).to(math);  // (T, valid)
  const std::int64_t tokens = logits.size(0);

  at::Tensor m = valid > 0 ? std::get<0>(z.max(1)).contiguous()
                           : at::full({tokens}, -std::numeric_limits<float>::infinity(), z.options());
  all_reduce(m, tp, reduce_op::max);
  // Full-vocabulary temporaries are the largest tensors of the step ((T, V/tp) each): one here,
  // updated in place, which gives the same bits as the out-of-place expressions.
  at::Tensor e = z - m.unsqueeze(1);  // (T, valid)
  exp_in_place(e);

  const at::Tensor in_range = (labels >= start) & (labels < start + valid);
  const at::Tensor local_index = (labels - start).clamp(0, std::max<std::int64_t>(valid - 1, 0));
  const at::Tensor z_y = valid > 0 ? z.gather(1, local_index.unsqueeze(1)).squeeze(1) * in_range
                                   : at::zeros({tokens}, z.options());
  at::Tensor sums;  // (3, T): S, z_y and sum(e z)
  if (invariant) {
    // z_y is on one rank, zero on the others: its sum over tp is exact.
    at::Tensor target = z_y.contiguous();
    all_reduce(target, tp, reduce_op::sum);
    const at::Tensor both = with_entropy ? vocab_sums({e, e * z}, width, true_vocab, tp) : vocab_sums({e}, width, true_vocab, tp);
    e.reset();
    sums = at::stack({both[0], target, with_entropy ? both[1] : at::zeros_like(target)});
  } else {
    // One all-reduce for S, z_y and sum(e z): three rows of one tensor.
    const at::Tensor sum_e = e.sum(1);
    const at::Tensor sum_ez = with_entropy ? e.mul_(z).sum(1) : at::zeros_like(z_y);
    e.reset();
    sums = at::stack({sum_e, z_y, sum_ez}).contiguous();
    all_reduce(sums, tp, reduce_op::sum);
  }
  const at::Tensor s = sums[0], target = sums[1], a = sums[2] / sums[0];
  const at::Tensor log_s = at::log(s);
  at::Tensor logp = target - m - log_s;
  at::Tensor entropy = with_entropy ? m + log_s - a : at::zeros_like(logp);
  return {logp, entropy, z, m, s, a};
}

// The gradient of the logits (T, width) in `dtype` from the incoming ones of the log-probs and the
// entropy (T each), given stats_of's z, m, s, a: local, no collective.
at::Tensor logits_grad(const at::Tensor& z, const at::Tensor& m, const at::Tensor& s, const at::Tensor& a,
                       const at::Tensor& labels, std::int64_t start, std::int64_t width, at::ScalarType dtype,
                       const at::Tensor& grad_logp, const at::Tensor& grad_entropy) {
  const std::int64_t valid = z.size(1);
  const at::Tensor g_logp = grad_logp.defined() ? grad_logp.to(z.scalar_type()) : at::zeros_like(m);
  const at::Tensor g_h = grad_entropy.defined() ? grad_entropy.to(z.scalar_type()) : at::zeros_like(m);
  // dz = -p * (g_logp + g_h * (z - a)), p = exp(z - m) / s recomputed, not stored: two
  // full-vocabulary buffers, updated in place (the same bits as the expression).
  at::Tensor dz = z - m.unsqueeze(1);
  dz.exp_().div_(s.unsqueeze(1));  // p
  {
    at::Tensor t = z - a.unsqueeze(1);
    t.mul_(g_h.unsqueeze(1)).add_(g_logp.unsqueeze(1));
    dz.mul_(t).neg_();
  }
  if (valid > 0) {
    const at::Tensor in_range = (labels >= start) & (labels < start + valid);
    const at::Tensor local_index = (labels - start).clamp(0, valid - 1);
    dz.scatter_add_(1, local_index.unsqueeze(1), (g_logp * in_range).unsqueeze(1));
  }
  if (valid == width) return dz.to(dtype);  // no vocabulary padding on this shard
  at::Tensor grad = at::zeros({z.size(0), width}, z.options().dtype(dtype));
  grad.narrow(1, 0, valid).copy_(dz);
  return grad;
}

struct logprob_entropy_fn : torch::autograd::Function<logprob_entropy_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                               std::int64_t start, std::int64_t true_vocab, const comm_group* tp,
                               bool with_entropy, bool invariant) {
    row_stats r = stats_of(logits, labels, start, true_vocab, tp, with_entropy, invariant);
    ctx->save_for_backward({r.z, r.m, r.s, r.a, labels});
    ctx->saved_data["start"] = start;
    ctx->saved_data["width"] = logits.size(1);
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(logits.scalar_type());
    return {r.log_probs, r.entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {logits_grad(saved[0], saved[1], saved[2], saved[3], saved[4], ctx->saved_data["start"].toInt(),
                        ctx->saved_data["width"].toInt(), dtype, grads[0], grads[1]),
            {}, {}, {}, {}, {}, {}};
  }
};

// The fused kernels' forward over 16-bit logits (T, width) this rank's columns: one kernel reads
// each row once for its local (max, sum exp, sum exp z, z_y), rescaled to the global max after the
// max all-reduce. The log-probs and entropy, with m, s and a over the whole vocabulary (T) fp32.
row_stats fused_stats_of(const at::Tensor& logits, const at::Tensor& labels, std::int64_t start, std::int64_t true_vocab,
                         const comm_group* tp, bool with_entropy) {
  const std::int64_t valid = std::max<std::int64_t>(0, std::min(logits.size(1), true_vocab - start));
  auto [m_local, s_local, a_local, z_y] = logits_row_stats(logits, labels, start, valid);  // (T) each
  at::Tensor m = m_local.clone();
  all_reduce(m, tp, reduce_op::max);
  const at::Tensor rescale = at::exp(m_local - m);  // 0 on a shard of padding alone (m_local = -inf)
  at::Tensor sums = at::stack({s_local * rescale, z_y, a_local * rescale}).contiguous();
  all_reduce(sums, tp, reduce_op::sum);
  row_stats r;
  r.m = m, r.s = sums[0], r.a = sums[2];
  const at::Tensor log_s = at::log(r.s);
  r.log_probs = sums[1] - m - log_s;
  r.entropy = with_entropy ? m + log_s - r.a / r.s : at::zeros_like(r.log_probs);
  return r;
}

// The LM head and its log-probs a chunk of rows at a time (chunked_head_logprob_entropy): the
// forward keeps per row only m, s and a; the backward recomputes each chunk's logits with autograd
// on (the same operations as head_logits) and takes its gradients to h and w from logits_grad's.
struct chunked_head_fn : torch::autograd::Function<chunked_head_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels,
                               const at::Tensor& row_temperature, double softcap, double scale, bool divides,
                               double temperature, std::int64_t start, std::int64_t true_vocab, const comm_group* tp,
                               bool with_entropy, bool invariant, std::int64_t chunk_rows) {
    // (Function::apply takes defined tensors only: no per-row temperature is an empty one.)
    const head_transform t{softcap, scale, divides, temperature, row_temperature.numel() > 0 ? row_temperature : at::Tensor()};
    const std::int64_t rows = h.size(0);
    std::vector<at::Tensor> lp, ent, ms, ss, as;
    // The fused kernels' a is sum exp(z - m) z, the composed path's its mean: the backward takes
    // the forward's path, whatever set_fused_kernels says by then.
    bool fused = false;
    // (Once with no rows: every tp rank joins the same collectives.)
    for (std::int64_t first = 0; first == 0 || first < rows; first += chunk_rows) {
      const std::int64_t n = std::min(chunk_rows, rows - first);
      const at::Tensor logits = head_logits(h, w, t, first, n, invariant);  // (n, V'/tp)
      const at::Tensor chunk_labels = labels.narrow(0, first, n);
      fused = fused_kernels_take(logits) && !invariant;
      row_stats r = fused ? fused_stats_of(logits, chunk_labels, start, true_vocab, tp, with_entropy)
                          : stats_of(logits, chunk_labels, start, true_vocab, tp, with_entropy, invariant);
      lp.push_back(r.log_probs), ent.push_back(r.entropy), ms.push_back(r.m), ss.push_back(r.s), as.push_back(r.a);
    }
    ctx->save_for_backward({h, w, labels, row_temperature, at::cat(ms), at::cat(ss), at::cat(as)});
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["divides"] = divides;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["start"] = start;
    ctx->saved_data["true_vocab"] = true_vocab;
    ctx->saved_data["invariant"] = invariant;
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["fused"] = fused;
    return {at::cat(lp), at::cat(ent)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &w = saved[1], &labels = saved[2], &m = saved[4], &s = saved[5], &a = saved[6];
    const head_transform t{ctx->saved_data["softcap"].toDouble(), ctx->saved_data["scale"].toDouble(),
                           ctx->saved_data["divides"].toBool(), ctx->saved_data["temperature"].toDouble(),
                           saved[3].numel() > 0 ? saved[3] : at::Tensor()};
    const std::int64_t start = ctx->saved_data["start"].toInt(), true_vocab = ctx->saved_data["true_vocab"].toInt();
    const std::int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const bool invariant = ctx->saved_data["invariant"].toBool(), fused = ctx->saved_data["fused"].toBool();
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const std::int64_t rows = h.size(0), width = w.size(0);
    const std::int64_t valid = std::max<std::int64_t>(0, std::min(width, true_vocab - start));
    at::Tensor grad_h = want_h ? at::empty_like(h) : at::Tensor();
    // w's gradient summed over the chunks in fp32 where w is 16-bit (one GEMM would accumulate so).
    const bool low = w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf;
    at::Tensor grad_w = want_w ? at::zeros(w.sizes(), w.options().dtype(low ? at::kFloat : w.scalar_type())) : at::Tensor();
    const at::Tensor wl = w.detach().requires_grad_(want_w);
    for (std::int64_t first = 0; first < rows; first += chunk_rows) {
      const std::int64_t n = std::min(chunk_rows, rows - first);
      const at::AutoGradMode on(true);
      const at::Tensor hl = h.narrow(0, first, n).detach().requires_grad_(want_h);
      head_transform tc = t;  // the chunk's rows of the per-row temperatures
      if (tc.row_temperature.defined()) tc.row_temperature = tc.row_temperature.narrow(0, first, n);
      const at::Tensor logits = head_logits(hl, wl, tc, 0, n, invariant);
      const auto part = [&](const at::Tensor& g) { return g.defined() ? g.narrow(0, first, n) : at::Tensor(); };
      at::Tensor dlogits;
      if (fused) {  // the gradient in the logits' dtype, one kernel
        const at::Tensor mc = m.narrow(0, first, n);
        const at::Tensor g_logp = grads[0].defined() ? part(grads[0]) : at::zeros_like(mc);
        const at::Tensor g_h = grads[1].defined() ? part(grads[1]) : at::zeros_like(mc);
        dlogits = logits_row_grad(logits.detach(), labels.narrow(0, first, n), start, valid, mc, s.narrow(0, first, n),
                                  a.narrow(0, first, n), g_logp, g_h);
      } else {
        const auto math = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
        const at::Tensor z = logits.detach().narrow(1, 0, valid).to(math);
        dlogits = logits_grad(z, m.narrow(0, first, n), s.narrow(0, first, n), a.narrow(0, first, n),
                              labels.narrow(0, first, n), start, width, logits.scalar_type(), part(grads[0]), part(grads[1]));
      }
      std::vector<at::Tensor> inputs;
      if (want_h) inputs.push_back(hl);
      if (want_w) inputs.push_back(wl);
      if (inputs.empty()) break;
      const auto g = torch::autograd::grad({logits}, inputs, {dlogits});
      if (want_h) grad_h.narrow(0, first, n).copy_(g[0]);
      if (want_w) grad_w.add_(g[want_h ? 1 : 0]);
    }
    return {grad_h, want_w ? grad_w.to(w.scalar_type()) : grad_w, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

// The same results from 16-bit CUDA logits in two fused passes (fused_ops.hpp): fused_stats_of
// forward; the backward recomputes p in one kernel that writes the gradient in the logits' dtype. Keeps the 16-bit logits for the backward, not an fp32 copy of them.
struct fused_logprob_entropy_fn : torch::autograd::Function<fused_logprob_entropy_fn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                               std::int64_t start, std::int64_t true_vocab, const comm_group* tp,
                               bool with_entropy) {
    const std::int64_t valid = std::max<std::int64_t>(0, std::min(logits.size(1), true_vocab - start));
    const row_stats r = fused_stats_of(logits, labels, start, true_vocab, tp, with_entropy);
    ctx->save_for_backward({logits, r.m, r.s, r.a, labels});
    ctx->saved_data["start"] = start;
    ctx->saved_data["valid"] = valid;
    return {r.log_probs, r.entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &m = saved[1], &s = saved[2], &a = saved[3], &labels = saved[4];
    const at::Tensor g_logp = grads[0].defined() ? grads[0] : at::zeros_like(m);
    const at::Tensor g_h = grads[1].defined() ? grads[1] : at::zeros_like(m);
    return {logits_row_grad(logits, labels, ctx->saved_data["start"].toInt(), ctx->saved_data["valid"].toInt(), m, s,
                            a, g_logp, g_h),
            {}, {}, {}, {}, {}};
  }
};

}  // namespace

logprob_entropy vocab_parallel_logprob_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                               const vocab_shard& shard, const comm_group* tp,
                                               bool with_entropy, bool invariant) {
  TORCH_CHECK(logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == logits.size(0),
              "megadsl: vocab-parallel log-probs take logits (T, V/tp) and labels (T,)");
  if (tp != nullptr && tp->size() == 1) tp = nullptr;
  auto out = fused_kernels_take(logits) && !invariant
                 ? fused_logprob_entropy_fn::apply(logits, labels.to(at::kLong), shard.start, shard.true_vocab, tp,
                                                   with_entropy)
                 : logprob_entropy_fn::apply(logits, labels.to(at::kLong), shard.start, shard.true_vocab, tp, with_entropy,
                                             invariant);
  return {out[0], with_entropy ? out[1] : at::Tensor()};
}

at::Tensor head_logits(const at::Tensor& h, const at::Tensor& w, const head_transform& t, std::int64_t first,
                       std::int64_t n, bool invariant) {
  at::Tensor l = linear_in(invariant, h.narrow(0, first, n), w);  // (n, V'/tp), compute dtype
  if (t.softcap != 0) l = at::tanh(l / t.softcap) * t.softcap;
  if (t.scale != 1) l = t.divides ? l / t.scale : l * t.scale;
  if (t.temperature != 1.0) l = l / t.temperature;
  if (t.row_temperature.defined()) l = l / t.row_temperature.narrow(0, first, n).unsqueeze(1).to(l.scalar_type());
  return l;
}

logprob_entropy chunked_head_logprob_entropy(const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels,
                                             const head_transform& t, const vocab_shard& shard, const comm_group* tp,
                                             bool with_entropy, bool invariant, std::int64_t chunk_rows) {
  TORCH_CHECK(h.dim() == 2 && w.dim() == 2 && labels.dim() == 1 && labels.size(0) == h.size(0) && chunk_rows >= 1,
              "megadsl: the chunked LM head takes h (T, hd), w (V/tp, hd), labels (T,) and a positive chunk");
  if (tp != nullptr && tp->size() == 1) tp = nullptr;
  const at::Tensor rows_t = t.row_temperature.defined() ? t.row_temperature : at::empty({0}, h.options().dtype(at::kFloat));
  auto out = chunked_head_fn::apply(h, w, labels.to(at::kLong), rows_t, t.softcap, t.scale, t.divides,
                                    t.temperature, shard.start, shard.true_vocab, tp, with_entropy, invariant, chunk_rows);
  return {out[0], with_entropy ? out[1] : at::Tensor()};
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                        const vocab_shard& shard, const comm_group* tp) {
  return -vocab_parallel_logprob_entropy(logits, labels, shard, tp, false).log_probs;
}

}  // namespace megadsl
