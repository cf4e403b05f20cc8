// Ring attention's core (layers/ring_attention.hpp) against attention over the whole stream: each
// cp rank holds a load-balanced share of two packed sequences (chunks i and 2 cp - 1 - i of each,
// one shorter than 2 cp chunks) and padding; outputs and the gradients of q, k and v of its tokens
// equal the whole stream's within 1e-5, at cp 2 and 4, with grouped-query heads (6 query heads
// over 2 kv heads: Ulysses' cp_splits_heads refuses 6 heads at cp 4), with a sliding window, and
// with chunks and a soft-cap.
#include "../catch_torch.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "megadsl/layers/ring_attention.hpp"
#include "mp_support.hpp"

namespace megadsl::test {

namespace {

// The whole stream's attention (Hq, T, d) with the same rule as the ring's, in fp32.
at::Tensor whole_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos,
                           const at::Tensor& seq, double scale, const ring_mask& m) {
  const std::int64_t g = q.size(0) / k.size(0);
  const at::Tensor kk = k.repeat_interleave(g, 0), vv = v.repeat_interleave(g, 0);
  at::Tensor ok = seq.unsqueeze(1).eq(seq.unsqueeze(0)).logical_and(seq.unsqueeze(1).ge(0)).logical_and(pos.unsqueeze(0).le(pos.unsqueeze(1)));
  if (m.window > 0) ok = ok.logical_and((pos.unsqueeze(1) - pos.unsqueeze(0)).lt(m.window));
  if (m.chunk > 0) ok = ok.logical_and(at::floor_divide(pos, m.chunk).unsqueeze(1).eq(at::floor_divide(pos, m.chunk).unsqueeze(0)));
  at::Tensor s = at::matmul(q, kk.transpose(-1, -2)).mul(scale);
  if (m.softcap > 0) s = at::tanh(s / m.softcap) * m.softcap;
  s = s.masked_fill(ok.logical_not(), -1e30);
  const at::Tensor p = at::softmax(s, -1) * ok.any(-1, true).to(at::kFloat);  // a padding row: 0
  return at::matmul(p, vv);
}

// Each cp rank's token indices into the whole stream: chunks i and 2 cp - 1 - i of every sequence
// (chunk size ceil(L / 2 cp): a short sequence leaves some ranks without its chunks), padded with
// the stream's padding tokens to the same count on every rank.
std::vector<std::vector<std::int64_t>> balanced_split(const std::vector<std::int64_t>& lengths, std::int64_t padding,
                                                      int cp) {
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(cp));
  std::int64_t start = 0;
  for (const std::int64_t len : lengths) {
    const std::int64_t c = (len + 2 * cp - 1) / (2 * cp);
    for (int r = 0; r < cp; ++r)
      for (const std::int64_t chunk : {static_cast<std::int64_t>(r), static_cast<std::int64_t>(2 * cp - 1 - r)})
        for (std::int64_t i = chunk * c; i < std::min(len, (chunk + 1) * c); ++i) out[static_cast<std::size_t>(r)].push_back(start + i);
    start += len;
  }
  std::size_t most = 0;
  for (const auto& r : out) most = std::max(most, r.size());
  std::int64_t pad = start;  // the padding tokens follow the sequences
  for (auto& r : out)
    while (r.size() < most) {
      REQUIRE(pad < start + padding);
      r.push_back(pad++);
    }
  return out;
}

void check_ring(int cp, const ring_mask& m) {
  INFO("cp " << cp << ", window " << m.window << ", chunk " << m.chunk << ", softcap " << m.softcap);
  auto groups = parallel_groups::build(dist(), layout{.cp = cp});
  const std::vector<std::int64_t> lengths{13, 6};  // 6 < 2 cp chunks at cp 4
  const std::int64_t padding = 16, total = 13 + 6 + padding, hq = 6, hkv = 2, d = 8;
  at::manual_seed(11);  // the same whole stream on every rank
  const at::Tensor q = at::randn({hq, total, d}), k = at::randn({hkv, total, d}), v = at::randn({hkv, total, d});
  const at::Tensor w = at::randn({hq, total, d});
  std::vector<std::int64_t> pos_v, seq_v;
  for (std::size_t s = 0; s < lengths.size(); ++s)
    for (std::int64_t i = 0; i < lengths[s]; ++i) pos_v.push_back(i), seq_v.push_back(static_cast<std::int64_t>(s));
  for (std::int64_t i = 0; i < padding; ++i) pos_v.push_back(0), seq_v.push_back(-1);
  const at::Tensor pos = at::tensor(pos_v, at::kLong), seq = at::tensor(seq_v, at::kLong);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // The whole stream's outputs and gradients.
  const at::Tensor qw = q.clone().requires_grad_(true), kw = k.clone().requires_grad_(true), vw = v.clone().requires_grad_(true);
  const at::Tensor want = whole_attention(qw, kw, vw, pos, seq, scale, m);
  (want * w).sum().backward();
  // This rank's share through the ring.
  const auto split = balanced_split(lengths, padding, cp);
  const at::Tensor mine = at::tensor(split[static_cast<std::size_t>(groups.cp->rank())], at::kLong);
  const at::Tensor ql = q.index_select(1, mine).requires_grad_(true), kl = k.index_select(1, mine).requires_grad_(true),
                   vl = v.index_select(1, mine).requires_grad_(true);
  const at::Tensor got = ring_attention(ql, kl, vl, {pos.index_select(0, mine), seq.index_select(0, mine)}, scale, m, *groups.cp);
  (got * w.index_select(1, mine)).sum().backward();
  CHECK(at::allclose(got, want.detach().index_select(1, mine), 0, 1e-5));
  CHECK(at::allclose(ql.grad(), qw.grad().index_select(1, mine), 0, 1e-5));
  CHECK(at::allclose(kl.grad(), kw.grad().index_select(1, mine), 0, 1e-5));
  CHECK(at::allclose(vl.grad(), vw.grad().index_select(1, mine), 0, 1e-5));
  CHECK(want.detach().abs().max().item<double>() > 0.1);  // not all padding
}

}  // namespace

TEST_CASE("ring attention over a load-balanced split equals the whole stream's, outputs and gradients",
          "[world4][ring]") {
  for (const int cp : {2, 4})
    for (const ring_mask& m : {ring_mask{}, ring_mask{.window = 4, .tile = 3}, ring_mask{.chunk = 5, .softcap = 2.0, .tile = 4}})
      check_ring(cp, m);  // (tiles of 3 and 4 query rows: several per block)
}

}  // namespace megadsl::test
