// The gated delta rule in chunked form and token by token, and the causal depthwise conv
// (layers/gated_delta_rule.hpp).
#include "megadsl/layers/gated_delta_rule.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "megadsl/layers/invariant.hpp"

namespace megadsl {
namespace {

// (B, L, Hk, d) -> (B, Hv, L, d) fp32, each key head repeated for its value heads, L2-normed
// (x * rsqrt(sum x^2 + 1e-6), FLA's l2norm) and times `scale`.
at::Tensor heads_first(const at::Tensor& x, std::int64_t hv, double scale) {
  const std::int64_t b = x.size(0), l = x.size(1), hk = x.size(2), d = x.size(3);
  at::Tensor f = x.to(at::kFloat);
  f = f * at::rsqrt((f * f).sum(-1, true) + 1e-6);
  if (scale != 1.0) f = f * scale;
  if (hv != hk) f = f.unsqueeze(3).expand({b, l, hk, hv / hk, d}).reshape({b, l, hv, d});
  return f.transpose(1, 2);
}

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1),
              "megadsl: gated delta rule: q, k must be (B, L, Hk, dk) alike and v (B, L, Hv, dv)");
  TORCH_CHECK(v.size(2) % q.size(2) == 0, "megadsl: gated delta rule: value heads ", v.size(2),
              " are not a multiple of key heads ", q.size(2));
  TORCH_CHECK(g.sizes() == v.sizes().slice(0, 3) && beta.sizes() == g.sizes(),
              "megadsl: gated delta rule: g and beta must be (B, L, Hv)");
}

}  // namespace

at::Tensor chunk_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& g_in,
                                  const at::Tensor& beta_in, std::int64_t chunk) {
  check_shapes(q_in, k_in, v_in, g_in, beta_in);
  const std::int64_t b = v_in.size(0), l = v_in.size(1), hv = v_in.size(2), dv = v_in.size(3), hk = q_in.size(2),
                     dk = q_in.size(3), r = hv / hk;
  const std::int64_t pad = (chunk - l % chunk) % chunk, lp = l + pad, n = lp / chunk, c = chunk;
  // q and k per key head (B, Hk, N, C, dk); v, beta, g per value head grouped under its key head
  // (B, Hk, r, N, C, ...): what depends on q and k alone (k k^T, q k^T) is computed once per key
  // head. Padding (zero k, v, g, beta) changes no real token's output.
  const auto padded = [&](const at::Tensor& t) { return pad == 0 ? t : at::constant_pad_nd(t, {0, 0, 0, pad}); };
  const at::Tensor q = padded(heads_first(q_in, hk, 1.0 / std::sqrt(static_cast<double>(dk)))).reshape({b, hk, 1, n, c, dk});
  const at::Tensor k = padded(heads_first(k_in, hk, 1.0)).reshape({b, hk, 1, n, c, dk});
  const at::Tensor v = padded(v_in.to(at::kFloat).transpose(1, 2)).reshape({b, hk, r, n, c, dv});
  const auto per_token = [&](const at::Tensor& t) {  // (B, L, Hv) -> (B, Hk, r, N, C)
    at::Tensor f = t.to(at::kFloat).transpose(1, 2);
    return (pad == 0 ? f : at::constant_pad_nd(f, {0, pad})).reshape({b, hk, r, n, c});
  };
  const at::Tensor beta = per_token(beta_in).unsqueeze(-1);  // (B, Hk, r, N, C, 1)
  const at::Tensor gc = per_token(g_in).cumsum(-1);          // (B, Hk, r, N, C): log decay from the chunk's start
  // decay[i, j] = exp(gc_i - gc_j) for j <= i within a chunk, 0 above the diagonal.
  const at::Tensor upper = at::ones({c, c}, gc.options().dtype(at::kBool)).triu(1);
  const at::Tensor decay = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(upper, -std::numeric_limits<double>::infinity()).exp();
  const at::Tensor kt = k.transpose(-1, -2);
  const at::Tensor kk = at::matmul(k, kt), qk = at::matmul(q, kt);  // (B, Hk, 1, N, C, C)
  // The UT transform: (I + strictly_lower(beta_i k_i.k_j decay_ij)) [u | w] = [beta v | beta k exp(gc)],
  // one solve for both right-hand sides.
  const at::Tensor gcx = gc.exp().unsqueeze(-1);                                   // (B, Hk, r, N, C, 1)
  const at::Tensor system = kk * (decay * beta);                                   // (B, Hk, r, N, C, C)
  const at::Tensor solved = at::linalg_solve_triangular(system, at::cat({v * beta, k * (beta * gcx)}, -1), /*upper=*/false,
                                                        /*left=*/true, /*unitriangular=*/true);
  const auto flat = [&](const at::Tensor& t, std::int64_t last) { return t.reshape({b, hv, n, t.size(-2), last}); };
  const auto uw = solved.split_with_sizes({dv, dk}, -1);
  const at::Tensor u = flat(uw[0], dv);  // (B, Hv, N, C, dv): the values each chunk writes, before the state's share
  // Per chunk [w ; q exp(gc)] (B, Hv, N, 2C, dk): how much of the incoming state each token's write
  // reads, and each query's read of it; one matmul with the state gives both.
  const at::Tensor reads = flat(at::cat({uw[1], q * gcx}, -2), dk);
  const at::Tensor intra = flat(qk * decay, c);                                    // (B, Hv, N, C, C)
  const at::Tensor last = gc.narrow(-1, c - 1, 1);                                 // (B, Hk, r, N, 1)
  const at::Tensor k_decayed = flat(k * (last - gc).exp().unsqueeze(-1), dk).transpose(-1, -2);  // (B, Hv, N, dk, C)
  const at::Tensor chunk_decay = last.exp().unsqueeze(-1).reshape({b, hv, n, 1, 1});
  // Each chunk's slices taken by one unbind per tensor: its backward stacks the chunks' gradients
  // once, where a select per chunk would zero-fill a whole-size gradient for every chunk.
  const std::vector<at::Tensor> us = u.unbind(2), rs = reads.unbind(2), intras = intra.unbind(2), ks = k_decayed.unbind(2),
                                decays = chunk_decay.unbind(2);
  std::vector<at::Tensor> out;
  out.reserve(static_cast<std::size_t>(n));
  at::Tensor state;  // (B, Hv, dk, dv); undefined: zero
  for (std::int64_t i = 0; i < n; ++i) {
    const auto x = static_cast<std::size_t>(i);
    at::Tensor v_new = us[x], o;                                    // (B, Hv, C, dv)
    if (state.defined()) {
      const auto both = at::matmul(rs[x], state).split(c, -2);       // w S, q exp(gc) S
      v_new = v_new - both[0];
      o = at::matmul(intras[x], v_new) + both[1];
    } else {
      o = at::matmul(intras[x], v_new);
    }
    out.push_back(o);
    if (i + 1 == n) break;
    const at::Tensor write = at::matmul(ks[x], v_new);
    state = state.defined() ? state * decays[x] + write : write;
  }
  at::Tensor o = at::stack(out, 2).reshape({b, hv, lp, dv});  // (B, Hv, L + pad, dv)
  if (pad != 0) o = o.narrow(2, 0, l);
  return o.transpose(1, 2).to(v_in.scalar_type()).contiguous();  // (B, L, Hv, dv)
}

