// Micro-batching and sequence balancing: verl's seqlen_balancing.py, with its token budget made a
// guarantee.
//
//   auto mb = megadsl::rearrange_micro_batches(seqlens, {.max_token_len = 4096, .divisible_by = 4});
//   mb.indices[i]                      // input rows of micro-batch i, in the order the pipeline runs them
//   megadsl::restore_order(outs, mb)   // per-row outputs back in input order (restore_dynamic_batch)
//
// verl balances *workload* (calculate_workload, ~FLOPs) with Karmarkar-Karp over a count derived
// from the token total, so a micro-batch may exceed the budget (8 sequences of 7 tokens, budget 8:
// 7 parts, one holding 14 tokens). Here a count is accepted only when every micro-batch fits; the
// count grows until one does (verl PRs #6735/#7553 do the same). Everything else, including the
// tie-breaking of Karmarkar-Karp, is verl's, so partitions equal verl's whenever verl's fit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <range/v3/range/conversion.hpp>
#include <range/v3/view/join.hpp>

namespace megadsl {

// verl's cost model of one sequence: 12 h^2 s + 2 h s^2 with h = 4096, over 2h (a 7B model).
constexpr std::int64_t calculate_workload(std::int64_t seqlen) { return 24576 * seqlen + seqlen * seqlen; }

using index_list = std::vector<std::int64_t>;  // positions in the input batch
using partition_list = std::vector<index_list>;

namespace detail {

struct kk_set {
  std::int64_t sum = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> items;  // (index, value), in insertion order
};
// verl's Set.__lt__: sum, then item count, then the (index, value) items lexicographically.
inline bool operator<(const kk_set& a, const kk_set& b) {
  if (a.sum != b.sum) return a.sum < b.sum;
  if (a.items.size() != b.items.size()) return a.items.size() < b.items.size();
  return a.items < b.items;
}

struct kk_state {
  std::vector<kk_set> sets;  // descending
  [[nodiscard]] std::int64_t spread() const { return sets.front().sum - sets.back().sum; }
  void sort_descending() {
    std::stable_sort(sets.begin(), sets.end(), [](const kk_set& a, const kk_set& b) { return b < a; });
  }
};

// verl's State.__lt__ on a min-heap: the largest spread pops first, then the largest top set.
// Indices are unique, so no two states tie and any heap pops them in the same order.
inline bool kk_pops_first(const kk_state& a, const kk_state& b) {
  if (a.spread() != b.spread()) return a.spread() > b.spread();
  return b.sets.front() < a.sets.front();
}

}  // namespace detail

// Karmarkar-Karp (largest differencing) into k sets, verl's karmarkar_karp exactly: items sorted
// by (value, index); with equal_size each run of k consecutive items starts one state, else each
// item does; the two states that pop first merge (set i takes the other's set k-1-i), until one is
// left. Sets come out in descending order of sum, indices in merge order (not sorted).
inline partition_list karmarkar_karp(const std::vector<std::int64_t>& values, std::int64_t k, bool equal_size) {
  const auto n = static_cast<std::int64_t>(values.size());
  if (k <= 0) throw std::invalid_argument("megadsl: karmarkar_karp: k = " + std::to_string(k) + " must be positive");
  if (equal_size && n % k != 0)
    throw std::invalid_argument("megadsl: karmarkar_karp: " + std::to_string(n) + " items do not split into k = " +
                                std::to_string(k) + " equal partitions (" + std::to_string(n) + " % " +
                                std::to_string(k) + " != 0)");
  if (n == 0) return partition_list(static_cast<std::size_t>(k));
  std::vector<std::pair<std::int64_t, std::int64_t>> sorted;  // (value, index)
  for (std::int64_t i = 0; i < n; ++i) sorted.emplace_back(values[static_cast<std::size_t>(i)], i);
  std::sort(sorted.begin(), sorted.end());

  const auto heap_less = [](const detail::kk_state& a, const detail::kk_state& b) { return detail::kk_pops_first(b, a); };
  std::vector<detail::kk_state> heap;
  const std::int64_t per_state = equal_size ? k : 1;
  for (std::int64_t offset = 0; offset < n; offset += per_state) {
    detail::kk_state s;
    s.sets.resize(static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < per_state; ++i) {
      const auto& [value, index] = sorted[static_cast<std::size_t>(offset + i)];
      s.sets[static_cast<std::size_t>(i)].sum += value;
      s.sets[static_cast<std::size_t>(i)].items.emplace_back(index, value);
    }
    s.sort_descending();
    heap.push_back(std::move(s));
    std::push_heap(heap.begin(), heap.end(), heap_less);
  }
  const auto pop = [&] {
    std::pop_heap(heap.begin(), heap.end(), heap_less);
    detail::kk_state s = std::move(heap.back());
    heap.pop_back();
    return s;
  };
  while (heap.size() > 1) {
    detail::kk_state a = pop();
    detail::kk_state b = pop();
    for (std::size_t i = 0; i < a.sets.size(); ++i) {
      detail::kk_set& from = b.sets[a.sets.size() - 1 - i];
      a.sets[i].sum += from.sum;
      a.sets[i].items.insert(a.sets[i].items.end(), from.items.begin(), from.items.end());
    }
    a.sort_descending();
    heap.push_back(std::move(a));
    std::push_heap(heap.begin(), heap.end(), heap_less);
  }
  partition_list parts;
  for (const detail::kk_set& set : heap.front().sets) {
    parts.emplace_back();
    for (const auto& item : set.items) parts.back().push_back(item.first);
  }
  return parts;
}

// verl's get_seqlen_balanced_partitions: k non-empty partitions covering every index exactly once,
// indices sorted inside each. Needs n >= k (and n % k == 0 with equal_size).
inline partition_list get_seqlen_balanced_partitions(const std::vector<std::int64_t>& values, std::int64_t k,
                                                     bool equal_size) {
  const auto n = static_cast<std::int64_t>(values.size());
  if (n < k)
    throw std::invalid_argument("megadsl: get_seqlen_balanced_partitions: " + std::to_string(n) +
                                " items cannot fill k = " + std::to_string(k) +
                                " non-empty partitions; use k <= " + std::to_string(n));
  partition_list parts = karmarkar_karp(values, k, equal_size);
  std::vector<int> seen(values.size(), 0);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty())
      throw std::logic_error("megadsl: get_seqlen_balanced_partitions: partition " + std::to_string(i) + " is empty");
    std::sort(parts[i].begin(), parts[i].end());
    for (std::int64_t idx : parts[i]) ++seen[static_cast<std::size_t>(idx)];
  }
  if (std::any_of(seen.begin(), seen.end(), [](int c) { return c != 1; }))
    throw std::logic_error("megadsl: get_seqlen_balanced_partitions: an index is not covered exactly once");
  return parts;
}

