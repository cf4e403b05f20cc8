// Micro-batching and balancing (verl-semantics.md §5): Karmarkar-Karp on hand-checked cases, the
// coverage and budget guarantees, verl's over-budget counter-example, the permutation round trip,
// the bubble-friendly order and data-parallel balancing.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include <catch2/catch.hpp>

#include "megadsl/batching.hpp"

namespace {

using megadsl::index_list;
using megadsl::partition_list;

static_assert(megadsl::calculate_workload(0) == 0);
static_assert(megadsl::calculate_workload(1) == 24577);
static_assert(megadsl::calculate_workload(4096) == 24576LL * 4096 + 4096LL * 4096);

std::int64_t tokens_of(const index_list& p, const std::vector<std::int64_t>& seqlens) {
  std::int64_t t = 0;
  for (std::int64_t i : p) t += seqlens[static_cast<std::size_t>(i)];
  return t;
}

// Every index in [0, n) exactly once, no partition empty.
bool covers_once(const partition_list& parts, std::size_t n) {
  std::vector<int> seen(n, 0);
  for (const index_list& p : parts) {
    if (p.empty()) return false;
    for (std::int64_t i : p) {
      if (i < 0 || static_cast<std::size_t>(i) >= n) return false;
      ++seen[static_cast<std::size_t>(i)];
    }
  }
  return std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; });
}

}  // namespace

TEST_CASE("Karmarkar-Karp on hand-checked cases", "[batching]") {
  // values 8 7 6 5 4 (indices 0..4), k = 2. One state per item, spread = its value.
  //   pop 8, 7 -> [{8}, {7}] spread 1;   pop 6, 5 -> [{6}, {5}] spread 1
  //   pop 4 [{4}, {}], then of the two spread-1 states the one with the larger top set, {8}:
  //     {4} + {7} = 11, {} + {8} = 8  -> [{4,7}, {8}] spread 3
  //   pop it (spread 3) and [{6},{5}]: {4,7} + {5} = 16, {8} + {6} = 14 -> [{4,7,5}, {8,6}]
  // As indices in merge order: [4, 1, 3] and [0, 2].
  CHECK(megadsl::karmarkar_karp({8, 7, 6, 5, 4}, 2, false) == partition_list{{4, 1, 3}, {0, 2}});
  CHECK(megadsl::get_seqlen_balanced_partitions({8, 7, 6, 5, 4}, 2, false) == partition_list{{1, 3, 4}, {0, 2}});

  // values 1..6 (indices 0..5), k = 2, equal sizes. States of consecutive pairs in sorted order:
  //   A [{2},{1}], B [{4},{3}], C [{6},{5}], all spread 1; ties pop the larger top set: C, then B.
  //   C + B: {6} + {3} = 9, {5} + {4} = 9; equal sums and counts, items (5,6) > (4,5) -> [{6,3}, {5,4}]
  //   A (spread 1) pops before it (spread 0): {2} + {5,4} = 11, {1} + {6,3} = 10
  // -> [{2,5,4}, {1,6,3}], as indices [1, 4, 3] and [0, 5, 2].
  CHECK(megadsl::karmarkar_karp({1, 2, 3, 4, 5, 6}, 2, true) == partition_list{{1, 4, 3}, {0, 5, 2}});
  CHECK(megadsl::get_seqlen_balanced_partitions({1, 2, 3, 4, 5, 6}, 2, true) == partition_list{{1, 3, 4}, {0, 2, 5}});

  // k = 1: every spread is 0, so the larger top set pops first: {3} + {2}, then {3,2} + {1}.
  CHECK(megadsl::karmarkar_karp({3, 1, 2}, 1, false) == partition_list{{0, 2, 1}});
  // k = n gives singletons, heaviest first.
  CHECK(megadsl::karmarkar_karp({3, 1, 2}, 3, false) == partition_list{{0}, {2}, {1}});

  CHECK_THROWS_WITH(megadsl::get_seqlen_balanced_partitions({1, 2}, 3, false),
                    "megadsl: get_seqlen_balanced_partitions: 2 items cannot fill k = 3 non-empty partitions; "
                    "use k <= 2");
  CHECK_THROWS_WITH(megadsl::karmarkar_karp({1, 2, 3}, 2, true),
                    "megadsl: karmarkar_karp: 3 items do not split into k = 2 equal partitions (3 % 2 != 0)");
}

TEST_CASE("balanced partitions cover every index once", "[batching]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const auto n = std::uniform_int_distribution<int>(1, 60)(rng);
    const auto k = std::uniform_int_distribution<int>(1, n)(rng);
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = megadsl::calculate_workload(std::uniform_int_distribution<int>(1, 4096)(rng));
    const partition_list parts = megadsl::get_seqlen_balanced_partitions(v, k, false);
    REQUIRE(static_cast<int>(parts.size()) == k);
    CHECK(covers_once(parts, v.size()));
    for (const index_list& p : parts) CHECK(std::is_sorted(p.begin(), p.end()));
    if (n % k == 0) {
      const partition_list eq = megadsl::get_seqlen_balanced_partitions(v, k, true);
      CHECK(covers_once(eq, v.size()));
      for (const index_list& p : eq) CHECK(static_cast<int>(p.size()) == n / k);
    }
  }
}

