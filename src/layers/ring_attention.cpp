// Ring attention's forward and backward (layers/ring_attention.hpp).
#include "megadsl/layers/ring_attention.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "megadsl/formulas.hpp"
#include "megadsl/parallel/comm.hpp"
#include "megadsl/runtime/packing.hpp"

namespace megadsl {
namespace {

constexpr double minus_infinity = -std::numeric_limits<double>::infinity();

// One k/v block in flight: its tensors, and in the backward its dk and dv accumulating.
struct ring_block {
  at::Tensor k, v, position, sequence;  // (Hkv, Tk, d) x 2, (Tk,) x 2
  at::Tensor dk, dv;                    // backward only
};

// (Tq, Tk) bool: query i may attend key j.
at::Tensor allowed(const ring_tokens& q, const at::Tensor& k_position, const at::Tensor& k_sequence, const ring_mask& m) {
  const at::Tensor qs = q.sequence.unsqueeze(1), qp = q.position.unsqueeze(1);
  const at::Tensor ks = k_sequence.unsqueeze(0), kp = k_position.unsqueeze(0);
  at::Tensor ok = qs.eq(ks).logical_and(qs.ge(0)).logical_and(kp.le(qp));
  if (m.window > 0) ok = ok.logical_and((qp - kp).lt(m.window));
  if (m.chunk > 0) ok = ok.logical_and(at::floor_divide(qp, m.chunk).eq(at::floor_divide(kp, m.chunk)));
  return ok;
}

// The scores (Hkv, g, Tq, Tk) fp32 of q (Hq, Tq, d) against a block's k (Hkv, Tk, d) as the softmax
// sees them: scaled, soft-capped, masked to -inf where `ok` is false. With a soft-cap, `tanh` gets
// tanh(raw / softcap) for the backward's chain rule. One buffer of the tile's size, written in place.
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, double scale, const at::Tensor& ok, double softcap,
                  at::Tensor* tanh = nullptr) {
  const std::int64_t hkv = k.size(0), g = q.size(0) / hkv;
  const at::Tensor qg = q.to(at::kFloat).view({hkv, g, q.size(1), q.size(2)});
  at::Tensor s = at::matmul(qg, k.to(at::kFloat).unsqueeze(1).transpose(-1, -2));  // (Hkv, g, Tq, Tk)
  s.mul_(scale);
  if (softcap > 0) {
    s.div_(softcap).tanh_();
    if (tanh != nullptr) *tanh = s.clone();
    s.mul_(softcap);
  }
  return s.masked_fill_(ok.logical_not(), minus_infinity);
}

// Sends `block` to the next rank and receives the previous rank's into `into` (same shapes).
void pass_on(const std::vector<at::Tensor>& block, std::vector<at::Tensor>& into, const comm_group& cp, int tag) {
  const int next = (cp.rank() + 1) % cp.size(), prev = (cp.rank() + cp.size() - 1) % cp.size();
  std::vector<comm_group::pending_send> sent;
  for (std::size_t i = 0; i < block.size(); ++i) sent.push_back(cp.send(block[i].contiguous(), next, tag + static_cast<int>(i)));
  for (std::size_t i = 0; i < into.size(); ++i) cp.recv(into[i], prev, tag + static_cast<int>(i));
  for (comm_group::pending_send& s : sent) s.wait();
}

std::vector<at::Tensor> empty_like_all(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
  return out;
}

// Queries a tile at a time (formulas.hpp ring_tile_rows): the scores of a tile against a block,
// (Hq, tile, Tk) fp32, about ring_tile_scores elements (32 MiB), never the whole (Tq, Tk).

// The key columns [first, first + count) of a block that some row of a query tile may see (the
// tile's `ok` narrowed to them); count 0: none, the tile skips the block. Under the load-balanced
// split a rank's queries see all of one of a block's two chunks and none of the other, so about
// half of the causal work is never scored.
struct key_span {
  std::int64_t first = 0, count = 0;
  at::Tensor ok;  // (n, count) bool
};
key_span visible_keys(const at::Tensor& ok) {
  const at::Tensor seen = ok.any(0).nonzero();  // (c, 1) the columns any row sees, ascending
  if (seen.size(0) == 0) return {};
  const std::int64_t first = seen[0][0].item<std::int64_t>(), last = seen[-1][0].item<std::int64_t>();
  return {first, last - first + 1, ok.narrow(1, first, last - first + 1)};
}

// Stretch `part` of `parts` equal ones of a block (its keys, values, positions and ids, and in the
// backward its dk and dv): views, so that a tile's gradient lands in the block's.
std::vector<at::Tensor> part_of(const std::vector<at::Tensor>& block, std::int64_t part, std::int64_t parts) {
  if (parts == 1) return block;
  const std::int64_t rows = block[2].size(0) / parts, first = part * rows;
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < block.size(); ++i)
    out.push_back(i == 2 || i == 3 ? block[i].narrow(0, first, rows) : block[i].narrow(1, first, rows));
  return out;
}