inline std::vector<std::int64_t> workloads_of(const std::vector<std::int64_t>& seqlens) {
  std::vector<std::int64_t> w(seqlens.size());
  std::transform(seqlens.begin(), seqlens.end(), w.begin(), calculate_workload);
  return w;
}

// ---- permutations -------------------------------------------------------------------------------

// The rows of a rearranged batch: micro-batch after micro-batch (verl's chain(*batch_idx_list)).
inline index_list concatenated(const partition_list& parts) {
  return parts | ranges::views::join | ranges::to<index_list>();
}

// verl's get_reverse_idx: inverse[order[i]] = i, so row i of the input sits at row inverse[i] of
// the rearranged batch, and gathering the rearranged rows by `inverse` restores the input order.
inline index_list inverse_permutation(const index_list& order) {
  index_list inverse(order.size(), -1);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::int64_t j = order[i];
    if (j < 0 || static_cast<std::size_t>(j) >= order.size() || inverse[static_cast<std::size_t>(j)] >= 0)
      throw std::invalid_argument("megadsl: inverse_permutation: not a permutation of 0.." +
                                  std::to_string(order.size() - 1) + " (bad or repeated entry " + std::to_string(j) + ")");
    inverse[static_cast<std::size_t>(j)] = static_cast<std::int64_t>(i);
  }
  return inverse;
}

// verl's bubble-friendly order: P[::2][::-1] + P[1::2] over partitions sorted heaviest first, so
// the lightest micro-batches run first and last (the pipeline's warmup and cooldown).
// (Loops, not views::concat/stride/reverse: those cost ~0.8 s of compile time per instantiation.)
template <class T>
std::vector<T> bubble_friendly_order(const std::vector<T>& heaviest_first) {
  std::vector<T> out;
  const std::size_t n = heaviest_first.size();
  for (std::size_t i = (n + 1) / 2; i-- > 0;) out.push_back(heaviest_first[2 * i]);  // P[::2][::-1]
  for (std::size_t i = 1; i < n; i += 2) out.push_back(heaviest_first[i]);           // P[1::2]
  return out;
}

