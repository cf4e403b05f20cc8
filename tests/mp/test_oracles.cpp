// Megatron-Core's own oracles (reference §10), finite differences of the vocab-parallel
// log-prob/entropy gradients, and a peer that dies mid-job.
#include "../catch_torch.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "megadsl/layers/gated_delta_rule.hpp"
#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/vocab_parallel.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "mp_support.hpp"

namespace megadsl::test {

TEST_CASE("copy_to_tp backward of each rank's index sums over the tp group (Megatron: 6 and 22)", "[world8]") {
  REQUIRE(dist().world() == 8);
  auto groups = parallel_groups::build(dist(), layout{.tp = 4, .pp = 2});
  const at::Tensor x = at::full({3}, static_cast<double>(dist().rank()), at::kFloat).set_requires_grad(true);
  const at::Tensor y = copy_to_tp(x, *groups.tp);
  CHECK(at::equal(y.detach(), x.detach()));
  y.backward(at::full({3}, static_cast<double>(dist().rank())));
  const double expected = dist().rank() < 4 ? 6.0 : 22.0;
  CHECK(at::allclose(x.grad(), at::full({3}, expected)));
}

TEST_CASE("the other mappings: reduce, gather/scatter along the last dim and the token dim", "[world8]") {
  auto groups = parallel_groups::build(dist(), layout{.tp = 4, .pp = 2});
  const comm_group& tp = *groups.tp;
  const double r = static_cast<double>(tp.rank());
  const at::Tensor x = at::full({4, 2}, r, at::kFloat).set_requires_grad(true);
  // reduce_from_tp: forward sum 0+1+2+3, backward identity
  const at::Tensor red = reduce_from_tp(x, tp);
  CHECK(at::allclose(red, at::full({4, 2}, 6.0)));
  red.backward(at::ones({4, 2}));
  CHECK(at::allclose(x.grad(), at::ones({4, 2})));
  // gather_from_tp_last: (4, 2) -> (4, 8); backward keeps this rank's columns
  const at::Tensor x2 = at::full({4, 2}, r, at::kFloat).set_requires_grad(true);
  const at::Tensor g = gather_from_tp_last(x2, tp);
  CHECK(g.sizes() == at::IntArrayRef({4, 8}));
  CHECK(g[0][2 * tp.rank()].item<float>() == static_cast<float>(r));
  g.backward(at::arange(32, at::kFloat).view({4, 8}));
  CHECK(at::equal(x2.grad(), at::arange(32, at::kFloat).view({4, 8}).narrow(1, 2 * tp.rank(), 2)));
  // reduce_scatter_to_sp then gather_from_sp: the token dim
  const at::Tensor x3 = at::ones({8, 3}, at::kFloat).set_requires_grad(true);
  const at::Tensor rs = reduce_scatter_to_sp(x3, tp);  // (2, 3) filled with 4
  CHECK(at::allclose(rs, at::full({2, 3}, 4.0)));
  const at::Tensor back = gather_from_sp(rs, tp);  // (8, 3) of 4; backward reduce-scatters
  back.sum().backward();
  CHECK(at::allclose(x3.grad(), at::full({8, 3}, 4.0)));
}

TEST_CASE("vocab-parallel cross entropy over tp 4 (Megatron: 10.2309, 8.2309, 6.2309, 4.2309)", "[world4]") {
  REQUIRE(dist().world() == 4);
  auto groups = parallel_groups::build(dist(), layout{.tp = 4});
  const at::Tensor logits = at::arange(0, 8, at::kFloat).repeat({16, 4});  // (16, 32) on every rank
  const at::Tensor targets = at::arange(0, 32, 2, at::kLong);             // 0, 2, ..., 30
  const vocab_shard shard{groups.tp->rank() * 32, 128};
  const at::Tensor loss = vocab_parallel_cross_entropy(logits, targets, shard, groups.tp.get());
  const at::Tensor expected = at::tensor({10.2309f, 8.2309f, 6.2309f, 4.2309f}).repeat({4});
  CHECK(at::allclose(loss, expected, 0.0, 1e-4));
}

TEST_CASE("padded vocab columns never change log-probs, entropy or gradients", "[world4]") {
  auto groups = parallel_groups::build(dist(), layout{.tp = 4});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor full = at::randn({5, 40}, gen, at::kFloat);  // true vocab 37, padded to 40
  at::Tensor garbage = full.clone();
  garbage.narrow(1, 37, 3).fill_(50.0f);  // padding rows of a sharded LM head hold anything
  const at::Tensor labels = at::tensor({0L, 36L, 12L, 20L, 5L});
  const int r = groups.tp->rank();
  const at::Tensor mine = garbage.narrow(1, r * 10, 10).clone().set_requires_grad(true);
  const auto le = vocab_parallel_logprob_entropy(mine, labels, {r * 10, 37}, groups.tp.get());
  const at::Tensor ref = at::log_softmax(full.narrow(1, 0, 37), 1);
  CHECK(at::allclose(le.log_probs, ref.gather(1, labels.unsqueeze(1)).squeeze(1), 1e-5, 1e-6));
  CHECK(at::allclose(le.entropy, -(ref.exp() * ref).sum(1), 1e-5, 1e-6));
  (le.log_probs.sum() + le.entropy.sum()).backward();
  if (r == 3) CHECK(mine.grad().narrow(1, 7, 3).abs().sum().item<float>() == 0.0f);
}

TEST_CASE("log-prob and entropy gradients agree with finite differences (fp64, tp 4)", "[world4]") {
  auto groups = parallel_groups::build(dist(), layout{.tp = 4});
  const int r = groups.tp->rank();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor full = at::randn({3, 24}, gen, at::kDouble) * 2.0;  // same on every rank
  const at::Tensor labels = at::tensor({1L, 13L, 22L});
  const at::Tensor gl = at::tensor({0.7, -1.3, 0.4}, at::kDouble), gh = at::tensor({-0.2, 0.9, 1.1}, at::kDouble);
  auto objective = [&](const at::Tensor& logits_full) {
    const at::Tensor mine = logits_full.narrow(1, r * 6, 6);
    const auto le = vocab_parallel_logprob_entropy(mine, labels, {r * 6, 24}, groups.tp.get());
    return (le.log_probs * gl).sum() + (le.entropy * gh).sum();
  };
  const at::Tensor x = full.clone().set_requires_grad(true);
  objective(x).backward();
  // Analytic gradient of the full logits: each rank owns its columns.
  const at::Tensor analytic = groups.tp->all_gather(x.grad().narrow(1, r * 6, 6).contiguous(), 1);
  const double eps = 1e-6;
  double worst = 0.0;
  for (std::int64_t i = 0; i < full.size(0); ++i)
    for (std::int64_t j = 0; j < full.size(1); ++j) {
      at::Tensor plus = full.clone(), minus = full.clone();
      plus[i][j] += eps;
      minus[i][j] -= eps;
      const double fd = (objective(plus).item<double>() - objective(minus).item<double>()) / (2 * eps);
      worst = std::max(worst, std::abs(fd - analytic[i][j].item<double>()));
    }
  INFO("largest |finite difference - analytic| = " << worst);
  CHECK(worst < 1e-7);
}

TEST_CASE("the chunked LM head equals the whole one: log-probs, entropy and gradients of h and w (tp 4)", "[world4]") {
  auto groups = parallel_groups::build(dist(), layout{.tp = 4});
  const int r = groups.tp->rank();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  // 13 tokens of width 16, a true vocab of 37 padded to 40 (10 columns a rank, the last 3 padding).
  const at::Tensor h0 = at::randn({13, 16}, gen, at::kFloat);
  const at::Tensor w0 = at::randn({40, 16}, gen, at::kFloat).narrow(0, r * 10, 10).contiguous();
  const at::Tensor labels = at::randint(0, 37, {13}, gen, at::kLong);
  const at::Tensor rows_t = at::rand({13}, gen, at::kFloat) + 0.5;
  const at::Tensor gl = at::randn({13}, gen, at::kFloat), gh = at::randn({13}, gen, at::kFloat);
  for (const head_transform& t : {head_transform{}, head_transform{.softcap = 3.0, .scale = 0.5, .temperature = 0.7},
                                  head_transform{.scale = 4.0, .divides = true, .row_temperature = rows_t}}) {
    for (const bool entropy : {true, false}) {
      const auto run = [&](std::int64_t chunk) {
        const at::Tensor h = h0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
        const logprob_entropy le =
            chunk == 0 ? vocab_parallel_logprob_entropy(head_logits(h, w, t, 0, 13, false), labels, {r * 10, 37},
                                                        groups.tp.get(), entropy)
                       : chunked_head_logprob_entropy(h, w, labels, t, {r * 10, 37}, groups.tp.get(), entropy, false, chunk);
        at::Tensor loss = (le.log_probs * gl).sum();
        if (entropy) loss = loss + (le.entropy * gh).sum();
        loss.backward();
        return std::vector<at::Tensor>{le.log_probs, entropy ? le.entropy : at::zeros({13}), h.grad(), w.grad()};
      };
      const auto whole = run(0);
      for (const std::int64_t chunk : {1L, 4L, 13L, 100L}) {
        const auto part = run(chunk);
        for (std::size_t i = 0; i < whole.size(); ++i) {
          INFO("chunk " << chunk << ", output " << i << ", softcap " << t.softcap << ", entropy " << entropy << ", max diff "
               << (part[i] - whole[i]).abs().max().item<double>() << " of " << whole[i].abs().max().item<double>());
          CHECK(at::allclose(part[i], whole[i], 1e-6, 1e-6));
        }
      }
    }
  }
}

// HF's rotate-half RoPE as an expression: the oracle of the fused kernel, forward and backward.
at::Tensor rope_expression(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t r = cos.size(-1), half = r / 2;
  std::vector<std::int64_t> view(static_cast<std::size_t>(x.dim()), 1);
  view.front() = x.size(0);
  view.back() = r;
  const at::Tensor c = cos.to(x.scalar_type()).view(view), s = sin.to(x.scalar_type()).view(view);
  const at::Tensor xr = x.narrow(-1, 0, r);
  const at::Tensor rotated = at::cat({-xr.narrow(-1, half, half), xr.narrow(-1, 0, half)}, -1);
  const at::Tensor out = xr * c + rotated * s;
  return r < x.size(-1) ? at::cat({out, x.narrow(-1, r, x.size(-1) - r)}, -1) : out;
}

TEST_CASE("the fused RoPE equals HF's expression: same bits forward, the same gradient backward", "[world4]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (const std::int64_t rotary : {16L, 8L}) {  // full and partial rotary (head_dim 16)
    const at::Tensor positions = at::tensor({0L, 1L, 2L, 7L, 0L, 3L});
    const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(1) *
                             at::rand({rotary / 2}, gen, at::kFloat).unsqueeze(0);  // (T, r/2)
    const rope_tables t{at::cat({freqs, freqs}, -1).cos(), at::cat({freqs, freqs}, -1).sin()};
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
      const at::Tensor base = at::randn({6, 2, 3, 16}, gen, at::kFloat).to(dtype);  // (T, G, Q, d)
      // A strided view, as q is inside the fused q/k/v projection's output.
      const at::Tensor wide = at::cat({base, base}, 2).narrow(2, 1, 3);
      const at::Tensor x = wide.clone().set_requires_grad(true), y = wide.clone().set_requires_grad(true);
      const at::Tensor fused = apply_rope(x.narrow(2, 0, 3), t), expected = rope_expression(y.narrow(2, 0, 3), t.cos, t.sin);
      CHECK(at::equal(fused, expected));
      const at::Tensor g = at::randn(fused.sizes(), gen, at::kFloat).to(dtype);
      fused.backward(g);
      expected.backward(g);
      INFO("rotary " << rotary << ", dtype " << dtype);
      CHECK(at::allclose(x.grad(), y.grad(), dtype == at::kBFloat16 ? 1e-2 : 1e-6, dtype == at::kBFloat16 ? 1e-2 : 1e-12));
    }
  }
}

