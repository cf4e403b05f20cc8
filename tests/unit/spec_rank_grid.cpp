// The rank grid against a brute-force reference over a sweep of sizes, plus its invariants and the
// world_fits_layout error.
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "megadsl/require_valid.hpp"
#include "megadsl/rank_grid.hpp"

namespace {

using megadsl::group_kind;
using megadsl::layout;
using megadsl::rank_grid;
using ranks = std::vector<std::int64_t>;
using groups = std::vector<ranks>;

// ---- the reference: written from megatron-core-semantics.md §1, not from the header -------------

struct sizes {
  std::int64_t tp, cp, dp, pp;
};

// Coordinates in the order tp, cp, dp, pp (Megatron's default order "tp-cp-ep-dp-pp", ep = 1).
std::array<std::int64_t, 4> ref_coords(const sizes& s, std::int64_t r) {
  return {r % s.tp, (r / s.tp) % s.cp, (r / (s.tp * s.cp)) % s.dp, r / (s.tp * s.cp * s.dp)};
}

// Which coordinates vary inside one group of each kind (Megatron's token strings).
struct ref_kind {
  group_kind kind;
  std::array<bool, 4> varies;  // tp, cp, dp, pp
};
const ref_kind ref_kinds[] = {
    {group_kind::tp, {true, false, false, false}},            // "tp"
    {group_kind::cp, {false, true, false, false}},            // "cp"
    {group_kind::dp, {false, false, true, false}},            // "dp" (without cp)
    {group_kind::dp_cp, {false, true, true, false}},          // "dp-cp"
    {group_kind::pp, {false, false, false, true}},            // "pp"
    {group_kind::model_parallel, {true, false, false, true}}, // "tp-pp": excludes cp
    {group_kind::tp_dp, {true, false, true, false}},          // "tp-dp"
    {group_kind::tp_dp_cp, {true, true, true, false}},        // "tp-dp-cp"
    {group_kind::tp_cp, {true, true, false, false}},          // "tp-cp"
};

// A group = all ranks equal on the coordinates that do not vary. Within a group the fixed part of
// the rank is the same, so ascending rank order is the order with the lowest-stride varying dim
// fastest; for the same reason groups ordered by their first member have the lowest-stride fixed
// dim varying fastest. Both are Megatron's orders.
groups ref_groups(const sizes& s, const ref_kind& k) {
  const std::int64_t world = s.tp * s.cp * s.dp * s.pp;
  std::map<std::array<std::int64_t, 4>, ranks> buckets;
  for (std::int64_t r = 0; r < world; ++r) {
    auto key = ref_coords(s, r);
    for (std::size_t d = 0; d < 4; ++d)
      if (k.varies[d]) key[d] = -1;
    buckets[key].push_back(r);
  }
  groups out;
  for (auto& [key, members] : buckets) {
    std::sort(members.begin(), members.end());
    out.push_back(members);
  }
  std::sort(out.begin(), out.end(), [](const ranks& a, const ranks& b) { return a.front() < b.front(); });
  return out;
}

// Megatron's rank in group: sum over varying dims d of c_d * prod of the varying sizes before d.
std::int64_t ref_rank_in_group(const sizes& s, const ref_kind& k, std::int64_t r) {
  const auto c = ref_coords(s, r);
  const std::array<std::int64_t, 4> size{s.tp, s.cp, s.dp, s.pp};
  std::int64_t rank = 0, scale = 1;
  for (std::size_t d = 0; d < 4; ++d)
    if (k.varies[d]) {
      rank += c[d] * scale;
      scale *= size[d];
    }
  return rank;
}

std::string grid_name(const sizes& s) {
  return "tp " + std::to_string(s.tp) + ", cp " + std::to_string(s.cp) + ", dp " +
         std::to_string(s.dp) + ", pp " + std::to_string(s.pp);
}

// Collects the first few mismatches of one grid, so a sweep of millions of facts stays fast and a
// failure still says where.
struct mismatches {
  std::vector<std::string> items;
  std::size_t total = 0;
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    if (++total <= 8) items.push_back(what);
  }
  [[nodiscard]] std::string report() const {
    std::string out;
    for (const auto& s : items) out += "  " + s + "\n";
    if (total > items.size()) out += "  ... " + std::to_string(total) + " in all\n";
    return out;
  }
};

