// A parameter's shard geometry, stated by the block that declares it (issue 47): its HF sources'
// dims, the dim that splits over tp, and what a rank holds when a source has fewer units than
// there are tp ranks. The shard plan, the HF and distributed-checkpoint I/O, the rollout export,
// the formulas and the stage read this and nothing else: a block with a new tensor shape writes a
// geometry function and touches no megadsl file.
//
//   split 0   column-parallel: each source's rows are `units` units (heads, channels) of `unit`
//             rows; a rank holds units / tp of each, or, where a source allows it and has fewer
//             units than tp, the one unit of its group, replicated over tp / units ranks
//   split 1   row-parallel: the same along the columns
//   split -1  whole on every rank
//
// A row of several sources (a fused q/k/v, gate/up, Qwen3.5's in_proj_qkv) holds them side by side
// on each rank ([gate_r ; up_r]), or `grouped`: for each unit of its last source, that unit's share
// of every source ([q heads | k | v] per kv group).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "megadsl/shape.hpp"

namespace megadsl {

// One HF source of a row along its split dim (its only dim, or its rows, when it is not split).
struct geometry_source {
  std::int64_t units = 0;  // heads, kv heads, channels (0: no such source)
  std::int64_t unit = 1;   // elements of one unit along the dim
  bool replicated_when_fewer = false;  // fewer units than tp ranks: each rank its group's one
  [[nodiscard]] constexpr std::int64_t extent() const { return units * unit; }
  constexpr bool operator==(const geometry_source&) const = default;
};

struct row_geometry {
  int split = 0;             // the HF dim split over tp: 0, 1, or -1 (whole on every rank)
  std::int64_t across = 0;   // the other dim (a column row's columns, a row-parallel row's rows); 0: a vector
  std::array<geometry_source, 3> sources{};
  bool grouped = false;      // per rank, per unit of the last source: each source's share
  bool vocab = false;        // the vocabulary's rows, padded per layout (rows past the true vocab are zero)
  bool token_matrix = true;  // (a matrix) it multiplies every token's activations (the formulas count it)
  std::string_view label{};  // `describe`'s name for it; empty: column, row or replicated

