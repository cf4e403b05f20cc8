// The rank grid: which tensor/context/data/pipeline coordinate each global rank has, and which
// ranks share a process group. Torch-free and constexpr, so the same code answers `megadsl plan`,
// the static tests and the process-group builder in parallel/.
//
//   constexpr megadsl::rank_grid g{.tp = 2, .dp = 2, .pp = 4};   // 16 ranks
//   g.coords(11)         // {tp 1, cp 0, dp 1, pp 2}
//   g.tp_group(11)       // [10, 11]
//   g.pp_group(11)       // [3, 7, 11, 15], next 15, prev 7
//
// Megatron's default order "tp-cp-ep-dp-pp" (leftmost token has the smallest stride, DESIGN
// decision 3): tp = r % TP, cp = (r/TP) % CP, dp = (r/(TP*CP)) % DP, pp = r/(TP*CP*DP). EP has
// size 1 in the decoder grid (Megatron forbids ep > 1 together with cp > 1 in one generator), so it
// is left out of the dimensions. Experts live on a second grid over the same ranks, `expert_grid`
// below: etp x ep x edp x pp in the order tp-ep-dp-pp.
//
// Groups follow Megatron's generate_masked_orthogonal_rank_groups: the group of kind S holds the
// ranks equal on every coordinate outside S; members are listed with the lowest-stride masked dim
// varying fastest, and all groups of a kind with the lowest-stride unmasked dim varying fastest.
// Which dims each kind masks is written once, in `group_kind_table`.
//
// The functions return std::vector: usable in constant evaluation (transient allocation), so a
// static_assert compares within one expression, e.g.
//   static_assert(rank_grid{.tp = 2, .dp = 2, .pp = 4}.tp_group(11) == rank_list{10, 11});
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "megadsl/layout.hpp"
#include "megadsl/rules.hpp"

namespace megadsl {

// The decoder grid's dimensions, lowest stride first (Megatron's order without the size-1 ep).
enum class grid_dim : std::uint8_t { tp, cp, dp, pp };
inline constexpr std::array<grid_dim, 4> grid_dims{grid_dim::tp, grid_dim::cp, grid_dim::dp,
                                                   grid_dim::pp};

constexpr std::string_view name_of(grid_dim d) {
  switch (d) {
    case grid_dim::tp: return "tp";
    case grid_dim::cp: return "cp";
    case grid_dim::dp: return "dp";
    case grid_dim::pp: return "pp";
  }
  return "?";
}

// A set of grid dims, one bit per dim (bit i = grid_dims[i]).
using dim_mask = std::uint8_t;

template <class... D>
constexpr dim_mask mask_of(D... d) {
  return static_cast<dim_mask>((0u | ... | (1u << static_cast<unsigned>(d))));
}
constexpr bool in_mask(dim_mask m, grid_dim d) { return ((m >> static_cast<unsigned>(d)) & 1u) != 0; }

// The process groups of parallel_state.py (Megatron builds dp-cp first, for SHARP; the order here
// is the one `describe_rank` prints).
enum class group_kind : std::uint8_t {
  tp,
  cp,
  dp,                  // data parallel without cp
  dp_cp,               // the gradient domain
  pp,
  model_parallel,      // tp-pp: excludes cp
  tp_dp,
  tp_dp_cp,
  tp_cp,
  embedding,           // per pp group: [first, last], [first] when pp == 1
  position_embedding,  // per pp group: [first]
};

struct group_kind_info {
  group_kind kind;
  std::string_view name;    // as the API and the CLI spell it
  std::string_view tokens;  // Megatron's token string for the masked dims
  dim_mask masked;          // dims that vary inside one group
  bool pipeline_ends;       // embedding kinds: only the ends of each pp group (masked = pp)
};

// The one source of truth for which dims each kind masks; row i describes group_kind(i).
inline constexpr std::array<group_kind_info, 11> group_kind_table = [] {
  using enum grid_dim;
  using k = group_kind;
  return std::array<group_kind_info, 11>{{
      {k::tp, "tp", "tp", mask_of(tp), false},
      {k::cp, "cp", "cp", mask_of(cp), false},
      {k::dp, "dp", "dp", mask_of(dp), false},
      {k::dp_cp, "dp_cp", "dp-cp", mask_of(dp, cp), false},
      {k::pp, "pp", "pp", mask_of(pp), false},
      {k::model_parallel, "model_parallel", "tp-pp", mask_of(tp, pp), false},
      {k::tp_dp, "tp_dp", "tp-dp", mask_of(tp, dp), false},
      {k::tp_dp_cp, "tp_dp_cp", "tp-dp-cp", mask_of(tp, dp, cp), false},
      {k::tp_cp, "tp_cp", "tp-cp", mask_of(tp, cp), false},
      {k::embedding, "embedding", "pp (first, last)", mask_of(pp), true},
      {k::position_embedding, "position_embedding", "pp (first)", mask_of(pp), true},
  }};
}();

constexpr const group_kind_info& info_of(group_kind k) {
  return group_kind_table[static_cast<std::size_t>(k)];
}
constexpr std::string_view name_of(group_kind k) { return info_of(k).name; }

static_assert([] {
  for (std::size_t i = 0; i < group_kind_table.size(); ++i)
    if (static_cast<std::size_t>(group_kind_table[i].kind) != i) return false;
  return true;
}(), "group_kind_table rows must follow the order of enum group_kind");

// Global ranks, in a group's member order.
using rank_list = std::vector<std::int64_t>;

struct rank_coords {
  std::int64_t tp = 0, cp = 0, dp = 0, pp = 0;