TEST_CASE("a batch without padding takes the fused causal kernel and gives the masked call's numbers, in both paths", "[world4]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const std::int64_t b = 2, s = 9;
  const at::Tensor q = at::randn({b * s, 2, 2, 8}, gen, at::kDouble), k = at::randn({b * s, 2, 8}, gen, at::kDouble),
                   v = at::randn({b * s, 2, 8}, gen, at::kDouble);
  const at::Tensor ones = at::ones({b, s}, at::kBool);
  for (const std::int64_t window : {0L, 4L}) {
    const attention_math m{.window = window};
    CHECK(at::allclose(attention_padded(q, k, v, {}, b, s, m), attention_padded(q, k, v, ones, b, s, m), 1e-12, 1e-12));
    // Remove-padding with sequences of one length takes the batched call: the same numbers as
    // the padded path and as each sequence alone (one sequence: the per-sequence call).
    const at::Tensor batched = attention_varlen(q, k, v, {0, s, 2 * s}, m);
    CHECK(at::allclose(batched, attention_padded(q, k, v, ones, b, s, m), 1e-12, 1e-12));
    for (std::int64_t row = 0; row < b; ++row) {
      const at::Tensor alone = attention_varlen(q.narrow(0, row * s, s), k.narrow(0, row * s, s), v.narrow(0, row * s, s), {0, s}, m);
      CHECK(at::allclose(batched.narrow(0, row * s, s), alone, 1e-12, 1e-12));
    }
  }
}