// ---- micro-batches ------------------------------------------------------------------------------

struct micro_batch_options {
  std::int64_t max_token_len = 0;        // token budget per micro-batch, never exceeded (0: none)
  std::int64_t num_micro_batches = 0;    // use this count (e.g. the MAX over dp ranks); 0: derive it
  std::int64_t min_num_micro_batch = 1;  // at least this many (pipeline: at least pp)
  std::int64_t divisible_by = 1;         // the count is a multiple of this (the VPP group size)
  bool balance_order = true;             // verl's use_dynamic_bsz_balance ordering
};

struct micro_batches {
  partition_list indices;             // input rows of each micro-batch, sorted, in run order
  std::vector<std::int64_t> tokens;    // sum of sequence lengths per micro-batch
  std::vector<std::int64_t> workloads; // sum of calculate_workload per micro-batch

  [[nodiscard]] std::int64_t size() const { return static_cast<std::int64_t>(indices.size()); }
  // Row j of the rearranged batch is input row order()[j].
  [[nodiscard]] index_list order() const { return concatenated(indices); }
  // Input row i is rearranged row restore()[i]: out[i] = rearranged[restore()[i]] undoes it.
  [[nodiscard]] index_list restore() const { return inverse_permutation(order()); }
};

// Puts rows back in input order: `rearranged` holds one value per row in micro-batch order.
template <class T>
std::vector<T> restore_order(const std::vector<T>& rearranged, const micro_batches& mb) {
  std::vector<T> out;
  for (std::int64_t j : mb.restore()) out.push_back(rearranged.at(static_cast<std::size_t>(j)));
  return out;
}

namespace detail {

inline std::int64_t round_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b * b; }

inline std::int64_t max_tokens(const partition_list& parts, const std::vector<std::int64_t>& seqlens) {
  std::int64_t worst = 0;
  for (const index_list& p : parts) {
    std::int64_t t = 0;
    for (std::int64_t i : p) t += seqlens[static_cast<std::size_t>(i)];
    worst = std::max(worst, t);
  }
  return worst;
}

// Longest-processing-time with a capacity: heaviest sequence first, into the lightest micro-batch
// (workload, then item count, then position) that still has room. Every part gets an item while
// empty parts remain, so n <= B parts are non-empty; fails (empty result) when an item fits nowhere.
inline partition_list capped_lpt(const std::vector<std::int64_t>& seqlens, const std::vector<std::int64_t>& workloads,
                                 std::int64_t n, std::int64_t cap) {
  index_list items(seqlens.size());
  std::iota(items.begin(), items.end(), 0);
  std::stable_sort(items.begin(), items.end(), [&](std::int64_t a, std::int64_t b) {
    return workloads[static_cast<std::size_t>(a)] > workloads[static_cast<std::size_t>(b)];
  });
  partition_list parts(static_cast<std::size_t>(n));
  std::vector<std::int64_t> tok(parts.size(), 0), work(parts.size(), 0);
  for (std::int64_t i : items) {
    std::size_t best = parts.size();
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (tok[p] + seqlens[static_cast<std::size_t>(i)] > cap) continue;
      if (best == parts.size() || std::pair{work[p], parts[p].size()} < std::pair{work[best], parts[best].size()}) best = p;
    }
    if (best == parts.size()) return {};
    parts[best].push_back(i);
    tok[best] += seqlens[static_cast<std::size_t>(i)];
    work[best] += workloads[static_cast<std::size_t>(i)];
  }
  for (index_list& p : parts) std::sort(p.begin(), p.end());
  return parts;
}

// n parts within the budget: verl's Karmarkar-Karp when it fits, else the capped LPT; empty when
// neither fits.
inline partition_list fit_parts(const std::vector<std::int64_t>& seqlens, const std::vector<std::int64_t>& workloads,
                                std::int64_t n, std::int64_t cap) {
  partition_list kk = karmarkar_karp(workloads, n, false);
  const bool kk_ok = std::none_of(kk.begin(), kk.end(), [](const index_list& p) { return p.empty(); });
  if (kk_ok) {
    for (index_list& p : kk) std::sort(p.begin(), p.end());
    if (cap <= 0 || max_tokens(kk, seqlens) <= cap) return kk;
  }
  if (cap <= 0) return {};
  return capped_lpt(seqlens, workloads, n, cap);
}

inline std::string sizes_hint(const micro_batch_options& o) {
  return "min_num_micro_batch = " + std::to_string(o.min_num_micro_batch) +
         ", divisible_by = " + std::to_string(o.divisible_by);
}