// One query tile [start, start + n) against one k/v block: the tile's out and lse merged with
// the block's partial softmax by their log-sum-exp.
void forward_tile(const at::Tensor& q, const ring_tokens& mine, const std::vector<at::Tensor>& block, const ring_mask& mask,
                  double scale, std::int64_t start, std::int64_t n, at::Tensor& out, at::Tensor& lse) {
  const ring_tokens rows{mine.position.narrow(0, start, n), mine.sequence.narrow(0, start, n)};
  const key_span keys = visible_keys(allowed(rows, block[2], block[3], mask));
  if (keys.count == 0) return;  // nothing of this block is visible: out and lse stay
  const at::Tensor k = block[0].narrow(1, keys.first, keys.count), v = block[1].narrow(1, keys.first, keys.count);
  at::Tensor p = scores(q.narrow(1, start, n), k, scale, keys.ok, mask.softcap);               // (Hkv, g, n, Tk')
  const at::Tensor m = std::get<0>(p.max(-1, true));                                            // (.., n, 1)
  const at::Tensor safe_m = at::where(at::isinf(m), at::zeros_like(m), m);
  p.sub_(safe_m).exp_();                                                                        // 0 where masked
  const at::Tensor sum = p.sum(-1, true);
  const at::Tensor block_lse = at::where(sum.gt(0), safe_m + at::log(sum), at::full_like(sum, minus_infinity));
  const at::Tensor block_out = at::matmul(p, v.to(at::kFloat).unsqueeze(1));                   // (.., n, d) unnormalised
  at::Tensor o = out.narrow(2, start, n), l = lse.narrow(2, start, n);
  const at::Tensor new_lse = at::logaddexp(l, block_lse);
  const at::Tensor keep = at::where(at::isinf(new_lse), at::zeros_like(new_lse), at::exp(l - new_lse));
  const at::Tensor add = at::where(at::isinf(new_lse), at::zeros_like(new_lse), at::exp(safe_m - new_lse));
  o.copy_(o * keep + block_out * add);
  l.copy_(new_lse);
}

// One query tile's share of the backward against one block: its dq, and the block's dk, dv.
// At most two tile-sized buffers live (P, then dS beside it; a third, tanh, with a soft-cap).
void backward_tile(const at::Tensor& q, const ring_tokens& mine, std::vector<at::Tensor>& block, const ring_mask& mask,
                   double scale, std::int64_t start, std::int64_t n, const at::Tensor& dout, const at::Tensor& delta,
                   const at::Tensor& lse, at::Tensor& dq) {
  const ring_tokens rows{mine.position.narrow(0, start, n), mine.sequence.narrow(0, start, n)};
  const key_span keys = visible_keys(allowed(rows, block[2], block[3], mask));
  if (keys.count == 0) return;  // no gradient flows between this tile and this block
  const std::int64_t hkv = block[0].size(0), g = q.size(0) / hkv;
  const at::Tensor qt = q.narrow(1, start, n);
  const at::Tensor k = block[0].narrow(1, keys.first, keys.count), v = block[1].narrow(1, keys.first, keys.count);
  at::Tensor capped;  // tanh(raw / softcap), with a soft-cap
  at::Tensor p = scores(qt, k, scale, keys.ok, mask.softcap, &capped);                           // (Hkv, g, n, Tk')
  // P from the saved log-sum-exp; a row that sees no key anywhere (lse -inf) has only -inf scores: 0.
  const at::Tensor l = lse.narrow(2, start, n);
  p.sub_(at::where(at::isinf(l), at::zeros_like(l), l)).exp_();
  const at::Tensor kf = k.to(at::kFloat).unsqueeze(1), vf = v.to(at::kFloat).unsqueeze(1);
  const at::Tensor dot = dout.narrow(2, start, n);
  at::Tensor ds = at::matmul(dot, vf.transpose(-1, -2));                                           // dP
  ds.sub_(delta.narrow(2, start, n)).mul_(p);                                                      // dS = P (dP - delta)
  if (mask.softcap > 0) ds.mul_(capped.pow_(2).neg_().add_(1));  // through the soft-cap: 1 - tanh^2, in place
  dq.narrow(2, start, n).add_(at::matmul(ds, kf) * scale);
  const at::Tensor qf = qt.to(at::kFloat).view({hkv, g, n, qt.size(2)});
  block[4].narrow(1, keys.first, keys.count).add_((at::matmul(ds.transpose(-1, -2), qf) * scale).sum(1));  // (Hkv, Tk', d)
  block[5].narrow(1, keys.first, keys.count).add_(at::matmul(p.transpose(-1, -2), dot).sum(1));
}