TEST_CASE("learned sinks through the fused kernel equal the explicit scores with the sink column, values and gradients", "[world4]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  const std::int64_t b = 2, s = 9;
  const auto leaf = [&](std::initializer_list<std::int64_t> size) { return at::randn(size, gen, at::kFloat).requires_grad_(true); };
  const at::Tensor q = leaf({b * s, 2, 2, 8}), k = leaf({b * s, 2, 8}), v = leaf({b * s, 2, 8}), sinks = leaf({4});
  const at::Tensor ones = at::ones({b, s}, at::kBool);  // a key mask: the explicit path
  // Each of (output, dq, dk, dv, dsinks) of one call.
  const auto run = [&](const std::function<at::Tensor(const attention_math&)>& call, const attention_math& m) {
    const at::Tensor out = call(m);
    const at::Tensor weight = at::linspace(-1.0, 1.0, out.numel(), at::kFloat).view(out.sizes());
    const auto grads = torch::autograd::grad({(out * weight).sum()}, {q, k, v, sinks});
    std::vector<at::Tensor> all{out.detach()};
    all.insert(all.end(), grads.begin(), grads.end());
    return all;
  };
  for (const auto& [window, chunk] : {std::pair{0L, 0L}, std::pair{4L, 0L}, std::pair{0L, 3L}}) {
    INFO("window " << window << ", chunk " << chunk);
    const attention_math m{.window = window, .chunk = chunk, .sinks = sinks};
    const auto fused = run([&](const attention_math& mm) { return attention_padded(q, k, v, {}, b, s, mm); }, m);
    const auto explicit_ = run([&](const attention_math& mm) { return attention_padded(q, k, v, ones, b, s, mm); }, m);
    for (std::size_t i = 0; i < fused.size(); ++i) CHECK(at::allclose(fused[i], explicit_[i], 1e-5, 1e-5));
    // Packed sequences of unequal lengths (7 and 11): each through the fused kernel alone.
    const auto packed = run([&](const attention_math& mm) { return attention_varlen(q, k, v, {0, 7, b * s}, mm); }, m);
    const auto first = run([&](const attention_math& mm) {
      return attention_padded(q.narrow(0, 0, 7), k.narrow(0, 0, 7), v.narrow(0, 0, 7), at::ones({1, 7}, at::kBool), 1, 7, mm);
    }, m);
    CHECK(at::allclose(packed[0].narrow(0, 0, 7), first[0], 1e-5, 1e-5));
  }
  // The sink takes its share of each row: without it the output differs.
  const at::Tensor plain = attention_padded(q, k, v, {}, b, s, attention_math{});
  CHECK(!at::allclose(plain, attention_padded(q, k, v, {}, b, s, attention_math{.sinks = sinks}), 1e-3, 1e-3));
}