inline void check_inputs(const std::vector<std::int64_t>& seqlens, const micro_batch_options& o) {
  const std::string where = "megadsl: rearrange_micro_batches: ";
  if (seqlens.empty()) throw std::invalid_argument(where + "the batch is empty");
  if (o.max_token_len < 0 || o.num_micro_batches < 0 || o.min_num_micro_batch < 1 || o.divisible_by < 1)
    throw std::invalid_argument(where + "max_token_len and num_micro_batches must be >= 0, min_num_micro_batch "
                                        "and divisible_by >= 1");
  if (o.max_token_len == 0 && o.num_micro_batches == 0)
    throw std::invalid_argument(where + "give a token budget (max_token_len) or a count (num_micro_batches)");
  for (std::size_t i = 0; i < seqlens.size(); ++i) {
    if (seqlens[i] < 0)
      throw std::invalid_argument(where + "sequence " + std::to_string(i) + " has a negative length");
    if (o.max_token_len > 0 && seqlens[i] > o.max_token_len)
      throw std::invalid_argument(where + "sequence " + std::to_string(i) + " has " + std::to_string(seqlens[i]) +
                                  " tokens, more than max_token_len = " + std::to_string(o.max_token_len) +
                                  "; raise max_token_len to at least " + std::to_string(seqlens[i]));
  }
}

}  // namespace detail

// How many micro-batches this batch needs on its own: verl's count, min(B, ceil(tokens / budget)),
// raised to min_num_micro_batch and to a multiple of divisible_by, then grown (in steps of
// divisible_by) until the partition fits the budget. With data parallelism take the MAX of this
// over the dp ranks and pass it as num_micro_batches (verl's same_micro_num_in_dp); a count given
// that way is only rounded up, never grown, so the ranks stay in step.
inline std::int64_t micro_batch_count(const std::vector<std::int64_t>& seqlens, const micro_batch_options& o) {
  detail::check_inputs(seqlens, o);
  const auto b = static_cast<std::int64_t>(seqlens.size());
  const std::int64_t total = std::accumulate(seqlens.begin(), seqlens.end(), std::int64_t{0});
  std::int64_t n = o.num_micro_batches > 0 ? o.num_micro_batches
                                           : std::min(b, (total + o.max_token_len - 1) / o.max_token_len);
  n = detail::round_up(std::max({n, o.min_num_micro_batch, std::int64_t{1}}), o.divisible_by);
  const auto too_many = [&](std::int64_t count, const std::string& why) {
    return std::invalid_argument("megadsl: rearrange_micro_batches: " + std::to_string(b) + " sequences cannot fill " +
                                 std::to_string(count) + " micro-batches" + why + " (" + detail::sizes_hint(o) +
                                 "); use a larger batch or a smaller count");
  };
  if (n > b) throw too_many(n, "");
  if (o.max_token_len == 0 || o.num_micro_batches > 0) return n;
  const auto workloads = workloads_of(seqlens);
  for (; n <= b; n += o.divisible_by)
    if (!detail::fit_parts(seqlens, workloads, n, o.max_token_len).empty()) return n;
  throw too_many(n, " within max_token_len = " + std::to_string(o.max_token_len));
}

