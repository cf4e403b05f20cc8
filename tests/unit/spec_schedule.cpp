// Pipeline schedules: the worked orders of megatron-core-semantics.md §4 literally, the
// invariants over a sweep of (pp, microbatches, vpp, group size), the exchange between ranks
// replayed with batched and with blocking transfers, the bubble simulation against the formula,
// and the interleaved rules with their messages.
#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "megadsl/schedule.hpp"

namespace {

using megadsl::op_kind;
using megadsl::pipeline_op;
using megadsl::schedule_kind;
using megadsl::schedule_mode;
using megadsl::schedule_ops;
using megadsl::tensor_id;

std::string order(schedule_kind k, std::int64_t pp, std::int64_t r, std::int64_t m, std::int64_t v = 1) {
  return megadsl::compute_order(schedule_ops(k, pp, r, m, v), v > 1);
}

// Compile-time: the schedule is constexpr data, the rules a constexpr check.
static_assert(megadsl::select_schedule(1, 1) == schedule_kind::no_pipelining);
static_assert(megadsl::select_schedule(4, 1) == schedule_kind::one_f_one_b);
static_assert(megadsl::select_schedule(4, 2) == schedule_kind::interleaved);
static_assert(megadsl::warmup_microbatches(schedule_kind::interleaved, 4, 0, 8, 2) == 10);
// Rank 0 of 1F1B p=4 m=8: 16 computes, 3 warmup sends, 5 send_forward_recv_backward, 3 recv_backward.
static_assert(schedule_ops(schedule_kind::one_f_one_b, 4, 0, 8).size() == 16 + 3 + 5 + 3);
static_assert(megadsl::check_schedule(4, 8, 2).ok());
static_assert(megadsl::check_schedule(4, 6, 2).has("interleaved_microbatches"));
static_assert(megadsl::check_schedule(1, 8, 2).has("vpp_needs_pp"));
static_assert(megadsl::check_schedule(4, 10, 2, 5).ok());  // N = 5 divides 10
static_assert(megadsl::check_schedule(4, 10, 2, 6).ok());  // 10 % 6 = 4 >= p

}  // namespace