TEST_CASE("the chunked gated delta rule equals the token-by-token rule, values and gradients, over several chunks", "[world4]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  // 150 tokens: two whole chunks of 64 and a part; 2 key heads, each serving 2 value heads.
  const std::int64_t b = 2, l = 150, hk = 2, hv = 4, dk = 8, dv = 6;
  const auto leaf = [&](const at::Tensor& t) { return t.detach().requires_grad_(true); };
  const at::Tensor q = leaf(at::randn({b, l, hk, dk}, gen, at::kFloat)), k = leaf(at::randn({b, l, hk, dk}, gen, at::kFloat));
  const at::Tensor v = leaf(at::randn({b, l, hv, dv}, gen, at::kFloat));
  // Slow decays (the state carries across the chunks' boundaries), rates in (0, 1).
  const at::Tensor g = leaf(-0.05 * at::rand({b, l, hv}, gen, at::kFloat));
  const at::Tensor beta = leaf(at::rand({b, l, hv}, gen, at::kFloat));
  const auto run = [&](const std::function<at::Tensor()>& call) {
    const at::Tensor out = call();
    const at::Tensor weight = at::linspace(-1.0, 1.0, out.numel(), at::kFloat).view(out.sizes());
    const auto grads = torch::autograd::grad({(out * weight).sum()}, {q, k, v, g, beta});
    std::vector<at::Tensor> all{out.detach()};
    all.insert(all.end(), grads.begin(), grads.end());
    return all;
  };
  const auto recurrent = run([&] { return recurrent_gated_delta_rule(q, k, v, g, beta); });
  for (const std::int64_t chunk : {64L, 16L}) {
    INFO("chunk " << chunk);
    const auto chunked = run([&] { return chunk_gated_delta_rule(q, k, v, g, beta, chunk); });
    const char* what[] = {"output", "dq", "dk", "dv", "dg", "dbeta"};
    for (std::size_t i = 0; i < chunked.size(); ++i) {
      INFO(what[i] << " max |diff| " << (chunked[i] - recurrent[i]).abs().max().item<double>());
      CHECK(at::allclose(chunked[i], recurrent[i], 1e-4, 1e-4));
    }
  }
  // Each row from its own zero state: a row alone gives its rows' outputs.
  const at::Tensor both = chunk_gated_delta_rule(q, k, v, g, beta).detach();
  const at::Tensor second = chunk_gated_delta_rule(q.narrow(0, 1, 1), k.narrow(0, 1, 1), v.narrow(0, 1, 1), g.narrow(0, 1, 1),
                                                   beta.narrow(0, 1, 1)).detach();
  CHECK(at::allclose(both.narrow(0, 1, 1), second, 1e-5, 1e-5));
  // The state carries across a chunk's boundary: the last tokens' outputs (the third chunk) change
  // when tokens of the second chunk do.
  const at::Tensor v2 = v.detach().clone();
  v2.narrow(1, 110, 10).add_(1.0);
  CHECK(!at::allclose(chunk_gated_delta_rule(q, k, v2, g, beta).narrow(1, l - 5, 5), both.narrow(1, l - 5, 5), 1e-3, 1e-3));
  // The causal conv: zero history, each output from its own and the K - 1 earlier inputs.
  const at::Tensor x = at::randn({1, 6, 3}, gen, at::kFloat), w = at::randn({3, 4}, gen, at::kFloat);
  const at::Tensor y = causal_conv1d_silu(x, w);
  const auto tap = [&](std::int64_t t, std::int64_t j) { return t < 0 ? at::zeros({3}) : x[0][t] * w.select(1, j); };
  for (const std::int64_t t : {0L, 2L, 5L})
    CHECK(at::allclose(y[0][t], at::silu(tap(t - 3, 0) + tap(t - 2, 1) + tap(t - 1, 2) + tap(t, 3)), 1e-6, 1e-6));
}

