// Static tests of the rank grid: the worked examples of megatron-core-semantics.md §1 as oracles.
// Compiling is passing.
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "megadsl/rank_grid.hpp"

namespace {

using megadsl::group_kind;
using megadsl::layout;
using megadsl::rank_coords;
using megadsl::rank_grid;
using ranks = std::vector<std::int64_t>;
using groups = std::vector<std::vector<std::int64_t>>;

// all_groups(k) == {{...}, ...}. Spelled as a function because GCC 12 rejects a namespace-scope
// initializer_list of std::vector in a constant expression ("&<anonymous> != 0").
constexpr bool groups_are(const groups& got,
                          std::initializer_list<std::initializer_list<std::int64_t>> want) {
  if (got.size() != want.size()) return false;
  const auto* w = want.begin();
  for (const auto& g : got) {
    if (g.size() != w->size()) return false;
    const std::int64_t* x = w->begin();
    for (std::int64_t r : g)
      if (r != *x++) return false;
    ++w;
  }
  return true;
}

// ---- 16 ranks, TP2 PP4 (DP2): tp = r%2, dp = (r/2)%2, pp = r/4 ---------------------------------
constexpr rank_grid g16{.tp = 2, .dp = 2, .pp = 4};

static_assert(g16.world() == 16);
static_assert(rank_grid::from(layout{.tp = 2, .pp = 4}, 16) == g16);

static_assert(groups_are(g16.all_groups(group_kind::tp),
              {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
static_assert(groups_are(g16.all_groups(group_kind::dp),
              {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
static_assert(g16.all_groups(group_kind::dp_cp) == g16.all_groups(group_kind::dp));  // cp = 1
static_assert(groups_are(g16.all_groups(group_kind::pp),
              {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
static_assert(groups_are(g16.all_groups(group_kind::model_parallel),
              {{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
static_assert(groups_are(g16.all_groups(group_kind::tp_dp),
              {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
static_assert(groups_are(g16.all_groups(group_kind::embedding),
              {{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
static_assert(groups_are(g16.all_groups(group_kind::position_embedding), {{0}, {1}, {2}, {3}}));
static_assert(g16.group_size(group_kind::embedding) == 2 && g16.group_count(group_kind::embedding) == 4);
static_assert(g16.group_size(group_kind::position_embedding) == 1);
static_assert(g16.group_size(group_kind::model_parallel) == 8 && g16.group_count(group_kind::dp) == 8);

// Every rank's coordinates follow tp = r%2, dp = (r/2)%2, pp = r/4.
static_assert([] {
  for (std::int64_t r = 0; r < 16; ++r)
    if (g16.coords(r) != rank_coords{.tp = r % 2, .cp = 0, .dp = (r / 2) % 2, .pp = r / 4})
      return false;
  return true;
}());

// Rank 11 = (tp1, dp1, pp2).
static_assert(g16.coords(11) == rank_coords{.tp = 1, .cp = 0, .dp = 1, .pp = 2});
static_assert(g16.rank_of({.tp = 1, .dp = 1, .pp = 2}) == 11);
static_assert(g16.tp_group(11) == ranks{10, 11});
static_assert(g16.dp_group(11) == ranks{9, 11});
static_assert(g16.pp_group(11) == ranks{3, 7, 11, 15});
static_assert(g16.model_parallel_group(11) == ranks{2, 3, 6, 7, 10, 11, 14, 15});
static_assert(g16.pipeline_next(11) == 15 && g16.pipeline_prev(11) == 7);
static_assert(!g16.in_embedding_group(11) && !g16.in_position_embedding_group(11));
static_assert(!g16.is_pipeline_first(11) && !g16.is_pipeline_last(11));
static_assert(g16.embedding_group(11) == ranks{3, 15});  // its pp group's ends, not itself
static_assert(g16.rank_in_group(group_kind::tp, 11) == 1);
static_assert(g16.rank_in_group(group_kind::dp, 11) == 1);
static_assert(g16.rank_in_group(group_kind::pp, 11) == 2);
static_assert(g16.rank_in_group(group_kind::embedding, 11) == -1);

// The ends of the pipeline: both in the embedding group, only the first in the position one;
// next/prev wrap around (Megatron's ranks[(i +- 1) % PP]).
static_assert(g16.in_embedding_group(1) && g16.in_embedding_group(13));
static_assert(g16.in_position_embedding_group(1) && !g16.in_position_embedding_group(13));
static_assert(g16.rank_in_group(group_kind::embedding, 13) == 1);
static_assert(g16.is_pipeline_first(2) && g16.is_pipeline_last(14));
static_assert(g16.pipeline_next(14) == 2 && g16.pipeline_prev(2) == 14);

// ---- TP2 CP2 DP2 PP2: tp = r%2, cp = (r/2)%2, dp = (r/4)%2, pp = r/8 ----------------------------
constexpr rank_grid g2222{.tp = 2, .cp = 2, .dp = 2, .pp = 2};

static_assert(groups_are(g2222.all_groups(group_kind::cp),
              {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
static_assert(groups_are(g2222.all_groups(group_kind::dp),
              {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
static_assert(groups_are(g2222.all_groups(group_kind::dp_cp),
              {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
static_assert(groups_are(g2222.all_groups(group_kind::pp),
              {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
static_assert(groups_are(g2222.all_groups(group_kind::model_parallel),  // tp-pp excludes cp
              {{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
static_assert(groups_are(g2222.all_groups(group_kind::tp_cp),
              {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
static_assert(groups_are(g2222.all_groups(group_kind::tp_dp),
              {{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}}));
static_assert(groups_are(g2222.all_groups(group_kind::tp_dp_cp),
              {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));

// Rank 6 = (tp0, cp1, dp1, pp0): its dp-cp rank is cp + CP*dp = 3, members listed cp fastest.
static_assert(g2222.coords(6) == rank_coords{.tp = 0, .cp = 1, .dp = 1, .pp = 0});
static_assert(g2222.rank_in_group(group_kind::dp_cp, 6) == 3);
static_assert(g2222.dp_cp_group(6) == ranks{0, 2, 4, 6});
static_assert(g2222.rank_in_group(group_kind::model_parallel, 9) == 3);  // tp1 + TP * pp1

// ---- cp != dp, so a swapped cp/dp stride shows: tp = r%2, cp = (r/2)%3, dp = (r/6)%2 -----------
constexpr rank_grid g_cp3{.tp = 2, .cp = 3, .dp = 2};
static_assert([] {
  for (std::int64_t r = 0; r < g_cp3.world(); ++r)
    if (g_cp3.coords(r) != rank_coords{.tp = r % 2, .cp = (r / 2) % 3, .dp = (r / 6) % 2, .pp = 0} ||
        g_cp3.rank_of(g_cp3.coords(r)) != r)
      return false;
  return true;
}());
static_assert(g_cp3.cp_group(7) == ranks{7, 9, 11});
static_assert(g_cp3.dp_group(7) == ranks{1, 7});
static_assert(g_cp3.dp_cp_group(7) == ranks{1, 3, 5, 7, 9, 11});
static_assert(g_cp3.rank_in_group(group_kind::dp_cp, 7) == 3);  // cp 0 + CP 3 * dp 1
static_assert(g_cp3.rank_in_group(group_kind::tp_cp, 9) == 3);  // tp 1 + TP 2 * cp 1

// ---- pp == 1: the embedding group is [first] --------------------------------------------------
constexpr rank_grid g_tp4{.tp = 4};
static_assert(groups_are(g_tp4.all_groups(group_kind::embedding), {{0}, {1}, {2}, {3}}));
static_assert(g_tp4.in_embedding_group(3) && g_tp4.in_position_embedding_group(3));
static_assert(g_tp4.rank_in_group(group_kind::embedding, 3) == 0);
static_assert(g_tp4.group_size(group_kind::embedding) == 1);
static_assert(g_tp4.pipeline_next(3) == 3 && g_tp4.pipeline_prev(3) == 3);
static_assert(rank_grid::from(layout{.tp = 4}, 12) == rank_grid{.tp = 4, .dp = 3});

// ---- in-language negative probes: invalid inputs are not constant expressions ------------------
template <std::int64_t World>
constexpr bool world_accepted = requires {
  typename std::integral_constant<std::int64_t, rank_grid::from(layout{.tp = 4}, World).dp>;
};
static_assert(world_accepted<8> && !world_accepted<6> && !world_accepted<0>);  // world_fits_layout

template <std::int64_t Rank>
constexpr bool rank_accepted = requires {
  typename std::integral_constant<std::int64_t, g16.coords(Rank).pp>;
};
static_assert(rank_accepted<15> && !rank_accepted<16> && !rank_accepted<-1>);

}  // namespace

// ---- the expert grid: etp = r%ETP, ep = (r/ETP)%EP, edp = (r/(ETP EP))%EDP, pp = r/(ETP EP EDP) ----
using megadsl::expert_grid;
using megadsl::expert_group_kind;

// The reference's TP2 CP2 DP2 PP2 example with ETP2 EP2: EP folds over CP x DP, EDP = 16 / 8 = 2.
constexpr expert_grid e2222 = expert_grid::from(layout{.tp = 2, .pp = 2, .cp = 2, .ep = 2}, 16);
static_assert(e2222 == expert_grid{.etp = 2, .ep = 2, .edp = 2, .pp = 2});
static_assert(groups_are(e2222.all_groups(expert_group_kind::ep),
              {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
static_assert(groups_are(e2222.all_groups(expert_group_kind::edp),
              {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
static_assert(groups_are(e2222.all_groups(expert_group_kind::etp_ep),
              {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
static_assert(groups_are(e2222.all_groups(expert_group_kind::etp_ep_pp),
              {{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));
// Its pp groups are the decoder grid's, as Megatron asserts.
static_assert(e2222.pp_group(6) == g2222.pp_group(6));
static_assert(e2222.coords(6) == megadsl::expert_coords{.etp = 0, .ep = 1, .edp = 1, .pp = 0});
static_assert(e2222.rank_in_group(expert_group_kind::etp_ep, 6) == 2);  // etp0 + ETP * ep1

// etp defaults to tp; etp 1 under tp 4 puts four experts' ranks side by side: EP [0..3] at ep 4.
static_assert(expert_grid::from(layout{.tp = 4, .ep = 4}, 16) == expert_grid{.etp = 4, .ep = 4, .edp = 1, .pp = 1});
constexpr expert_grid e_etp1 = expert_grid::from(layout{.tp = 4, .ep = 4, .etp = 1}, 16);
static_assert(e_etp1 == expert_grid{.etp = 1, .ep = 4, .edp = 4, .pp = 1});
static_assert(e_etp1.ep_group(5) == ranks{4, 5, 6, 7} && e_etp1.edp_group(5) == ranks{1, 5, 9, 13});