  [[nodiscard]] constexpr std::int64_t operator[](grid_dim d) const {
    switch (d) {
      case grid_dim::tp: return tp;
      case grid_dim::cp: return cp;
      case grid_dim::dp: return dp;
      case grid_dim::pp: return pp;
    }
    return 0;
  }
  constexpr bool operator==(const rank_coords&) const = default;
};

struct rank_grid {
  std::int64_t tp = 1, cp = 1, dp = 1, pp = 1;  // world = tp * cp * dp * pp

  // The grid a layout gets on `world` ranks: dp = world / (tp * pp * cp). Throws
  // std::invalid_argument with rule world_fits_layout's message (the wording of rules.hpp) when
  // world is not a multiple of tp * pp * cp. EP does not enter the product (Megatron).
  static constexpr rank_grid from(const layout& l, std::int64_t world);

  [[nodiscard]] constexpr std::int64_t world() const { return tp * cp * dp * pp; }
  [[nodiscard]] constexpr std::int64_t size(grid_dim d) const {
    switch (d) {
      case grid_dim::tp: return tp;
      case grid_dim::cp: return cp;
      case grid_dim::dp: return dp;
      case grid_dim::pp: return pp;
    }
    return 1;
  }
  // Rank distance between neighbours along d: the product of the sizes of the dims before it.
  [[nodiscard]] constexpr std::int64_t stride(grid_dim d) const {
    std::int64_t s = 1;
    for (grid_dim e : grid_dims) {
      if (e == d) break;
      s *= size(e);
    }
    return s;
  }

  [[nodiscard]] constexpr rank_coords coords(std::int64_t rank) const {
    check_rank(rank);
    return {rank % tp, (rank / tp) % cp, (rank / (tp * cp)) % dp, rank / (tp * cp * dp)};
  }
  [[nodiscard]] constexpr std::int64_t rank_of(const rank_coords& c) const {
    std::int64_t r = 0;
    for (grid_dim d : grid_dims) {
      if (c[d] < 0 || c[d] >= size(d))
        throw std::out_of_range("megadsl: rank_of: coordinate " + std::string(name_of(d)) +
                                " = " + std::to_string(c[d]) + " is outside [0, " +
                                std::to_string(size(d)) + ")");
      r += c[d] * stride(d);
    }
    return r;
  }

  // ---- groups of any kind -----------------------------------------------------------------------