struct ring_attention_fn : torch::autograd::Function<ring_attention_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& position, const at::Tensor& sequence, double scale,
                            std::int64_t window, std::int64_t chunk, double softcap, std::int64_t tile_given,
                            std::int64_t parts, const at::Tensor& sinks, const comm_group* cp) {  // sinks: (Hq) or empty
    const ring_mask mask{window, chunk, softcap, tile_given};
    const std::int64_t hq = q.size(0), t = q.size(1), d = v.size(2), hkv = k.size(0), g = hq / hkv;
    const ring_tokens mine{position, sequence};
    at::Tensor out = at::zeros({hkv, g, t, d}, q.options().dtype(at::kFloat));                         // (Hkv, g, Tq, d)
    at::Tensor lse = at::full({hkv, g, t, 1}, minus_infinity, q.options().dtype(at::kFloat));          // (Hkv, g, Tq, 1)
    const std::int64_t tile = tile_given > 0 ? tile_given : ring_tile_rows(hq, t, k.size(1) / parts);
    std::vector<at::Tensor> block{k.contiguous(), v.contiguous(), position.contiguous(), sequence.contiguous()};
    for (int step = 0; step < cp->size(); ++step) {
      std::vector<at::Tensor> next;
      if (step + 1 < cp->size()) next = empty_like_all(block);
      // (The send and receive of the next block could overlap this block's arithmetic.)
      for (std::int64_t part = 0; part < parts; ++part) {
        const std::vector<at::Tensor> keys = part_of(block, part, parts);
        for (std::int64_t start = 0; start < t; start += tile)
          forward_tile(q, mine, keys, mask, scale, start, std::min(tile, t - start), out, lse);
      }
      if (step + 1 < cp->size()) {
        pass_on(block, next, *cp, 100);
        block = std::move(next);
      }
    }
    if (sinks.numel() > 0) {
      // Each head's sink: one more logit in every row's softmax, without a value (gpt-oss): the
      // row's log-sum-exp takes it in, and its output shrinks by exp(lse - lse'). A row that sees
      // no key (padding) keeps 0.
      const at::Tensor sink = sinks.to(at::kFloat).view({hkv, g, 1, 1});
      const at::Tensor with_sink = at::logaddexp(lse, sink.expand_as(lse));
      out.mul_(at::exp(lse - with_sink));
      lse = with_sink;
    }
    ctx->save_for_backward({q, k, v, position, sequence, out, lse, sinks});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = window;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["parts"] = parts;
    ctx->saved_data["cp"] = reinterpret_cast<std::int64_t>(cp);
    return out.view({hq, t, d}).to(q.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[5], &lse = saved[6], &sinks = saved[7];
    const ring_tokens mine{saved[3], saved[4]};
    const double scale = ctx->saved_data["scale"].toDouble();
    const ring_mask mask{ctx->saved_data["window"].toInt(), ctx->saved_data["chunk"].toInt(),
                         ctx->saved_data["softcap"].toDouble()};
    const auto* cp = reinterpret_cast<const comm_group*>(ctx->saved_data["cp"].toInt());
    const std::int64_t hq = q.size(0), t = q.size(1), d = v.size(2), hkv = k.size(0), g = hq / hkv;
    const at::Tensor dout = grads[0].to(at::kFloat).reshape({hkv, g, t, d});
    const at::Tensor delta = (dout * out).sum(-1, true);                                                // (.., Tq, 1)
    // A sink's gradient: -sum over the rows of its probability exp(sink - lse) times delta (the
    // softmax's row term; the sink has no value). Its probabilities on the other logits are in lse.
    at::Tensor dsinks;
    if (sinks.numel() > 0)
      dsinks = -(at::exp(sinks.to(at::kFloat).view({hkv, g, 1, 1}) - lse) * delta).sum({2, 3}).reshape(sinks.sizes()).to(sinks.scalar_type());
    at::Tensor dq = at::zeros({hkv, g, t, q.size(2)}, q.options().dtype(at::kFloat));
    const std::int64_t tile = ctx->saved_data["tile"].toInt(), parts = ctx->saved_data["parts"].toInt();
    std::vector<at::Tensor> block{k.contiguous(), v.contiguous(), mine.position.contiguous(), mine.sequence.contiguous(),
                                  at::zeros(k.sizes(), k.options().dtype(at::kFloat)),
                                  at::zeros(v.sizes(), v.options().dtype(at::kFloat))};
    for (int step = 0; step < cp->size(); ++step) {
      for (std::int64_t part = 0; part < parts; ++part) {
        std::vector<at::Tensor> keys = part_of(block, part, parts);
        for (std::int64_t start = 0; start < t; start += tile)
          backward_tile(q, mine, keys, mask, scale, start, std::min(tile, t - start), dout, delta, lse, dq);
      }
      // Every block moves on, the last pass bringing each dk/dv home.
      std::vector<at::Tensor> next = empty_like_all(block);
      pass_on(block, next, *cp, 200);
      block = std::move(next);
    }
    return {dq.view({hq, t, q.size(2)}).to(q.scalar_type()), block[4].to(k.scalar_type()), block[5].to(v.scalar_type()),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            dsinks, at::Tensor()};
  }
};

}  // namespace