// Every fact the grid states, checked against the reference; returns what disagreed.
mismatches check_grid(const sizes& s) {
  mismatches m;
  const rank_grid g{.tp = s.tp, .cp = s.cp, .dp = s.dp, .pp = s.pp};
  const std::int64_t world = s.tp * s.cp * s.dp * s.pp;
  m.expect(g.world() == world, "world");

  for (std::int64_t r = 0; r < world; ++r) {
    const auto c = ref_coords(s, r);
    const auto got = g.coords(r);
    m.expect(got.tp == c[0] && got.cp == c[1] && got.dp == c[2] && got.pp == c[3],
             "coords(" + std::to_string(r) + ")");
    m.expect(g.rank_of(got) == r, "rank_of(coords(" + std::to_string(r) + "))");
  }

  groups pp_groups;
  for (const ref_kind& k : ref_kinds) {
    const std::string name(megadsl::name_of(k.kind));
    const groups want = ref_groups(s, k);
    if (k.kind == group_kind::pp) pp_groups = want;
    const groups all = g.all_groups(k.kind);
    m.expect(all == want, name + ": all_groups");
    m.expect(g.group_count(k.kind) == static_cast<std::int64_t>(want.size()), name + ": group_count");
    m.expect(g.group_size(k.kind) == static_cast<std::int64_t>(want.front().size()),
             name + ": group_size");

    // Every rank in exactly one group, and the group/index/rank-in-group of each rank agree.
    std::vector<int> seen(static_cast<std::size_t>(world), 0);
    for (std::size_t gi = 0; gi < all.size(); ++gi)
      for (std::size_t i = 0; i < all[gi].size(); ++i) {
        const std::int64_t r = all[gi][i];
        if (r < 0 || r >= world) {
          m.expect(false, name + ": rank out of range");
          continue;
        }
        ++seen[static_cast<std::size_t>(r)];
        m.expect(g.group_index(k.kind, r) == static_cast<std::int64_t>(gi), name + ": group_index");
        m.expect(g.rank_in_group(k.kind, r) == static_cast<std::int64_t>(i),
                 name + ": rank_in_group(" + std::to_string(r) + ")");
        m.expect(g.rank_in_group(k.kind, r) == ref_rank_in_group(s, k, r),
                 name + ": rank_in_group formula (" + std::to_string(r) + ")");
      }
    m.expect(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }),
             name + ": every rank in exactly one group");
    for (std::int64_t r = 0; r < world; r += 1 + world / 64)  // group(k, r) on a sample of ranks
      m.expect(g.group(k.kind, r) == all[static_cast<std::size_t>(g.group_index(k.kind, r))],
               name + ": group(" + std::to_string(r) + ")");
  }

  // Embedding groups: the ends of each pp group ([first] when pp == 1); position: [first].
  groups want_emb, want_pos;
  for (const ranks& p : pp_groups) {
    want_emb.push_back(p.size() == 1 ? ranks{p.front()} : ranks{p.front(), p.back()});
    want_pos.push_back({p.front()});
  }
  m.expect(g.all_groups(group_kind::embedding) == want_emb, "embedding: all_groups");
  m.expect(g.all_groups(group_kind::position_embedding) == want_pos, "position_embedding: all_groups");
  for (group_kind k : {group_kind::embedding, group_kind::position_embedding}) {
    const std::string name(megadsl::name_of(k));
    const groups& want = k == group_kind::embedding ? want_emb : want_pos;
    m.expect(g.group_count(k) == static_cast<std::int64_t>(want.size()), name + ": group_count");
    m.expect(g.group_size(k) == static_cast<std::int64_t>(want.front().size()), name + ": group_size");
  }

  // Pipeline neighbours: ranks[(i +- 1) % PP] in the pp group; first/last/embedding membership.
  for (const ranks& p : pp_groups) {
    const auto n = static_cast<std::int64_t>(p.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t r = p[static_cast<std::size_t>(i)];
      const std::string at = " (" + std::to_string(r) + ")";
      m.expect(g.pipeline_next(r) == p[static_cast<std::size_t>((i + 1) % n)], "pipeline_next" + at);
      m.expect(g.pipeline_prev(r) == p[static_cast<std::size_t>((i - 1 + n) % n)], "pipeline_prev" + at);
      m.expect(g.pipeline_prev(g.pipeline_next(r)) == r && g.pipeline_next(g.pipeline_prev(r)) == r,
               "prev and next are inverse" + at);
      m.expect(g.is_pipeline_first(r) == (i == 0), "is_pipeline_first" + at);
      m.expect(g.is_pipeline_last(r) == (i == n - 1), "is_pipeline_last" + at);
      m.expect(g.in_embedding_group(r) == (i == 0 || i == n - 1), "in_embedding_group" + at);
      m.expect(g.in_position_embedding_group(r) == (i == 0), "in_position_embedding_group" + at);
      m.expect(g.embedding_group(r) == (n == 1 ? ranks{p.front()} : ranks{p.front(), p.back()}),
               "embedding_group" + at);
      m.expect(g.position_embedding_group(r) == ranks{p.front()}, "position_embedding_group" + at);
      const std::int64_t emb = i == 0 ? 0 : i == n - 1 ? 1 : -1;
      m.expect(g.rank_in_group(group_kind::embedding, r) == emb, "embedding rank_in_group" + at);
    }
  }

  // The named accessors are the generic ones.
  for (std::int64_t r = 0; r < world; r += 1 + world / 16) {
    m.expect(g.tp_group(r) == g.group(group_kind::tp, r) && g.cp_group(r) == g.group(group_kind::cp, r) &&
                 g.dp_group(r) == g.group(group_kind::dp, r) &&
                 g.dp_cp_group(r) == g.group(group_kind::dp_cp, r) &&
                 g.pp_group(r) == g.group(group_kind::pp, r) &&
                 g.model_parallel_group(r) == g.group(group_kind::model_parallel, r) &&
                 g.tp_dp_group(r) == g.group(group_kind::tp_dp, r) &&
                 g.tp_dp_cp_group(r) == g.group(group_kind::tp_dp_cp, r) &&
                 g.tp_cp_group(r) == g.group(group_kind::tp_cp, r),
             "named accessors (" + std::to_string(r) + ")");
  }
  return m;
}

}  // namespace