  // Members of one group (for the embedding kinds: of the pp group whose ends they are).
  [[nodiscard]] constexpr std::int64_t group_size(group_kind k) const {
    if (info_of(k).pipeline_ends) return k == group_kind::embedding && pp > 1 ? 2 : 1;
    return masked_product(info_of(k).masked, true);
  }
  // How many groups of kind k exist (the embedding kinds: one per pp group).
  [[nodiscard]] constexpr std::int64_t group_count(group_kind k) const {
    return masked_product(info_of(k).masked, false);
  }
  // Which of all_groups(k) belongs to `rank` (the embedding kinds: that of its pp group).
  [[nodiscard]] constexpr std::int64_t group_index(group_kind k, std::int64_t rank) const {
    return positions(info_of(k).masked, coords(rank)).group;
  }
  // Megatron's rank in the group: sum over masked dims d of c_d * prod_{masked d' < d} size_d'
  // (e.g. the dp-cp rank is cp + CP * dp). The embedding kinds: the index in the group, or -1
  // when `rank` is not a member.
  [[nodiscard]] constexpr std::int64_t rank_in_group(group_kind k, std::int64_t rank) const {
    const std::int64_t i = positions(info_of(k).masked, coords(rank)).member;
    if (!info_of(k).pipeline_ends) return i;
    if (i == 0) return 0;
    if (k == group_kind::embedding && i == pp - 1) return 1;
    return -1;
  }
  // The group of kind k that holds `rank`; for the embedding kinds, the one of its pp group,
  // whether or not `rank` is a member (see in_embedding_group).
  [[nodiscard]] constexpr rank_list group(group_kind k, std::int64_t rank) const {
    return group_at(k, group_index(k, rank));
  }
  // Every group of kind k, the lowest-stride unmasked dim varying fastest from one to the next.
  [[nodiscard]] constexpr std::vector<rank_list> all_groups(group_kind k) const {
    std::vector<rank_list> out;
    const std::int64_t n = group_count(k);
    out.reserve(static_cast<std::size_t>(n));
    for (std::int64_t g = 0; g < n; ++g) out.push_back(group_at(k, g));
    return out;
  }

  // ---- groups by the dims that vary inside them (the expert grid reads the same arithmetic) --------

  // The group of `rank` whose members differ only on the dims of `masked`, lowest-stride masked dim
  // fastest; every such group, lowest-stride unmasked dim fastest; `rank`'s index in its group.
  [[nodiscard]] constexpr rank_list masked_group(dim_mask masked, std::int64_t rank) const {
    return members(masked, positions(masked, coords(rank)).group);
  }
  [[nodiscard]] constexpr std::vector<rank_list> masked_groups(dim_mask masked) const {
    std::vector<rank_list> out;
    const std::int64_t n = masked_product(masked, false);
    out.reserve(static_cast<std::size_t>(n));
    for (std::int64_t g = 0; g < n; ++g) out.push_back(members(masked, g));
    return out;
  }
  [[nodiscard]] constexpr std::int64_t masked_rank(dim_mask masked, std::int64_t rank) const {
    return positions(masked, coords(rank)).member;
  }
  [[nodiscard]] constexpr std::int64_t masked_size(dim_mask masked) const { return masked_product(masked, true); }

  // ---- named groups -----------------------------------------------------------------------------

