// The mixture-of-experts layer over real process groups: experts split over ep 1, 2 and 4 with
// all-to-all token dispatch equal the layer written out token by token in one process, forward and
// backward; routing supplied by the caller (a replay) is followed to the expert, including experts
// no token reaches.
#include "../catch_torch.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <string>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/moe.hpp"
#include "megadsl/rank_grid.hpp"
#include "mp_support.hpp"

namespace megadsl::test {
namespace {

constexpr std::int64_t experts = 8, hidden = 16, ffn = 24, top_k = 2;

at::Tensor seeded(std::vector<std::int64_t> size, std::uint64_t seed, double std = 0.2) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, std, size, gen);
}

struct moe_run {
  at::Tensor out, x_grad, router_grad, gate_up_grad, down_grad;  // expert grads: this rank's experts
};

// The layer written out token by token from HF's definition, independent of moe_experts:
// y_t = sum_j w_tj * down_e(silu(gate_e x_t) * up_e x_t), e = indices[t, j].
at::Tensor naive_experts(const at::Tensor& x, const routing& r, const at::Tensor& gate_up, const at::Tensor& down) {
  std::vector<at::Tensor> out;
  for (std::int64_t t = 0; t < x.size(0); ++t) {
    at::Tensor acc = at::zeros({hidden});
    for (std::int64_t j = 0; j < r.indices.size(1); ++j) {
      const std::int64_t e = r.indices[t][j].item<std::int64_t>();
      const at::Tensor gu = at::mv(gate_up[e], x[t]);
      const at::Tensor act = at::silu(gu.narrow(0, 0, ffn)) * gu.narrow(0, ffn, ffn);
      acc = acc + r.weights[t][j] * at::mv(down[e], act);
    }
    out.push_back(acc);
  }
  return out.empty() ? x * 0.0 : at::stack(out);  // no token: (0, h), still in the graph
}

// One forward and backward of the layer on this rank's tokens, with the experts [first, first + n)
// of the full weights; `given` routes instead of the router when defined (a replay). `naive`: the
// token-by-token definition with every expert instead of moe_experts.
moe_run run_layer(const at::Tensor& tokens, const at::Tensor& seen_by_loss, std::int64_t first, std::int64_t n,
                  const comm_group* ep, const at::Tensor& given = {}, bool naive = false) {
  const at::Tensor router = seeded({experts, hidden}, 11).set_requires_grad(true);
  const at::Tensor gate_up = seeded({experts, 2 * ffn, hidden}, 12).narrow(0, first, n).clone().set_requires_grad(true);
  const at::Tensor down = seeded({experts, hidden, ffn}, 13).narrow(0, first, n).clone().set_requires_grad(true);
  const at::Tensor x = tokens.clone().set_requires_grad(true);
  routing r = route(at::linear(x, router), top_k, /*renormalise=*/true);
  if (given.defined()) r.indices = given;  // the weights still come from the live router
  if (given.defined()) r.weights = at::softmax(at::linear(x, router), -1, at::kFloat).gather(1, given);
  const at::Tensor y = naive ? naive_experts(x, r, gate_up, down)
                             : moe_experts(x, r, {.experts = experts, .first = first, .gate_up = gate_up.unbind(0), .down = down.unbind(0)},
                                           silu_activation, ep);
  (y * seen_by_loss).sum().backward();
  auto grad = [](const at::Tensor& t) { return t.grad().defined() ? t.grad() : at::zeros_like(t); };
  return {y.detach(), grad(x), grad(router), grad(gate_up), grad(down)};
}

// The rank's expert-parallel and expert-data-parallel groups of the expert grid at this ep.
struct expert_groups {
  std::unique_ptr<comm_group> ep, edp, world;
  expert_grid grid;
};
expert_groups make_expert_groups(std::int64_t ep) {
  expert_groups g;
  g.grid = expert_grid::from(layout{.ep = ep}, dist().world());
  const std::int64_t generation = dist().next_generation();
  g.ep = dist().make_group("ep", g.grid.ep_group(dist().rank()), generation);
  g.edp = dist().make_group("edp", g.grid.edp_group(dist().rank()), generation);
  std::vector<std::int64_t> all(static_cast<std::size_t>(dist().world()));
  for (std::int64_t r = 0; r < dist().world(); ++r) all[static_cast<std::size_t>(r)] = r;
  g.world = dist().make_group("world", all, generation);
  return g;
}