TEST_CASE("rank grid matches a brute-force reference over a sweep of sizes", "[rank_grid]") {
  const std::int64_t degrees[] = {1, 2, 3, 4, 8};
  int grids = 0;
  for (std::int64_t tp : degrees)
    for (std::int64_t cp : degrees)
      for (std::int64_t dp : degrees)
        for (std::int64_t pp : degrees) {
          const sizes s{tp, cp, dp, pp};
          const mismatches m = check_grid(s);
          ++grids;
          INFO(grid_name(s) << ":\n" << m.report());
          REQUIRE(m.total == 0);
        }
  CHECK(grids == 625);  // up to 8 x 8 x 8 x 8 = 4096 ranks
}

TEST_CASE("rank grid: the 16-rank example of the reference", "[rank_grid]") {
  const rank_grid g = rank_grid::from(layout{.tp = 2, .pp = 4}, 16);
  CHECK(g == rank_grid{.tp = 2, .cp = 1, .dp = 2, .pp = 4});
  CHECK(g.dp_group(11) == ranks{9, 11});
  CHECK(g.pp_group(11) == ranks{3, 7, 11, 15});
  CHECK(g.all_groups(group_kind::embedding) == groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}});
}

TEST_CASE("rank grid from a layout: dp is what the world leaves", "[rank_grid]") {
  CHECK(rank_grid::from(layout{.tp = 8, .pp = 4}, 1024) == rank_grid{.tp = 8, .dp = 32, .pp = 4});
  CHECK(rank_grid::from(layout{.tp = 2, .pp = 2, .cp = 2}, 16) ==
        rank_grid{.tp = 2, .cp = 2, .dp = 2, .pp = 2});
  CHECK(rank_grid::from(layout{}, 1) == rank_grid{});
  // A dynamic degree must be resolved first.
  CHECK_THROWS_AS(rank_grid::from(megadsl::dynamic_layout, 8), megadsl::unresolved_value);
}