  [[nodiscard]] constexpr rank_list tp_group(std::int64_t r) const {
    return group(group_kind::tp, r);
  }
  [[nodiscard]] constexpr rank_list cp_group(std::int64_t r) const {
    return group(group_kind::cp, r);
  }
  [[nodiscard]] constexpr rank_list dp_group(std::int64_t r) const {
    return group(group_kind::dp, r);
  }
  [[nodiscard]] constexpr rank_list dp_cp_group(std::int64_t r) const {
    return group(group_kind::dp_cp, r);
  }
  [[nodiscard]] constexpr rank_list pp_group(std::int64_t r) const {
    return group(group_kind::pp, r);
  }
  [[nodiscard]] constexpr rank_list model_parallel_group(std::int64_t r) const {
    return group(group_kind::model_parallel, r);
  }
  [[nodiscard]] constexpr rank_list tp_dp_group(std::int64_t r) const {
    return group(group_kind::tp_dp, r);
  }
  [[nodiscard]] constexpr rank_list tp_dp_cp_group(std::int64_t r) const {
    return group(group_kind::tp_dp_cp, r);
  }
  [[nodiscard]] constexpr rank_list tp_cp_group(std::int64_t r) const {
    return group(group_kind::tp_cp, r);
  }
  [[nodiscard]] constexpr rank_list embedding_group(std::int64_t r) const {
    return group(group_kind::embedding, r);
  }
  [[nodiscard]] constexpr rank_list position_embedding_group(std::int64_t r) const {
    return group(group_kind::position_embedding, r);
  }

  // ---- pipeline ---------------------------------------------------------------------------------

  // Megatron's ranks[(i + 1) % PP] and ranks[(i - 1) % PP] over the pp group: they wrap around.
  [[nodiscard]] constexpr std::int64_t pipeline_next(std::int64_t rank) const {
    const rank_coords c = coords(rank);
    return rank + ((c.pp + 1) % pp - c.pp) * stride(grid_dim::pp);
  }
  [[nodiscard]] constexpr std::int64_t pipeline_prev(std::int64_t rank) const {
    const rank_coords c = coords(rank);
    return rank + ((c.pp + pp - 1) % pp - c.pp) * stride(grid_dim::pp);
  }
  [[nodiscard]] constexpr bool is_pipeline_first(std::int64_t rank) const {
    return coords(rank).pp == 0;
  }
  [[nodiscard]] constexpr bool is_pipeline_last(std::int64_t rank) const {
    return coords(rank).pp == pp - 1;
  }
  [[nodiscard]] constexpr bool in_embedding_group(std::int64_t rank) const {
    return rank_in_group(group_kind::embedding, rank) >= 0;
  }
  [[nodiscard]] constexpr bool in_position_embedding_group(std::int64_t rank) const {
    return rank_in_group(group_kind::position_embedding, rank) >= 0;
  }

  constexpr bool operator==(const rank_grid&) const = default;

 private:
  struct place {
    std::int64_t group = 0;   // index among all groups of the kind
    std::int64_t member = 0;  // index inside the group (the masked group's rank)
  };

  constexpr void check_rank(std::int64_t rank) const {
    if (tp < 1 || cp < 1 || dp < 1 || pp < 1)
      throw std::invalid_argument("megadsl: rank_grid degrees must be positive (tp " +
                                  std::to_string(tp) + ", cp " + std::to_string(cp) + ", dp " +
                                  std::to_string(dp) + ", pp " + std::to_string(pp) + ")");
    if (rank < 0 || rank >= world())
      throw std::out_of_range("megadsl: rank " + std::to_string(rank) + " is outside [0, " +
                              std::to_string(world()) + ")");
  }

  // Product of the sizes of the masked dims (masked = true) or of the others.
  [[nodiscard]] constexpr std::int64_t masked_product(dim_mask m, bool masked) const {
    std::int64_t p = 1;
    for (grid_dim d : grid_dims)
      if (in_mask(m, d) == masked) p *= size(d);
    return p;
  }

  // Mixed-radix digits of the coordinates: masked dims form the member index, the others the group
  // index, each with its lowest-stride dim as the least significant digit.
  [[nodiscard]] constexpr place positions(dim_mask m, const rank_coords& c) const {
    place p;
    std::int64_t member_scale = 1, group_scale = 1;
    for (grid_dim d : grid_dims) {
      if (in_mask(m, d)) {
        p.member += c[d] * member_scale;
        member_scale *= size(d);
      } else {
        p.group += c[d] * group_scale;
        group_scale *= size(d);
      }
    }
    return p;
  }