TEST_CASE("no micro-batch exceeds the token budget: verl's counter-example", "[batching]") {
  // 8 sequences of 7 tokens, budget 8. verl's count is ceil(56 / 8) = 7, and Karmarkar-Karp over 7
  // parts must put two sequences (14 tokens) together:
  const std::vector<std::int64_t> seqlens(8, 7);
  std::vector<std::int64_t> workloads(8, megadsl::calculate_workload(7));
  const partition_list verl = megadsl::get_seqlen_balanced_partitions(workloads, 7, false);
  CHECK(std::any_of(verl.begin(), verl.end(), [&](const index_list& p) { return tokens_of(p, seqlens) == 14; }));
  // Each sequence alone fits, so the budget holds with 8 micro-batches of one sequence each.
  const auto mb = megadsl::rearrange_micro_batches(seqlens, {.max_token_len = 8});
  CHECK(mb.size() == 8);
  CHECK(mb.tokens == std::vector<std::int64_t>(8, 7));
  CHECK(covers_once(mb.indices, 8));
  CHECK(megadsl::micro_batch_count(seqlens, {.max_token_len = 8}) == 8);
}

TEST_CASE("a sequence longer than the budget is an error naming it", "[batching]") {
  CHECK_THROWS_WITH(megadsl::rearrange_micro_batches({100, 412, 5}, {.max_token_len = 300}),
                    "megadsl: rearrange_micro_batches: sequence 1 has 412 tokens, more than max_token_len = 300; "
                    "raise max_token_len to at least 412");
  CHECK_THROWS_WITH(megadsl::rearrange_micro_batches({1, 2, 3}, {.max_token_len = 100, .min_num_micro_batch = 4}),
                    "megadsl: rearrange_micro_batches: 3 sequences cannot fill 4 micro-batches (min_num_micro_batch = "
                    "4, divisible_by = 1); use a larger batch or a smaller count");
  CHECK_THROWS_WITH(megadsl::rearrange_micro_batches({1, 2, 3}, {}),
                    "megadsl: rearrange_micro_batches: give a token budget (max_token_len) or a count "
                    "(num_micro_batches)");
}

TEST_CASE("random batches: budget held, indices covered, inverse permutation restores the input", "[batching]") {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 100; ++trial) {
    // B = 20 sequences of 1..300 tokens, budget 300.
    std::vector<std::int64_t> seqlens(20);
    for (auto& s : seqlens) s = std::uniform_int_distribution<int>(1, 300)(rng);
    const std::int64_t total = std::accumulate(seqlens.begin(), seqlens.end(), std::int64_t{0});
    for (std::int64_t divisible_by : {1, 2, 4}) {
      const auto mb = megadsl::rearrange_micro_batches(seqlens, {.max_token_len = 300, .divisible_by = divisible_by});
      INFO("trial " << trial << ", divisible_by " << divisible_by);
      CHECK(mb.size() % divisible_by == 0);
      CHECK(mb.size() >= (total + 299) / 300);
      CHECK(covers_once(mb.indices, seqlens.size()));
      for (std::size_t i = 0; i < mb.indices.size(); ++i) {
        CHECK(mb.tokens[i] <= 300);
        CHECK(mb.tokens[i] == tokens_of(mb.indices[i], seqlens));
      }
      // Rows in micro-batch order, e.g. per-row outputs of the pipeline; restore puts them back.
      const index_list order = mb.order();
      std::vector<std::int64_t> rearranged;
      for (std::int64_t i : order) rearranged.push_back(seqlens[static_cast<std::size_t>(i)] * 1000 + i);
      std::vector<std::int64_t> expected;
      for (std::size_t i = 0; i < seqlens.size(); ++i)
        expected.push_back(seqlens[i] * 1000 + static_cast<std::int64_t>(i));
      CHECK(megadsl::restore_order(rearranged, mb) == expected);
      const index_list back = mb.restore();
      for (std::size_t i = 0; i < back.size(); ++i) CHECK(order[static_cast<std::size_t>(back[i])] == static_cast<std::int64_t>(i));
    }
    // A count forced from outside (the MAX over dp ranks) is honoured and still keeps the budget.
    const std::int64_t local = megadsl::micro_batch_count(seqlens, {.max_token_len = 300});
    for (std::int64_t forced = local; forced <= 20; forced += 3) {
      const auto mb = megadsl::rearrange_micro_batches(seqlens, {.max_token_len = 300, .num_micro_batches = forced});
      CHECK(mb.size() == forced);
      CHECK(covers_once(mb.indices, seqlens.size()));
      CHECK(*std::max_element(mb.tokens.begin(), mb.tokens.end()) <= 300);
    }
  }
}