  [[nodiscard]] constexpr int source_count() const {
    int n = 0;
    for (const geometry_source& x : sources) n += x.units > 0;
    return n;
  }
  // The whole of the split dim over every source (the concatenated HF tensor's).
  [[nodiscard]] constexpr std::int64_t total() const {
    std::int64_t n = 0;
    for (const geometry_source& x : sources) n += x.extent();
    return n;
  }
  [[nodiscard]] constexpr std::string_view kind_name() const {
    if (!label.empty()) return label;
    if (vocab) return "vocab";
    return split == 0 ? "column" : split == 1 ? "row" : "replicated";
  }
  constexpr bool operator==(const row_geometry&) const = default;
};
using row_geometry_fn = row_geometry (*)(const shape&);

// A row's HF shape in the simple form (rows, cols), cols 0 for a vector: what a block with a
// one-source row writes, then `geo::column<F>`, `geo::row<F>` or `geo::whole<F>` says how it splits.
struct row_dims {
  std::int64_t rows = 0, cols = 0;
};
using row_dims_fn = row_dims (*)(const shape&);
// The rows of each slot of a several-source column row (Qwen3.5's in_proj_qkv [q | k | v]).
using row_slots_fn = std::array<std::int64_t, 3> (*)(const shape&);

// The geometries of megadsl's own blocks, and the adapters a block's own row uses.
namespace geo {

constexpr std::int64_t head_dim_of(const shape& s) { return effective_head_dim(s).get(); }
constexpr std::int64_t dense_ffn(const shape& s) { return s.ffn.get(); }
constexpr std::int64_t expert_ffn(const shape& s) { return expert_ffn_of(s).get(); }
constexpr std::int64_t shared_ffn(const shape& s) { return s.shared_expert_ffn.get(); }
using width_fn = std::int64_t (*)(const shape&);

// A one-source row from its (rows, cols): rows split over tp, columns split, or whole.
template <row_dims_fn F>
constexpr row_geometry column(const shape& s) {
  const row_dims d = F(s);
  return {.split = 0, .across = d.cols, .sources = {{{d.rows}}}};
}
template <row_dims_fn F>
constexpr row_geometry row(const shape& s) {
  const row_dims d = F(s);
  return {.split = 1, .across = d.rows, .sources = {{{d.cols}}}};
}
template <row_dims_fn F>
constexpr row_geometry whole(const shape& s) {
  const row_dims d = F(s);
  return {.split = -1, .across = d.cols, .sources = {{{d.rows}}}};
}
// Several sources side by side along the rows, each split over tp ([slot0_r ; slot1_r ; slot2_r]).
template <row_dims_fn F, row_slots_fn Slots>
constexpr row_geometry column_slots(const shape& s) {
  const auto slots = Slots(s);
  return {.split = 0, .across = F(s).cols, .sources = {{{slots[0]}, {slots[1]}, {slots[2]}}}, .label = "column slots"};
}

// (h): a norm's weight and bias, a row-parallel projection's bias.
constexpr row_geometry hidden(const shape& s) { return {.split = -1, .sources = {{{s.hidden.get()}}}}; }
// (d): a q/k norm's weight shared by every head.
constexpr row_geometry head_dim(const shape& s) { return {.split = -1, .sources = {{{head_dim_of(s)}}}}; }
// (heads d), (kv_heads d): a full-width q/k norm's weight, split with the heads.
constexpr row_geometry q_width(const shape& s) { return {.sources = {{{s.heads.get(), head_dim_of(s)}}}}; }
constexpr row_geometry k_width(const shape& s) { return {.sources = {{{s.kv_heads.get(), head_dim_of(s)}}}}; }
// (heads, d), (kv_heads, d): a weight per head (Command R+'s q/k norms), split with the heads; with
// fewer kv heads than tp ranks each rank holds its group's one.
constexpr row_geometry q_head_weights(const shape& s) {
  return {.across = head_dim_of(s), .sources = {{{s.heads.get()}}}, .token_matrix = false};
}
constexpr row_geometry kv_head_weights(const shape& s) {
  return {.across = head_dim_of(s), .sources = {{{s.kv_heads.get(), 1, true}}}, .token_matrix = false};
}
// q_proj, k_proj, v_proj fused: per rank, per kv group [its query heads | k | v]; a kv head
// replicated over tp / kv_heads ranks when there are fewer.
template <bool Bias>
constexpr row_geometry qkv(const shape& s) {
  const std::int64_t d = head_dim_of(s);
  return {.across = Bias ? 0 : s.hidden.get(),
          .sources = {{{s.heads.get(), d}, {s.kv_heads.get(), d, true}, {s.kv_heads.get(), d, true}}},
          .grouped = true, .label = "fused q/k/v"};
}
// GPT-NeoX's query_key_value: ((heads + 2 kv_heads) d) rows grouped per head, split with the heads.
template <bool Bias>
constexpr row_geometry neox_qkv(const shape& s) {
  const std::int64_t heads = s.heads.get(), rows = (heads + 2 * s.kv_heads.get()) * head_dim_of(s);
  return {.across = Bias ? 0 : s.hidden.get(), .sources = {{{heads, rows / heads}}}};
}
// o_proj: (h, heads d), its input split with the heads.
constexpr row_geometry attn_out(const shape& s) {
  return {.split = 1, .across = s.hidden.get(), .sources = {{{s.heads.get(), head_dim_of(s)}}}};
}
// A gated MLP's gate and up, fused: per rank [gate_r ; up_r], of the MLP's width W.
template <width_fn W, bool Bias>
constexpr row_geometry gate_up(const shape& s) {
  return {.across = Bias ? 0 : s.hidden.get(), .sources = {{{W(s)}, {W(s)}}}, .label = "fused gate/up"};
}
// An MLP's down projection: (h, W), its input split.
template <width_fn W>
constexpr row_geometry down(const shape& s) {
  return {.split = 1, .across = s.hidden.get(), .sources = {{{W(s)}}}};
}
// A plain MLP's fc: (ffn, h) and its bias (ffn).
template <bool Bias>
constexpr row_geometry ffn_rows(const shape& s) {
  return {.across = Bias ? 0 : s.hidden.get(), .sources = {{{s.ffn.get()}}}};
}
// The router (experts, h), its expert bias (experts), a shared expert's gate (1, h): whole on every
// rank; Megatron's formula leaves the router and the gate out of the FLOPs.
constexpr row_geometry router(const shape& s) {
  return {.split = -1, .across = s.hidden.get(), .sources = {{{s.experts.get()}}}, .token_matrix = false};
}
constexpr row_geometry expert_vector(const shape& s) { return {.split = -1, .sources = {{{s.experts.get()}}}}; }
constexpr row_geometry one_row(const shape& s) {
  return {.split = -1, .across = s.hidden.get(), .sources = {{{1}}}, .token_matrix = false};
}
// The embedding and the LM head: (vocab, h), the vocabulary padded per layout and split over tp.
constexpr row_geometry vocab(const shape& s) {
  return {.across = s.hidden.get(), .sources = {{{s.vocab.get()}}}, .vocab = true};
}
// The value head: (1, h) and its bias (1), whole on every rank.
constexpr row_geometry value_weight(const shape& s) { return {.split = -1, .across = s.hidden.get(), .sources = {{{1}}}}; }
constexpr row_geometry value_bias(const shape&) { return {.split = -1, .sources = {{{1}}}}; }
// One number (xIELU's scalars).
constexpr row_geometry scalar(const shape&) { return {.split = -1, .sources = {{{1}}}}; }

}  // namespace geo
}  // namespace megadsl