  // The inverse of positions(): the rank at member index i of group index g.
  [[nodiscard]] constexpr std::int64_t rank_at(dim_mask m, std::int64_t g, std::int64_t i) const {
    std::int64_t r = 0;
    for (grid_dim d : grid_dims) {
      std::int64_t& digits = in_mask(m, d) ? i : g;
      r += (digits % size(d)) * stride(d);
      digits /= size(d);
    }
    return r;
  }

  [[nodiscard]] constexpr rank_list group_at(group_kind k, std::int64_t g) const {
    const group_kind_info& info = info_of(k);
    rank_list out;
    if (info.pipeline_ends) {
      out.push_back(rank_at(info.masked, g, 0));
      if (k == group_kind::embedding && pp > 1) out.push_back(rank_at(info.masked, g, pp - 1));
      return out;
    }
    return members(info.masked, g);
  }

  [[nodiscard]] constexpr rank_list members(dim_mask masked, std::int64_t g) const {
    rank_list out;
    const std::int64_t n = masked_product(masked, true);
    out.reserve(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) out.push_back(rank_at(masked, g, i));
    return out;
  }
};

constexpr rank_grid rank_grid::from(const layout& l, std::int64_t world) {
  // Only the degrees the grid reads enter the check, so the message is world_fits_layout's alone;
  // the layout's other rules belong to megadsl::check.
  const layout degrees{.tp = l.tp, .pp = l.pp, .cp = l.cp};
  struct item {
    std::string_view name;
    dim value;
  };
  const item items[] = {{"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"world", world}};
  violations v;
  for (const auto& [name, value] : items)
    if (value.get() <= 0)
      v.add("positive_sizes").add(name, " = ", value.get(), " must be positive");
  if (v.ok()) detail::check_run(degrees, run_facts{.world = world}, v);
  if (!v.ok())
    throw std::invalid_argument("megadsl: invalid layout: " + std::string(v.joined().view()));
  const std::int64_t model = l.tp.get() * l.pp.get() * l.cp.get();
  return {.tp = l.tp.get(), .cp = l.cp.get(), .dp = world / model, .pp = l.pp.get()};
}

// ---- the expert grid (mixture of experts) -------------------------------------------------------

// Megatron's second rank generator over the same ranks, for expert parameters and token dispatch:
// expert tensor parallel (etp, by default tp) x expert parallel (ep) x expert data parallel (edp)
// x pp, in the order tp-ep-dp-pp (cp is 1 in it):
//   etp = r % ETP, ep = (r / ETP) % EP, edp = (r / (ETP EP)) % EDP, pp = r / (ETP EP EDP),
// EDP = world / (ETP EP PP). Its pp groups are the decoder grid's (both put pp last, with the same
// product below it).
enum class expert_group_kind : std::uint8_t {
  ep,         // the experts of one layer, split over it: all-to-all token dispatch
  etp,        // one expert's tensor-parallel shards
  etp_ep,     // Megatron's expert tp-ep group (the allgather dispatcher's domain)
  etp_ep_pp,  // Megatron's expert model-parallel group
  edp,        // the copies of one expert shard: its gradients are reduced here
};

struct expert_group_kind_info {
  expert_group_kind kind;
  std::string_view name;    // as the API and the CLI spell it
  std::string_view tokens;  // Megatron's token string on the expert generator
  dim_mask masked;          // over the expert grid's dims, stored in the decoder grid's slots:
                            // etp in tp's, ep in cp's, edp in dp's
};

inline constexpr std::array<expert_group_kind_info, 5> expert_group_kind_table = [] {
  using enum grid_dim;
  using k = expert_group_kind;
  return std::array<expert_group_kind_info, 5>{{
      {k::ep, "ep", "ep", mask_of(cp)},
      {k::etp, "etp", "tp", mask_of(tp)},
      {k::etp_ep, "etp_ep", "tp-ep", mask_of(tp, cp)},
      {k::etp_ep_pp, "etp_ep_pp", "tp-ep-pp", mask_of(tp, cp, pp)},
      {k::edp, "edp", "dp", mask_of(dp)},
  }};
}();

constexpr const expert_group_kind_info& info_of(expert_group_kind k) {
  return expert_group_kind_table[static_cast<std::size_t>(k)];
}
constexpr std::string_view name_of(expert_group_kind k) { return info_of(k).name; }

static_assert([] {
  for (std::size_t i = 0; i < expert_group_kind_table.size(); ++i)
    if (static_cast<std::size_t>(expert_group_kind_table[i].kind) != i) return false;
  return true;
}(), "expert_group_kind_table rows must follow the order of enum expert_group_kind");

struct expert_coords {
  std::int64_t etp = 0, ep = 0, edp = 0, pp = 0;
  constexpr bool operator==(const expert_coords&) const = default;
};

struct expert_grid {
  std::int64_t etp = 1, ep = 1, edp = 1, pp = 1;  // world = etp * ep * edp * pp

  // The expert grid a layout gets on `world` ranks: etp = the layout's etp (0: its tp),
  // edp = world / (etp * ep * pp). Throws std::invalid_argument with rule
  // expert_grid_fits_world's message when the world is not a multiple of etp * ep * pp.
  static constexpr expert_grid from(const layout& l, std::int64_t world);

  [[nodiscard]] constexpr std::int64_t world() const { return etp * ep * edp * pp; }
  [[nodiscard]] constexpr expert_coords coords(std::int64_t rank) const {
    const rank_coords c = grid().coords(rank);
    return {c.tp, c.cp, c.dp, c.pp};
  }
  [[nodiscard]] constexpr std::int64_t group_size(expert_group_kind k) const {
    return grid().masked_size(info_of(k).masked);
  }
  [[nodiscard]] constexpr rank_list group(expert_group_kind k, std::int64_t rank) const {
    return grid().masked_group(info_of(k).masked, rank);
  }
  [[nodiscard]] constexpr std::int64_t rank_in_group(expert_group_kind k, std::int64_t rank) const {
    return grid().masked_rank(info_of(k).masked, rank);
  }
  [[nodiscard]] constexpr std::vector<rank_list> all_groups(expert_group_kind k) const {
    return grid().masked_groups(info_of(k).masked);
  }
  [[nodiscard]] constexpr rank_list ep_group(std::int64_t r) const { return group(expert_group_kind::ep, r); }
  [[nodiscard]] constexpr rank_list etp_group(std::int64_t r) const { return group(expert_group_kind::etp, r); }
  [[nodiscard]] constexpr rank_list edp_group(std::int64_t r) const { return group(expert_group_kind::edp, r); }
  // The pipeline group, the same as the decoder grid's (Megatron asserts it).
  [[nodiscard]] constexpr rank_list pp_group(std::int64_t r) const {
    return grid().masked_group(mask_of(grid_dim::pp), r);
  }

  constexpr bool operator==(const expert_grid&) const = default;

 private:
  // The same arithmetic as the decoder grid's, with etp, ep, edp in tp's, cp's and dp's slots.
  [[nodiscard]] constexpr rank_grid grid() const { return {.tp = etp, .cp = ep, .dp = edp, .pp = pp}; }
};

constexpr expert_grid expert_grid::from(const layout& l, std::int64_t world) {
  struct item {
    std::string_view name;
    dim value;
  };
  const item items[] = {{"tp", l.tp}, {"pp", l.pp}, {"ep", l.ep}, {"world", world}};
  violations v;
  for (const auto& [name, value] : items)
    if (value.get() <= 0) v.add("positive_sizes").add(name, " = ", value.get(), " must be positive");
  if (l.etp.get() < 0) v.add("positive_sizes").add("etp = ", l.etp.get(), " must be positive (or 0 for etp = tp)");
  if (v.ok()) detail::check_expert_tp(l, v);
  if (v.ok()) detail::check_expert_grid(l, run_facts{.world = world}, v);
  if (!v.ok()) throw std::invalid_argument("megadsl: invalid layout: " + std::string(v.joined().view()));
  const std::int64_t etp = expert_tp(l);
  return {.etp = etp, .ep = l.ep.get(), .edp = world / (etp * l.ep.get() * l.pp.get()), .pp = l.pp.get()};
}

// "etp 2 x ep 2 x edp 2 x pp 2 = 16 ranks (order tp-ep-dp-pp, etp fastest)"
inline std::string to_string(const expert_grid& g) {
  return "etp " + std::to_string(g.etp) + " x ep " + std::to_string(g.ep) + " x edp " + std::to_string(g.edp) +
         " x pp " + std::to_string(g.pp) + " = " + std::to_string(g.world()) + " ranks (order tp-ep-dp-pp, etp fastest)";
}

// ---- printing (run time) ------------------------------------------------------------------------

// "[3, 7, 11, 15]"; a long group keeps its first members and its last one:
// "[0, 8, 16, ..., 4088] (512 ranks)".
inline std::string format_ranks(const rank_list& ranks, std::size_t shown = 12) {
  std::string out = "[";
  const std::size_t n = ranks.size();
  const bool cut = n > shown && shown >= 2;
  for (std::size_t i = 0; i < n; ++i) {
    if (cut && i == shown - 1) {
      out += ", ...";
      i = n - 1;
    }
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  out += "]";
  if (cut) out += " (" + std::to_string(n) + " ranks)";
  return out;
}

// "tp 2 x cp 1 x dp 2 x pp 4 = 16 ranks (order tp-cp-ep-dp-pp, tp fastest)"
inline std::string to_string(const rank_grid& g) {
  std::string out;
  for (grid_dim d : grid_dims) {
    if (!out.empty()) out += " x ";
    out += std::string(name_of(d)) + " " + std::to_string(g.size(d));
  }
  return out + " = " + std::to_string(g.world()) + " ranks (order tp-cp-ep-dp-pp, tp fastest)";
}

// "tp 1, cp 0, dp 1, pp 2"
inline std::string to_string(const rank_coords& c) {
  std::string out;
  for (grid_dim d : grid_dims) {
    if (!out.empty()) out += ", ";
    out += std::string(name_of(d)) + " " + std::to_string(c[d]);
  }
  return out;
}

// One rank's coordinates and groups, for the command-line tool:
//   rank 11 of tp 2 x cp 1 x dp 2 x pp 4 = 16 ranks (order tp-cp-ep-dp-pp, tp fastest)
//     coords                  tp 1, cp 0, dp 1, pp 2
//     tp                      rank 1 of 2     [10, 11]
//     ...
//     embedding               not a member    [3, 15]
//     pipeline                prev 7, next 15, middle stage
inline std::string describe_rank(const rank_grid& g, std::int64_t rank) {
  auto pad = [](std::string s, std::size_t width) {
    if (s.size() < width) s.append(width - s.size(), ' ');
    return s;
  };
  std::string out = "rank " + std::to_string(rank) + " of " + to_string(g) + "\n";
  out += "  " + pad("coords", 24) + to_string(g.coords(rank)) + "\n";
  for (const group_kind_info& k : group_kind_table) {
    std::string label(k.name);
    if (k.kind == group_kind::model_parallel) label += " (" + std::string(k.tokens) + ")";
    const std::int64_t i = g.rank_in_group(k.kind, rank);
    const std::string member = i < 0 ? "not a member"
                                     : "rank " + std::to_string(i) + " of " +
                                           std::to_string(g.group_size(k.kind));
    out += "  " + pad(label, 24) + pad(member, 16) + format_ranks(g.group(k.kind, rank)) + "\n";
  }
  const bool first = g.is_pipeline_first(rank), last = g.is_pipeline_last(rank);
  const char* stage = first && last ? "only stage"
                      : first       ? "first stage"
                      : last        ? "last stage"
                                    : "middle stage";
  out += "  " + pad("pipeline", 24) + "prev " + std::to_string(g.pipeline_prev(rank)) + ", next " +
         std::to_string(g.pipeline_next(rank)) + ", " + stage + "\n";
  return out;
}

}  // namespace megadsl