// verl's rearrange_micro_batches (+ restore_dynamic_batch via micro_batches::restore): split a
// batch of sequence lengths into balanced micro-batches, every one within the token budget.
inline micro_batches rearrange_micro_batches(const std::vector<std::int64_t>& seqlens, const micro_batch_options& o) {
  const std::int64_t n = micro_batch_count(seqlens, o);
  const auto workloads = workloads_of(seqlens);
  partition_list parts = detail::fit_parts(seqlens, workloads, n, o.max_token_len);
  if (parts.empty() && o.max_token_len == 0)
    parts = get_seqlen_balanced_partitions(workloads, n, false);  // throws verl's error
  if (parts.empty()) {
    // A count forced from outside (the MAX over dp ranks) that this batch does not fit directly:
    // start from the largest smaller count that fits and split the heaviest micro-batches in two.
    std::int64_t m = n - 1;
    for (; m >= 1 && parts.empty(); --m) parts = detail::fit_parts(seqlens, workloads, m, o.max_token_len);
    if (parts.empty())
      throw std::invalid_argument("megadsl: rearrange_micro_batches: no split into " + std::to_string(n) +
                                  " micro-batches keeps max_token_len = " + std::to_string(o.max_token_len));
    while (static_cast<std::int64_t>(parts.size()) < n) {
      auto heaviest = parts.end();
      std::int64_t heaviest_work = -1;
      for (auto it = parts.begin(); it != parts.end(); ++it) {
        if (it->size() < 2) continue;
        std::int64_t w = 0;
        for (std::int64_t i : *it) w += workloads[static_cast<std::size_t>(i)];
        if (w > heaviest_work) heaviest_work = w, heaviest = it;
      }
      const index_list whole = *heaviest;
      std::vector<std::int64_t> sub;
      for (std::int64_t i : whole) sub.push_back(workloads[static_cast<std::size_t>(i)]);
      partition_list halves = get_seqlen_balanced_partitions(sub, 2, false);
      for (index_list& h : halves)
        for (std::int64_t& i : h) i = whole[static_cast<std::size_t>(i)];
      *heaviest = std::move(halves[0]);
      parts.push_back(std::move(halves[1]));
    }
  }
  const auto sum_of = [](const std::vector<std::int64_t>& per_row, const index_list& p) {
    std::int64_t s = 0;
    for (std::int64_t i : p) s += per_row[static_cast<std::size_t>(i)];
    return s;
  };
  if (o.balance_order) {
    // Heaviest first by (workload, first index), as verl sorts before P[::2][::-1] + P[1::2].
    std::sort(parts.begin(), parts.end(), [&](const index_list& a, const index_list& b) {
      return std::pair{sum_of(workloads, a), a.front()} > std::pair{sum_of(workloads, b), b.front()};
    });
    parts = bubble_friendly_order(parts);
  }
  micro_batches out;
  for (const index_list& p : parts) {
    out.tokens.push_back(sum_of(seqlens, p));
    out.workloads.push_back(sum_of(workloads, p));
  }
  out.indices = std::move(parts);
  return out;
}

// Micro-batches of a fixed size, in input order (verl without dynamic batch size, Megatron's
// data loader): [0, mbs), [mbs, 2 mbs), ...; the last one may be shorter.
inline partition_list split_by_size(std::int64_t batch, std::int64_t micro_batch_size) {
  if (micro_batch_size <= 0)
    throw std::invalid_argument("megadsl: split_by_size: micro_batch_size = " + std::to_string(micro_batch_size) +
                                " must be positive");
  partition_list parts;
  for (std::int64_t first = 0; first < batch; first += micro_batch_size) {
    index_list p(static_cast<std::size_t>(std::min(micro_batch_size, batch - first)));
    std::iota(p.begin(), p.end(), first);
    parts.push_back(std::move(p));
  }
  return parts;
}

// ---- data parallelism ---------------------------------------------------------------------------

// verl's _balance_batch: the global batch's sequences over dp ranks, the same number on each,
// workloads balanced by Karmarkar-Karp (equal_size). With order_within_rank each rank's rows are
// sorted lightest first and laid out as S[::2] + S[1::2][::-1] (light rows at both ends, for the
// pipeline's bubbles). Concatenating the ranks' lists gives the reordered global batch.
inline partition_list balance_data_parallel(const std::vector<std::int64_t>& seqlens, std::int64_t dp,
                                            bool order_within_rank = true) {
  const auto b = static_cast<std::int64_t>(seqlens.size());
  if (dp <= 0 || b % dp != 0 || b < dp)
    throw std::invalid_argument("megadsl: balance_data_parallel: " + std::to_string(b) +
                                " sequences do not split evenly over dp = " + std::to_string(dp) +
                                " ranks; use a batch that is a positive multiple of " + std::to_string(dp));
  const auto workloads = workloads_of(seqlens);
  partition_list ranks = get_seqlen_balanced_partitions(workloads, dp, true);
  if (!order_within_rank) return ranks;
  for (index_list& rows : ranks) {
    std::sort(rows.begin(), rows.end(), [&](std::int64_t x, std::int64_t y) {
      return std::pair{workloads[static_cast<std::size_t>(x)], x} < std::pair{workloads[static_cast<std::size_t>(y)], y};
    });
    index_list laid_out;
    for (std::size_t i = 0; i < rows.size(); i += 2) laid_out.push_back(rows[i]);          // S[::2]
    for (std::size_t i = rows.size() / 2; i-- > 0;) laid_out.push_back(rows[2 * i + 1]);  // S[1::2][::-1]
    rows = std::move(laid_out);
  }
  return ranks;
}

}  // namespace megadsl