void check_against_one_process(std::int64_t ep, bool replay) {
  const std::int64_t rank = dist().rank();
  expert_groups g = make_expert_groups(ep);
  const std::int64_t per_rank = experts / ep, first = g.grid.coords(rank).ep * per_rank;
  // Every rank its own, unevenly many tokens (rank 3 has 13, rank 0 has 7; none with the replay,
  // so one rank of each ep group only receives).
  const std::int64_t count = replay && rank == 0 ? 0 : 7 + 2 * rank;
  const at::Tensor tokens = seeded({count, hidden}, 100 + static_cast<std::uint64_t>(rank), 1.0);
  const at::Tensor seen = seeded({count, hidden}, 200 + static_cast<std::uint64_t>(rank), 1.0);
  // A replayed routing that leaves experts 5, 6, 7 without a token.
  at::Tensor given;
  if (replay) given = at::stack({at::arange(count) % 3, (at::arange(count) + 1) % 5}, 1);

  global_comm_stats().reset();
  const moe_run split = run_layer(tokens, seen, first, per_rank, g.ep.get(), given);
  const std::int64_t bytes = global_comm_stats().bytes;
  const moe_run whole = run_layer(tokens, seen, 0, experts, nullptr, given, /*naive=*/true);
  const moe_run local = run_layer(tokens, seen, 0, experts, nullptr, given);  // every expert here, no dispatch
  CHECK(max_abs_diff(local.out, whole.out) <= 1e-6);
  CHECK(max_abs_diff(local.x_grad, whole.x_grad) <= 1e-6);

  INFO("ep " << ep << (replay ? ", replayed routing" : ""));
  CHECK(max_abs_diff(split.out, whole.out) <= 1e-6);
  CHECK(max_abs_diff(split.x_grad, whole.x_grad) <= 1e-6);
  // The router's gradient sums every token's contributions, in another order once split over
  // ranks: fp32 summation noise relative to its size (1.01e-6 at a magnitude of 2.6 on this AMD EPYC).
  const double router_scale = std::max(1.0, whole.router_grad.abs().max().item<double>());
  INFO("router gradient magnitude " << router_scale);
  CHECK(max_abs_diff(split.router_grad, whole.router_grad) <= 1e-6 * router_scale);
  // An expert's gradient: every token routed to it, from every rank. Here it is summed over the
  // expert-data-parallel group (the copies of this shard); there over the world, then sliced.
  at::Tensor gu = split.gate_up_grad.contiguous(), dn = split.down_grad.contiguous();
  g.edp->all_reduce(gu);
  g.edp->all_reduce(dn);
  at::Tensor gu_ref = whole.gate_up_grad.contiguous(), dn_ref = whole.down_grad.contiguous();
  g.world->all_reduce(gu_ref);
  g.world->all_reduce(dn_ref);
  CHECK(max_abs_diff(gu, gu_ref.narrow(0, first, per_rank)) <= 1e-5);
  CHECK(max_abs_diff(dn, dn_ref.narrow(0, first, per_rank)) <= 1e-5);
  CHECK(gu_ref.abs().max().item<double>() > 1e-3);  // the experts did learn something
  if (ep > 1) CHECK(bytes > 0);  // tokens went over the wire
  if (replay) {
    // The replayed experts 5..7 saw no token: zero gradient, on whichever rank holds them.
    at::Tensor idle = gu_ref.narrow(0, 5, 3);
    CHECK(idle.abs().max().item<double>() == 0.0);
  }
}

}  // namespace

TEST_CASE("MoE experts split over ep 1, 2, 4 with all-to-all dispatch equal every expert in one process", "[world4][moe]") {
  REQUIRE(dist().world() == 4);
  for (const std::int64_t ep : {1, 2, 4}) check_against_one_process(ep, /*replay=*/false);
}

TEST_CASE("MoE dispatch follows a replayed routing, with experts and a rank that no token reaches", "[world4][moe]") {
  REQUIRE(dist().world() == 4);
  for (const std::int64_t ep : {2, 4}) check_against_one_process(ep, /*replay=*/true);
}

TEST_CASE("the router: softmax in fp32, top-k, renormalised or not (HF's order)", "[world4][moe]") {
  const at::Tensor logits = at::tensor({2.0, 1.0, 0.0, -1.0}, at::kFloat).view({1, 4});
  const routing plain = route(logits, 2, false), norm = route(logits, 2, true);
  const at::Tensor p = at::softmax(logits, -1);
  CHECK(at::equal(plain.indices, at::tensor({0, 1}, at::kLong).view({1, 2})));
  CHECK(at::allclose(plain.weights, p.narrow(1, 0, 2)));
  CHECK(at::allclose(norm.weights, p.narrow(1, 0, 2) / p.narrow(1, 0, 2).sum()));
  CHECK(norm.weights.scalar_type() == at::kFloat);
  // A routing that names an expert the layer does not have is refused, naming it.
  const routing bad{at::tensor({0, 9}, at::kLong).view({1, 2}), at::ones({1, 2})};
  const local_experts all{.experts = 8, .first = 0, .gate_up = at::zeros({8, 2 * ffn, hidden}).unbind(0),
                          .down = at::zeros({8, hidden, ffn}).unbind(0)};
  CHECK_THROWS_WITH(moe_experts(at::zeros({1, hidden}), bad, all, silu_activation, nullptr), Catch::Contains("names expert 9"));
}

TEST_CASE("ERNIE's router: the bias selects, the unbiased probabilities weigh, their sum floored", "[world4][moe]") {
  const at::Tensor logits = at::tensor({2.0, 1.0, 0.0, -1.0}, at::kFloat).view({1, 4});
  const at::Tensor p = at::softmax(logits, -1);
  // A bias that lifts experts 2 and 3 over 0 and 1 picks them; their weights are p[2], p[3] renormalised.
  const at::Tensor bias = at::tensor({0.0, 0.0, 0.7, 0.8}, at::kFloat);  // scores p + bias: 0.64, 0.24, 0.79, 0.83
  const routing r = route_softmax_biased(logits, bias, 2, 1e-12);
  CHECK(at::equal(r.indices, at::tensor({3, 2}, at::kLong).view({1, 2})));
  const at::Tensor chosen = at::stack({p[0][3], p[0][2]}).view({1, 2});
  CHECK(at::allclose(r.weights, chosen / chosen.sum()));
  // Where the chosen probabilities sum below the floor, they are divided by the floor
  // (Ernie4_5_MoeTopKRouter's clamp(min=moe_norm_min)); so are the replayed weights.
  const double floor = 0.5;
  const routing f = route_softmax_biased(logits, bias, 2, floor);
  CHECK(chosen.sum().item<double>() < floor);
  CHECK(at::allclose(f.weights, chosen / floor));
  CHECK(at::allclose(softmax_weights(logits, f.indices, true, floor), f.weights));
  // Without a floor above the sum, the plain softmax router is unchanged by one.
  CHECK(at::allclose(route(logits, 2, true, 1e-12).weights, route(logits, 2, true).weights));
}

}  // namespace megadsl::test