ring_tokens ring_tokens_of(const packed_tokens& pk, std::int64_t rows) {
  const at::Tensor real = at::floor_divide(pk.index, pk.seq).masked_fill(pk.token_valid.eq(0), -1);
  return {pk.positions, at::constant_pad_nd(real, {0, rows - pk.tokens}, -1)};
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ring_tokens& tokens,
                          double scale, const ring_mask& mask, const comm_group& cp) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.size(0) > 0 && q.size(0) % k.size(0) == 0 &&
                  q.size(2) == k.size(2) && k.size(0) == v.size(0) && q.size(1) == k.size(1) && k.size(1) == v.size(1),
              "megadsl: ring_attention: q (Hq, T, d), k (Hkv, T, d) and v (Hkv, T, dv) with Hkv dividing Hq; got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(!mask.sinks.defined() || mask.sinks.numel() == q.size(0), "megadsl: ring_attention: ", q.size(0),
              " query heads and ", mask.sinks.numel(), " sinks");
  TORCH_CHECK(tokens.position.numel() == q.size(1) && tokens.sequence.numel() == q.size(1),
              "megadsl: ring_attention: ", q.size(1), " tokens, ", tokens.position.numel(), " positions and ",
              tokens.sequence.numel(), " sequence ids");
  TORCH_CHECK(mask.parts >= 1 && k.size(1) % mask.parts == 0, "megadsl: ring_attention: a block of ", k.size(1),
              " rows is not ", mask.parts, " equal parts");
  return ring_attention_fn::apply(q, k, v, tokens.position.to(at::kLong), tokens.sequence.to(at::kLong), scale, mask.window,
                                  mask.chunk, mask.softcap, mask.tile, mask.parts,
                                  mask.sinks.defined() ? mask.sinks : at::empty({0}, q.options().dtype(at::kFloat)), &cp);
}

}  // namespace megadsl