// A column-parallel linear's rank holds a share of its output rows (Qwen3-Next's in_proj_ba: 16
// at tp 1, 8 at tp 2, 4 at tp 4). On AVX-512 MKL sums a GEMM with 8 or fewer output columns in
// another order, so invariant arithmetic runs every GEMM on fixed column tiles.
TEST_CASE("an invariant linear's output column has the same bits whatever the output width and rows", "[world4]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (const std::int64_t k : {48L, 64L, 96L, 200L}) {
    const at::Tensor x = at::randn({300, k}, gen, at::kFloat), w = at::randn({600, k}, gen, at::kFloat);
    const at::Tensor b = at::randn({600}, gen, at::kFloat);
    const at::Tensor whole = invariant_linear(x, w, b);
    for (const std::int64_t first : {0L, 8L, 60L, 200L}) {
      for (const std::int64_t n : {1L, 2L, 4L, 8L, 12L, 16L, 64L, 70L, 128L, 300L}) {
        INFO("k " << k << ", output columns " << first << " + " << n);
        CHECK(at::equal(invariant_linear(x, w.narrow(0, first, n), b.narrow(0, first, n)), whole.narrow(1, first, n)));
        CHECK(at::equal(invariant_linear(x.narrow(0, 7, 9), w.narrow(0, first, n)), invariant_linear(x, w).narrow(0, 7, 9).narrow(1, first, n)));
      }
    }
  }
}