TEST_CASE("count rounding: min_num_micro_batch and the VPP group size", "[batching]") {
  const std::vector<std::int64_t> seqlens{5, 6, 7, 8, 9, 10};
  // ceil(45 / 1000) = 1, raised to a multiple of 4.
  CHECK(megadsl::rearrange_micro_batches(seqlens, {.max_token_len = 1000, .divisible_by = 4}).size() == 4);
  CHECK(megadsl::rearrange_micro_batches(seqlens, {.max_token_len = 1000, .min_num_micro_batch = 3}).size() == 3);
  CHECK(megadsl::rearrange_micro_batches(seqlens, {.max_token_len = 1000, .min_num_micro_batch = 3,
                                                   .divisible_by = 2}).size() == 4);
  // A count mode without a budget balances workloads over exactly that many micro-batches.
  CHECK(megadsl::rearrange_micro_batches(seqlens, {.num_micro_batches = 2}).size() == 2);
  CHECK(megadsl::split_by_size(5, 2) == partition_list{{0, 1}, {2, 3}, {4}});
}

TEST_CASE("bubble-friendly order: P[::2][::-1] + P[1::2], heaviest first by (workload, first index)", "[batching]") {
  CHECK(megadsl::bubble_friendly_order(std::vector<int>{0, 1, 2, 3, 4}) == std::vector<int>{4, 2, 0, 1, 3});
  CHECK(megadsl::bubble_friendly_order(std::vector<int>{0, 1, 2, 3}) == std::vector<int>{2, 0, 1, 3});
  // Singletons of lengths 10 50 30 20 40: heaviest first [1, 4, 2, 3, 0]; evens [1, 2, 0] reversed
  // = [0, 2, 1], then odds [4, 3]: the lightest runs first, the second lightest last.
  const auto mb = megadsl::rearrange_micro_batches({10, 50, 30, 20, 40}, {.num_micro_batches = 5});
  CHECK(mb.indices == partition_list{{0}, {2}, {1}, {4}, {3}});
  CHECK(mb.tokens == std::vector<std::int64_t>{10, 30, 50, 40, 20});
  // Equal workloads: the larger first index counts as heavier.
  CHECK(megadsl::rearrange_micro_batches({10, 10}, {.num_micro_batches = 2}).indices == partition_list{{1}, {0}});
  // Without balancing, Karmarkar-Karp's order (descending sums) is kept.
  CHECK(megadsl::rearrange_micro_batches({10, 50, 30, 20, 40}, {.num_micro_batches = 5, .balance_order = false})
            .indices == partition_list{{1}, {4}, {2}, {3}, {0}});
}

TEST_CASE("data-parallel balancing splits the global batch evenly before micro-batching", "[batching]") {
  const std::vector<std::int64_t> seqlens{5, 1, 7, 3, 9, 2, 8, 4};
  const partition_list ranks = megadsl::balance_data_parallel(seqlens, 2);
  REQUIRE(ranks.size() == 2);
  CHECK(covers_once(ranks, seqlens.size()));
  for (const index_list& r : ranks) CHECK(r.size() == 4);
  // Karmarkar-Karp with equal sizes over the workloads w(s) = 24576 s + s^2. Pairs in sorted order:
  //   A [{2},{1}] spread w2-w1 = 24579, B [{4},{3}] 24583, C [{7},{5}] 49176, D [{9},{8}] 24593.
  //   C + D: {7}+{8} = w7+w8 = 368753, {5}+{9} = 344170 -> spread 24583, ties B; its top set is
  //     larger, so it pops first. CD + B: {7,8}+{3} = 442490, {5,9}+{4} = 442490: equal sums and
  //     counts, items (index 2, ...) > (index 0, ...) -> [{7,8,3}, {5,9,4}] spread 0.
  //   A + that: {2}+{5,9,4} = 491646, {1}+{7,8,3} = 467067.
  // Rank 0 holds lengths 2 5 9 4 (rows 5 0 4 7, 20 tokens), rank 1 lengths 1 7 8 3 (rows 1 2 6 3,
  // 19 tokens). Within a rank, rows run lightest first as S[::2] + S[1::2][::-1]:
  //   rank 0 sorted 2 4 5 9 = rows [5, 7, 0, 4] -> [5, 0] + [4, 7];  rank 1 sorted 1 3 7 8 = rows
  //   [1, 3, 2, 6] -> [1, 2] + [6, 3].
  CHECK(ranks == partition_list{{5, 0, 4, 7}, {1, 2, 6, 3}});
  CHECK(megadsl::balance_data_parallel(seqlens, 2, false) == partition_list{{0, 4, 5, 7}, {1, 2, 3, 6}});
  CHECK_THROWS_WITH(megadsl::balance_data_parallel(seqlens, 3),
                    "megadsl: balance_data_parallel: 8 sequences do not split evenly over dp = 3 ranks; use a batch "
                    "that is a positive multiple of 3");
  // Then each rank micro-batches its own rows.
  for (const index_list& rows : ranks) {
    std::vector<std::int64_t> local;
    for (std::int64_t i : rows) local.push_back(seqlens[static_cast<std::size_t>(i)]);
    const auto mb = megadsl::rearrange_micro_batches(local, {.max_token_len = 16});
    CHECK(covers_once(mb.indices, local.size()));
    for (std::int64_t t : mb.tokens) CHECK(t <= 16);
  }
}