at::Tensor recurrent_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                      const at::Tensor& g_in, const at::Tensor& beta_in) {
  check_shapes(q_in, k_in, v_in, g_in, beta_in);
  const std::int64_t b = v_in.size(0), l = v_in.size(1), hv = v_in.size(2), dv = v_in.size(3), dk = q_in.size(3);
  const at::Tensor q = heads_first(q_in, hv, 1.0 / std::sqrt(static_cast<double>(dk)));  // (B, Hv, L, dk)
  const at::Tensor k = heads_first(k_in, hv, 1.0);
  const at::Tensor v = v_in.to(at::kFloat).transpose(1, 2);          // (B, Hv, L, dv)
  const at::Tensor g = g_in.to(at::kFloat).transpose(1, 2), beta = beta_in.to(at::kFloat).transpose(1, 2);  // (B, Hv, L)
  at::Tensor state = at::zeros({b, hv, dk, dv}, v.options());
  std::vector<at::Tensor> out;
  for (std::int64_t t = 0; t < l; ++t) {
    state = state * g.select(2, t).exp().view({b, hv, 1, 1});
    const at::Tensor kt = k.select(2, t).unsqueeze(-1);                         // (B, Hv, dk, 1)
    const at::Tensor memory = (state * kt).sum(-2);                             // (B, Hv, dv)
    const at::Tensor delta = (v.select(2, t) - memory) * beta.select(2, t).unsqueeze(-1);
    state = state + kt * delta.unsqueeze(-2);
    out.push_back((state * q.select(2, t).unsqueeze(-1)).sum(-2));             // (B, Hv, dv)
  }
  return at::stack(out, 1).to(v_in.scalar_type());  // (B, L, Hv, dv)
}

at::Tensor causal_conv1d_silu(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 3 && w.dim() == 2 && w.size(0) == x.size(2), "megadsl: causal conv: x must be (B, L, C), w (C, K)");
  const std::int64_t l = x.size(1), taps = w.size(1);
  const at::Tensor xp = at::constant_pad_nd(x, {0, 0, taps - 1, 0});  // (B, K - 1 + L, C): zero history
  at::Tensor acc = xp.narrow(1, 0, l) * w.select(1, 0);
  for (std::int64_t j = 1; j < taps; ++j) acc = acc + xp.narrow(1, j, l) * w.select(1, j);
  return pointwise(acc, [](const at::Tensor& t) { return at::silu(t); });
}

}  // namespace megadsl