// Hidden ([.]): run by its own CTest entry, which expects the error text and a clean exit.
TEST_CASE("a peer that dies is named by the survivors' failing collective", "[.dead_peer]") {
  auto groups = parallel_groups::build(dist(), layout{.tp = 2});
  at::Tensor t = at::ones({4});
  groups.tp->all_reduce(t);  // everyone alive
  if (dist().rank() == 1) std::_Exit(3);
  std::string error;
  try {
    groups.tp->all_reduce(t);
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::fprintf(stderr, "survivor saw: %s\n", error.c_str());
  // rank 1 is gone: skip the leave-together handshake; the exit code says whether it was named.
  std::_Exit(error.find("rank 1 stopped responding") != std::string::npos ? 0 : 1);
}


// Hidden ([.]): started rank by rank, torchrun-style, by tests/mp/peer_watch_test.sh, which kills
// or stops one rank and times how long the others take to end. Each tp pair only ever talks to
// itself, so the other pair can learn of the failure only through the job's watch.
TEST_CASE("ranks keep exchanging until the job fails", "[.peer_watch]") {
  auto groups = parallel_groups::build(dist(), layout{.tp = 2});
  at::Tensor t = at::ones({1024});
  groups.tp->all_reduce(t);
  std::fprintf(stderr, "[rank %lld] ready\n", static_cast<long long>(dist().rank()));
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    groups.tp->all_reduce(t);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL("nothing ended this rank within 60 s");
}

}  // namespace megadsl::test