TEST_CASE("rank grid from a layout: world_fits_layout", "[rank_grid]") {
  using Catch::Matchers::Contains;
  const layout l{.tp = 4};
  const auto call = [&] { (void)rank_grid::from(l, 6); };
  REQUIRE_THROWS_AS(call(), std::invalid_argument);
  REQUIRE_THROWS_WITH(call(), Contains("world_fits_layout") && Contains("world size 6") &&
                                  Contains("tp * pp * cp = 4") && Contains("multiples of 4") &&
                                  Contains("tp * pp * cp in: 1, 2, 3, 6"));

  // The same words as the rule checker (DESIGN decision 1: one wording, static or dynamic).
  std::string from_rules;
  try {
    megadsl::require_valid(megadsl::shape{}, l, megadsl::run_facts{.world = 6});
  } catch (const std::invalid_argument& e) {
    from_rules = e.what();
  }
  REQUIRE_FALSE(from_rules.empty());
  REQUIRE_THROWS_WITH(call(), from_rules);

  REQUIRE_THROWS_WITH(rank_grid::from(layout{.tp = 2, .pp = 3}, 8),
                      Contains("world_fits_layout") && Contains("tp * pp * cp = 6"));
  REQUIRE_THROWS_WITH(rank_grid::from(l, 0), Contains("positive_sizes") && Contains("world = 0"));
}

TEST_CASE("rank grid rejects ranks and coordinates outside the grid", "[rank_grid]") {
  const rank_grid g{.tp = 2, .dp = 2, .pp = 4};
  CHECK_THROWS_AS(g.coords(16), std::out_of_range);
  CHECK_THROWS_AS(g.tp_group(-1), std::out_of_range);
  CHECK_THROWS_AS(g.rank_of({.tp = 2}), std::out_of_range);
  CHECK_THROWS_AS(rank_grid{.tp = 0}.coords(0), std::invalid_argument);
}

TEST_CASE("rank grid printing", "[rank_grid]") {
  using Catch::Matchers::Contains;
  const rank_grid g{.tp = 2, .dp = 2, .pp = 4};
  CHECK(megadsl::to_string(g) == "tp 2 x cp 1 x dp 2 x pp 4 = 16 ranks (order tp-cp-ep-dp-pp, tp fastest)");
  const std::string d = megadsl::describe_rank(g, 11);
  CHECK_THAT(d, Contains("rank 11 of tp 2 x cp 1 x dp 2 x pp 4"));
  CHECK_THAT(d, Contains("tp 1, cp 0, dp 1, pp 2"));
  CHECK_THAT(d, Contains("rank 2 of 4     [3, 7, 11, 15]"));
  CHECK_THAT(d, Contains("model_parallel (tp-pp)  rank 5 of 8     [2, 3, 6, 7, 10, 11, 14, 15]"));
  CHECK_THAT(d, Contains("not a member    [3, 15]"));
  CHECK_THAT(d, Contains("prev 7, next 15, middle stage"));
  CHECK(megadsl::format_ranks({}) == "[]");
  CHECK(megadsl::format_ranks({0, 1, 2, 3, 4, 5}, 4) == "[0, 1, 2, ..., 5] (6 ranks)");
}

// ---- the expert grid (megatron-core-semantics.md §1: the expert generator, order tp-ep-dp-pp) ----