TEST_CASE("1F1B p=4 m=8: the reference's order on every rank", "[schedule]") {
  // megatron-core-semantics.md §4, "Example, p=4, m=8" (the bars mark warmup | steady | cooldown).
  CHECK(order(schedule_kind::one_f_one_b, 4, 0, 8) ==
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(order(schedule_kind::one_f_one_b, 4, 1, 8) ==
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(order(schedule_kind::one_f_one_b, 4, 2, 8) ==
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  CHECK(order(schedule_kind::one_f_one_b, 4, 3, 8) ==
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST_CASE("1F1B p=4 m=8 rank 1: every op in Megatron's order", "[schedule]") {
  // forward_backward_pipelining_without_interleaving on a middle rank: W = 2 warmup steps, one
  // recv_forward, 6 steady steps (the last ends in send_backward), 2 cooldown steps.
  const std::vector<std::string> expected = {
      "recv_forward(recv_prev 0.0)", "F0", "send_forward(send_next 0.0)",
      "recv_forward(recv_prev 1.0)", "F1", "send_forward(send_next 1.0)",
      "recv_forward(recv_prev 2.0)",
      "F2", "send_forward_recv_backward(send_next 2.0,recv_next 0.0)", "B0", "send_backward_recv_forward(send_prev 0.0,recv_prev 3.0)",
      "F3", "send_forward_recv_backward(send_next 3.0,recv_next 1.0)", "B1", "send_backward_recv_forward(send_prev 1.0,recv_prev 4.0)",
      "F4", "send_forward_recv_backward(send_next 4.0,recv_next 2.0)", "B2", "send_backward_recv_forward(send_prev 2.0,recv_prev 5.0)",
      "F5", "send_forward_recv_backward(send_next 5.0,recv_next 3.0)", "B3", "send_backward_recv_forward(send_prev 3.0,recv_prev 6.0)",
      "F6", "send_forward_recv_backward(send_next 6.0,recv_next 4.0)", "B4", "send_backward_recv_forward(send_prev 4.0,recv_prev 7.0)",
      "F7", "send_forward_recv_backward(send_next 7.0,recv_next 5.0)", "B5", "send_backward(send_prev 5.0)",
      "recv_backward(recv_next 6.0)", "B6", "send_backward(send_prev 6.0)",
      "recv_backward(recv_next 7.0)", "B7", "send_backward(send_prev 7.0)"};
  std::vector<std::string> got;
  for (const pipeline_op& op : schedule_ops(schedule_kind::one_f_one_b, 4, 1, 8))
    got.push_back(megadsl::to_string(op));
  CHECK(got == expected);
}

TEST_CASE("interleaved p=4 v=2 m=8: the reference's rows", "[schedule]") {
  // r0 is the reference row verbatim (W = 10).
  CHECK(order(schedule_kind::interleaved, 4, 0, 8, 2) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 "
        "F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
        "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  // r3 (W = 4): the reference writes "F4.0 B0.0 ... F7.1 B7.1"; the elided steady pairs are
  // completed by Megatron's rule, forward step W+k runs table[W+k] and backward step k runs
  // (table[k].mb, v-1-table[k].chunk), with table = (0..3, c0)(0..3, c1)(4..7, c0)(4..7, c1):
  //   k=4..7:  F(table[8..11]) = F4.0 F5.0 F6.0 F7.0  with  B(table[4..7])  = B0.0 B1.0 B2.0 B3.0
  //   k=8..11: F(table[12..15]) = F4.1 .. F7.1         with  B(table[8..11]) = B4.1 B5.1 B6.1 B7.1
  CHECK(order(schedule_kind::interleaved, 4, 3, 8, 2) ==
        "F0.0 F1.0 F2.0 F3.0 "
        "F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 "
        "F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 "
        "B4.0 B5.0 B6.0 B7.0");
  // r1 (W = 8) and r2 (W = 6) are not in the reference; derived by the same rule.
  CHECK(order(schedule_kind::interleaved, 4, 1, 8, 2) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 "
        "F4.0 B0.1 F5.0 B1.1 F6.0 B2.1 F7.0 B3.1 F4.1 B0.0 F5.1 B1.0 F6.1 B2.0 F7.1 B3.0 "
        "B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
  CHECK(order(schedule_kind::interleaved, 4, 2, 8, 2) ==
        "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 "
        "F2.1 B0.1 F3.1 B1.1 F4.0 B2.1 F5.0 B3.1 F6.0 B0.0 F7.0 B1.0 F4.1 B2.0 F5.1 B3.0 F6.1 B4.1 F7.1 B5.1 "
        "B6.1 B7.1 B4.0 B5.0 B6.0 B7.0");
}

TEST_CASE("interleaved p=4 v=2 m=8 rank 0: the exchanges around the steady state", "[schedule]") {
  const auto ops = schedule_ops(schedule_kind::interleaved, 4, 0, 8, 2);
  std::vector<std::string> s;
  for (const pipeline_op& op : ops) s.push_back(megadsl::to_string(op, true));
  // Rank 0 receives nothing for its first p-1 = 3 steps; at step 3 it gets what rank 3 produced at
  // step 0 (F0.0) as the input of its chunk 1.
  CHECK(s[6] == "F3.0");
  CHECK(s[7] == "send_forward_recv_forward(recv_prev 0.1,send_next 3.0)");
  // The last warmup step also fetches the first backward's gradient (send_forward_backward_recv_
  // forward_backward with nothing to receive forward: rank 3's step 6 ran its last chunk).
  CHECK(s[18] == "F5.0");
  CHECK(s[19] == "send_forward_recv_backward(send_next 5.0,recv_next 0.1)");
  // Steady state: F then B, then one batch with all four transfers where there are four.
  CHECK(s[20] == "F6.0");
  CHECK(s[21] == "B0.1");
  CHECK(s[22] == "send_forward_backward_recv_forward_backward(send_prev 0.1,send_next 6.0,recv_next 1.1)");
  CHECK(s[25] == "send_forward_backward_recv_forward_backward(send_prev 1.1,recv_prev 4.1,send_next 7.0,recv_next 2.1)");
  // Rank 0 sends no gradient out of chunk 0 (the model's first stage).
  CHECK(s.back() == "B7.0");
  CHECK(s[s.size() - 2] == "recv_backward(recv_next 7.0)");
}

TEST_CASE("schedule invariants over a sweep of pp, microbatches, vpp and group size", "[schedule]") {
  int checked = 0;
  for (std::int64_t p = 1; p <= 6; ++p)
    for (std::int64_t v = 1; v <= 4; ++v)
      for (std::int64_t m = 1; m <= 17; ++m)
        for (std::int64_t n : {std::int64_t{0}, p + 1, p + 2, p + 3}) {
          if ((v == 1 && n != 0) || !megadsl::check_schedule(p, m, v, n).ok()) continue;
          const schedule_kind kind = megadsl::select_schedule(p, v);
          const std::int64_t group = megadsl::group_size_or_default(p, n);
          INFO("p = " << p << ", v = " << v << ", m = " << m << ", N = " << group);
          for (std::int64_t r = 0; r < p; ++r) {
            INFO("rank " << r);
            const auto ops = schedule_ops(kind, p, r, m, v, n);
            std::map<std::pair<std::int64_t, std::int64_t>, std::pair<int, int>> seen;  // F, B counts
            std::int64_t warmup = -1, forwards = 0, in_flight = 0, max_in_flight = 0;
            for (const pipeline_op& op : ops) {
              if (!op.is_compute()) continue;
              auto& [f, b] = seen[{op.microbatch, op.chunk}];
              if (op.kind == op_kind::forward) {
                ++f;
                ++forwards;
                max_in_flight = std::max(max_in_flight, ++in_flight);
              } else {
                REQUIRE(f == 1);  // F before its B
                ++b;
                --in_flight;
                if (warmup < 0) warmup = forwards;
              }
            }
            REQUIRE(static_cast<std::int64_t>(seen.size()) == m * v);
            for (const auto& [id, counts] : seen) {
              CHECK(id.first < m);
              CHECK(id.second < v);
              CHECK(counts == std::pair{1, 1});
            }
            // `warmup` counted the forwards before the first backward: W, plus the steady
            // state's first forward when there is a steady state.
            std::int64_t w = 0;
            if (kind == schedule_kind::one_f_one_b) {
              w = std::min(p - r - 1, m);
              CHECK(max_in_flight == std::min(p - r, m));  // the reference's "in flight"
            } else if (kind == schedule_kind::interleaved) {
              w = std::min(2 * (p - r - 1) + (v - 1) * group, m * v);
            }
            CHECK(w == megadsl::warmup_microbatches(kind, p, r, m, v, n));
            CHECK(warmup == std::min(w + 1, m * v));
          }
          // Every send meets its receive on the neighbour, in order, and nothing deadlocks:
          // batched (batch_isend_irecv) and one blocking transfer at a time in even/odd order.
          for (auto semantics : {megadsl::p2p_semantics::batched, megadsl::p2p_semantics::blocking_even_odd}) {
            const auto train = megadsl::verify_exchange(kind, p, m, v, n, schedule_mode::train, semantics);
            INFO(train.error);
            CHECK(train.ok);
            CHECK(train.transfers == 2 * m * (p * v - 1));  // each microbatch crosses p*v-1 boundaries twice
            const auto eval = megadsl::verify_exchange(kind, p, m, v, n, schedule_mode::forward_only, semantics);
            INFO(eval.error);
            CHECK(eval.ok);
            CHECK(eval.transfers == m * (p * v - 1));
          }
          ++checked;
        }
  CHECK(checked > 300);
}

TEST_CASE("forward-only schedules run every forward once and no backward", "[schedule]") {
  CHECK(megadsl::compute_order(schedule_ops(schedule_kind::one_f_one_b, 4, 1, 5, 1, 0, schedule_mode::forward_only)) ==
        "F0 F1 F2 F3 F4");
  CHECK(megadsl::compute_order(schedule_ops(schedule_kind::interleaved, 2, 1, 2, 2, 0, schedule_mode::forward_only), true) ==
        "F0.0 F1.0 F0.1 F1.1");
  CHECK(megadsl::compute_order(schedule_ops(schedule_kind::no_pipelining, 1, 0, 3)) == "F0 B0 F1 B1 F2 B2");
  // 1F1B at pp = 1 is accepted and degenerates to no pipelining.
  CHECK(schedule_ops(schedule_kind::one_f_one_b, 1, 0, 3) == schedule_ops(schedule_kind::no_pipelining, 1, 0, 3));
}

TEST_CASE("verify_exchange reports a mismatch, a missing input and a deadlock", "[schedule]") {
  std::vector<std::vector<pipeline_op>> lists;
  for (std::int64_t r = 0; r < 4; ++r) lists.push_back(schedule_ops(schedule_kind::one_f_one_b, 4, r, 8));
  REQUIRE(megadsl::verify_exchange(lists, 1).ok);

  auto swapped = lists;  // rank 1 sends F0's output before receiving its input
  std::swap(swapped[1][0], swapped[1][2]);
  CHECK(megadsl::verify_exchange(swapped, 1).error ==
        "rank 1 op 0 send_forward(send_next 0.0): sends a tensor its compute has not produced yet");

  auto dropped = lists;  // rank 2 never posts its first receive
  dropped[2].erase(dropped[2].begin());
  CHECK(megadsl::verify_exchange(dropped, 1).error ==
        "rank 2 op 0 F0.0: its input activation was never received");

  const auto p2p = [](tensor_id sn, tensor_id rp, tensor_id sp, tensor_id rn) {
    return pipeline_op{.kind = megadsl::p2p_kind(sn.active(), rp.active(), sp.active(), rn.active()),
                       .send_next = sn, .recv_prev = rp, .send_prev = sp, .recv_next = rn};
  };
  const tensor_id none{};
  const pipeline_op f0{.kind = op_kind::forward, .microbatch = 0, .chunk = 0};
  // Rank 0 sends microbatch 0 where rank 1 waits for microbatch 1.
  const std::vector<std::vector<pipeline_op>> mismatch = {{f0, p2p({0, 0}, none, none, none)},
                                                          {p2p(none, {1, 0}, none, none)}};
  CHECK(megadsl::verify_exchange(mismatch, 1).error ==
        "rank 1 op 0 recv_forward(recv_prev 1.0): rank 0 sends 0.0 where rank 1 expects 1.0");
  // Both ranks wait to receive first.
  const std::vector<std::vector<pipeline_op>> deadlock = {{p2p(none, none, none, {0, 0}), f0},
                                                          {p2p(none, {0, 0}, none, none)}};
  CHECK(megadsl::verify_exchange(deadlock, 1).error ==
        "deadlock: rank 0 waits in op 0 recv_backward(recv_next 0.0); rank 1 waits in op 0 recv_forward(recv_prev 0.0)");
}

TEST_CASE("simulated idle time equals the bubble formula", "[schedule]") {
  // 1F1B p=4 m=8, F = 1, B = 2: makespan (m + p - 1)(F + B) = 33, each rank busy 24, idle 9.
  const auto t = megadsl::simulate_schedule(schedule_kind::one_f_one_b, 4, 8);
  CHECK(t.makespan == Approx(33.0));
  for (const auto& r : t.ranks) {
    CHECK(r.busy == Approx(24.0));
    CHECK(r.bubble == Approx(3.0 / 8));           // (p - 1) / m
    CHECK(r.idle_fraction == Approx(9.0 / 33));  // b / (1 + b)
  }
  CHECK(megadsl::bubble_fraction(schedule_kind::one_f_one_b, 4, 8) == Approx(3.0 / 8));
  CHECK(megadsl::idle_fraction(schedule_kind::one_f_one_b, 4, 8) == Approx(9.0 / 33));
  CHECK(megadsl::bubble_fraction(schedule_kind::interleaved, 4, 8, 2) == Approx(3.0 / 16));
  CHECK(megadsl::bubble_fraction(schedule_kind::no_pipelining, 1, 8) == 0.0);

  // Over a sweep, with B = F, 2F and 3F, every rank idles exactly the formula's bubble (chunks
  // cost F and B each, so interleaving divides the bubble by v).
  for (double backward : {1.0, 2.0, 3.0})
    for (std::int64_t p = 1; p <= 6; ++p)
      for (std::int64_t v = 1; v <= 3; ++v)
        for (std::int64_t m = 1; m <= 16; ++m) {
          if (!megadsl::check_schedule(p, m, v).ok()) continue;
          const schedule_kind kind = megadsl::select_schedule(p, v);
          const auto sim = megadsl::simulate_schedule(kind, p, m, v, 0, {1.0, backward});
          INFO("p = " << p << ", v = " << v << ", m = " << m << ", B = " << backward);
          for (const auto& r : sim.ranks) {
            CHECK(r.busy == Approx(static_cast<double>(m * v) * (1.0 + backward)));
            CHECK(r.bubble == Approx(megadsl::bubble_fraction(kind, p, m, v)).margin(1e-12));
            CHECK(r.idle_fraction == Approx(megadsl::idle_fraction(kind, p, m, v)).margin(1e-12));
          }
        }
}

TEST_CASE("invalid schedules are rejected with the rule's message", "[schedule]") {
  using Catch::Matchers::Equals;
  // N = p (the default): the rules.hpp wording, word for word.
  CHECK_THROWS_WITH(schedule_ops(schedule_kind::interleaved, 4, 0, 6, 2),
                    Equals("megadsl: invalid schedule: interleaved_microbatches: number of microbatches 6 is "
                           "not divisible by pp = 4 with the interleaved schedule; use 4 or 8 microbatches"));
  CHECK_THROWS_WITH(schedule_ops(schedule_kind::interleaved, 4, 0, 2, 2),
                    Equals("megadsl: invalid schedule: interleaved_microbatches: number of microbatches 2 is "
                           "not divisible by pp = 4 with the interleaved schedule; use 4 or 8 microbatches"));
  // An explicit group size N: p <= N <= m, and a last group of 0 or >= p microbatches.
  CHECK(std::string(megadsl::check_schedule(4, 10, 2, 3).joined().view()) ==
        "interleaved_microbatches: microbatch_group_size_per_vp_stage = 3 must lie in [pp, microbatches] "
        "= [4, 10] with the interleaved schedule; valid group sizes: 5, 6, 10");
  CHECK(std::string(megadsl::check_schedule(4, 10, 2, 7).joined().view()) ==
        "interleaved_microbatches: microbatches = 10 leave a last group of 3 < pp = 4 with "
        "microbatch_group_size_per_vp_stage = 7 (a dependency bubble); valid group sizes: 5, 6, 10; "
        "or with this group size use 7 or 11 microbatches");
  CHECK(std::string(megadsl::check_schedule(4, 2, 2, 5).joined().view()) ==
        "interleaved_microbatches: microbatch_group_size_per_vp_stage = 5 must lie in [pp, microbatches] "
        "= [4, 2] with the interleaved schedule; use at least pp = 4 microbatches");
  // vpp > 1 needs pp > 1 (rules.hpp's vpp_needs_pp).
  CHECK_THROWS_WITH(schedule_ops(schedule_kind::interleaved, 1, 0, 8, 2),
                    Equals("megadsl: invalid schedule: vpp_needs_pp: vpp = 2 virtual chunks need pp > 1 (got "
                           "pp = 1); set pp >= 2 or vpp = 1"));
  CHECK_THROWS_WITH(schedule_ops(schedule_kind::one_f_one_b, 4, 0, 0),
                    Equals("megadsl: invalid schedule: positive_sizes: microbatches = 0 must be positive"));
  // The kind must be the one the layout selects; the rank must exist.
  CHECK_THROWS_WITH(schedule_ops(schedule_kind::one_f_one_b, 4, 0, 8, 2),
                    Equals("megadsl: schedule_ops: pp = 4 and vpp = 2 run the interleaved schedule, not "
                           "one_f_one_b; use select_schedule(pp, vpp)"));
  CHECK_THROWS_WITH(schedule_ops(schedule_kind::one_f_one_b, 4, 4, 8),
                    Equals("megadsl: schedule_ops: pp_rank = 4 is outside [0, 4)"));
  CHECK_THROWS_AS(megadsl::require_valid_schedule(4, 6, 2), std::invalid_argument);
  CHECK_NOTHROW(megadsl::require_valid_schedule(4, 6, 1));  // 1F1B takes any microbatch count
}