TEST_CASE("expert grid matches a brute-force reference over a sweep of sizes", "[rank_grid][experts]") {
  using megadsl::expert_grid;
  using megadsl::expert_group_kind;
  struct kind {
    expert_group_kind k;
    std::array<bool, 4> varies;  // etp, ep, edp, pp: Megatron's tokens on the expert generator
  };
  const kind kinds[] = {{expert_group_kind::ep, {false, true, false, false}},       // "ep"
                        {expert_group_kind::etp, {true, false, false, false}},      // "tp"
                        {expert_group_kind::etp_ep, {true, true, false, false}},    // "tp-ep"
                        {expert_group_kind::etp_ep_pp, {true, true, false, true}},  // "tp-ep-pp"
                        {expert_group_kind::edp, {false, false, true, false}}};     // "dp"
  const std::int64_t degrees[] = {1, 2, 3, 4};
  int grids = 0;
  for (std::int64_t etp : degrees)
    for (std::int64_t ep : degrees)
      for (std::int64_t edp : degrees)
        for (std::int64_t pp : degrees) {
          const expert_grid g{.etp = etp, .ep = ep, .edp = edp, .pp = pp};
          const std::int64_t world = etp * ep * edp * pp;
          INFO("etp " << etp << " ep " << ep << " edp " << edp << " pp " << pp);
          auto coords = [&](std::int64_t r) {
            return std::array<std::int64_t, 4>{r % etp, (r / etp) % ep, (r / (etp * ep)) % edp, r / (etp * ep * edp)};
          };
          const std::array<std::int64_t, 4> size{etp, ep, edp, pp};
          for (std::int64_t r = 0; r < world; ++r) {
            const auto c = coords(r);
            REQUIRE(g.coords(r) == megadsl::expert_coords{c[0], c[1], c[2], c[3]});
          }
          for (const kind& k : kinds) {
            std::map<std::array<std::int64_t, 4>, ranks> buckets;
            for (std::int64_t r = 0; r < world; ++r) {
              auto key = coords(r);
              for (std::size_t d = 0; d < 4; ++d)
                if (k.varies[d]) key[d] = -1;
              buckets[key].push_back(r);
            }
            groups want;
            for (auto& [key, members] : buckets) want.push_back(members);
            std::sort(want.begin(), want.end(), [](const ranks& a, const ranks& b) { return a.front() < b.front(); });
            REQUIRE(g.all_groups(k.k) == want);
            for (std::int64_t r = 0; r < world; ++r) {
              const auto c = coords(r);
              std::int64_t in_group = 0, scale = 1;
              for (std::size_t d = 0; d < 4; ++d)
                if (k.varies[d]) {
                  in_group += c[d] * scale;
                  scale *= size[d];
                }
              REQUIRE(g.rank_in_group(k.k, r) == in_group);
              REQUIRE(g.group(k.k, r)[static_cast<std::size_t>(in_group)] == r);
              REQUIRE(static_cast<std::int64_t>(g.group(k.k, r).size()) == g.group_size(k.k));
            }
          }
          // The pp groups are the decoder grid's over the same ranks (Megatron asserts it).
          const rank_grid decoder{.tp = etp, .dp = ep * edp, .pp = pp};
          for (std::int64_t r = 0; r < world; ++r) REQUIRE(g.pp_group(r) == decoder.pp_group(r));
          ++grids;
        }
  CHECK(grids == 256);
}

TEST_CASE("expert grid from a layout: etp defaults to tp, and the world must hold whole grids", "[rank_grid][experts]") {
  using megadsl::expert_grid;
  CHECK(expert_grid::from(layout{.tp = 2, .pp = 2, .ep = 2}, 16) == expert_grid{.etp = 2, .ep = 2, .edp = 2, .pp = 2});
  CHECK(expert_grid::from(layout{.tp = 4, .ep = 2, .etp = 1}, 8) == expert_grid{.etp = 1, .ep = 2, .edp = 4, .pp = 1});
  CHECK_THROWS_WITH(expert_grid::from(layout{.tp = 2, .pp = 2, .ep = 2}, 12),
                    "megadsl: invalid layout: expert_grid_fits_world: world size 12 is not divisible by etp * ep * pp = "
                    "2 * 2 * 2 = 8; valid world sizes are multiples of 8, or with this world size use etp * ep * pp in: "
                    "1, 2, 3, 4, 6, 12");
  CHECK_THROWS_WITH(expert_grid::from(layout{.ep = 0}, 8), Catch::Contains("positive_sizes: ep = 0 must be positive"));
  CHECK(megadsl::to_string(expert_grid{.etp = 2, .ep = 2, .edp = 2, .pp = 2}) ==
        "etp 2 x ep 2 x edp 2 x pp 2 = 16 ranks (order tp-ep-dp-pp, etp fastest)");
}
