// Per-rank shard shapes of every parameter, derived from shape + layout + head.
//
// constexpr throughout, so for a static model `static_assert(local_shape(...) == ...)` works; the
// same functions serve dynamic models at run time and `megadsl describe`.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <string_view>

#include "megadsl/heads.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/architecture.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/stages.hpp"

namespace megadsl {

// A tensor shape of rank 1 or 2.
struct dims {
  std::int64_t rows = 0;
  std::int64_t cols = 0;  // 0 for rank-1 tensors
  int rank = 2;

  constexpr bool operator==(const dims&) const = default;
  [[nodiscard]] constexpr std::int64_t numel() const { return rank == 1 ? rows : rows * cols; }
};
constexpr dims vec(std::int64_t n) { return {n, 0, 1}; }
constexpr dims mat(std::int64_t r, std::int64_t c) { return {r, c, 2}; }

// The head as the shard plan sees it.
struct head_info {
  bool actor = true;
  bool value_bias = true;
};

template <auto H>
constexpr head_info head_of() {
  if constexpr (is_value_head<H>) return {false, H.bias};
  else return {true, false};
}

// The fused QKV of one tp rank (DESIGN §4): `groups` local kv groups, each [q x q_per_group | k | v].
// With kv_heads < tp each rank holds one kv group (replicated across tp / kv_heads ranks) and
// heads / tp of its query heads.
struct qkv_rank_layout {
  std::int64_t groups = 0;       // kv groups held by this rank
  std::int64_t q_per_group = 0;  // query heads per local group
  std::int64_t first_kv_head = 0;
  std::int64_t first_q_head = 0;
  std::int64_t head_dim = 0;
  [[nodiscard]] constexpr std::int64_t rows() const { return groups * (q_per_group + 2) * head_dim; }
};

constexpr qkv_rank_layout qkv_layout(const shape& s, const layout& l, std::int64_t tp_rank) {
  const std::int64_t tp = l.tp, heads = s.heads, kv = s.kv_heads, hd = effective_head_dim(s);
  qkv_rank_layout q;
  q.head_dim = hd;
  q.first_q_head = tp_rank * (heads / tp);
  if (kv >= tp) {
    q.groups = kv / tp;
    q.q_per_group = heads / kv;
    q.first_kv_head = tp_rank * q.groups;
  } else {
    q.groups = 1;
    q.q_per_group = heads / tp;
    q.first_kv_head = tp_rank * kv / tp;
  }
  return q;
}

// Units of source `x` a tp rank holds: its share, or its group's one unit when the source has fewer
// units than tp ranks and allows replicas (a kv head, each on tp / kv_heads ranks).
constexpr std::int64_t local_units(const geometry_source& x, std::int64_t tp) {
  return x.replicated_when_fewer && x.units < tp ? 1 : x.units / tp;
}
// Whether a row holds units replicated over several tp ranks (kv heads when kv_heads < tp): their
// gradients are summed over the ranks sharing them, and one of them is the main replica.
constexpr bool has_replicas(const row_geometry& g, std::int64_t tp) {
  if (g.split < 0) return false;
  for (const geometry_source& x : g.sources)
    if (x.units > 0 && x.replicated_when_fewer && x.units < tp) return true;
  return false;
}

// Whether a row of the model's architecture exists under the shape's config switches and the head.
constexpr bool present(const param_row& row, const shape& s, head_info h) {
  switch (row.when) {
    case presence::always: return true;
    case presence::qkv_bias: return s.qkv_bias.get();
    case presence::out_bias: return s.out_bias.get();
    case presence::key_nonzero: return setting(s, row.when_key) != 0;
    case presence::key_zero: return setting(s, row.when_key) == 0;
    case presence::mlp_bias: return s.mlp_bias.get();
    case presence::shared_experts: return s.shared_expert_ffn.get() > 0;
    case presence::actor: return h.actor;
    case presence::critic: return !h.actor;
    case presence::critic_bias: return !h.actor && h.value_bias;
  }
  return false;
}

struct param_plan {
  const param_row* row = nullptr;
  row_geometry geo{};               // the row's geometry at the model's shape (geometry.hpp)
  std::array<dims, 3> hf_shapes{};  // shapes of the HF source tensors (true vocab)
  dims local{};                     // per tp rank, in the sharded model
  dims global{};                    // all tp shards side by side (padded vocab, replicated kv)
  int split_dim = -1;               // tp split dimension of `global`, -1 when replicated
  bool tied = false;                // lm_head that shares the embedding weight
  std::string_view tied_source;     // then: the embedding's HF name, its source
};

// The shape HF's file stores HF source `i` of a row in: () for a 0-dim buffer (hf_form::scalar), (E, in,
// out) or (E, out) for a layer's experts stacked in one tensor (hf_stacking), else the source's own
// (out, in) or (out). `rank` of `size` is used.
struct stored_dims {
  std::array<std::int64_t, 3> size{};
  int rank = 0;
};
constexpr stored_dims hf_stored_shape(const param_plan& p, int i, const shape& s) {
  const dims& d = p.hf_shapes[static_cast<std::size_t>(i)];
  if (p.row->form == hf_form::scalar) return {};
  if (p.row->form == hf_form::conv) return {{d.rows, 1, d.cols}, 3};
  if (p.row->form == hf_form::one_row) return {{1, d.rows, 0}, 2};
  if (p.row->stacking != hf_stacking::none)
    return d.rank == 1 ? stored_dims{{s.experts.get(), d.rows, 0}, 2} : stored_dims{{s.experts.get(), d.cols, d.rows}, 3};
  return d.rank == 1 ? stored_dims{{d.rows, 0, 0}, 1} : stored_dims{{d.rows, d.cols, 0}, 2};
}

// Copies of a row in the model: one, one per layer, or one per expert of each layer.
constexpr std::int64_t instances(const param_row& row, const shape& s) {
  switch (row.where) {
    case placement::layer: return s.layers;
    case placement::expert: return s.layers.get() * s.experts.get();
    case placement::first_stage:
    case placement::last_stage: return 1;
  }
  return 1;
}

// Which layer and expert copy `i` of a row (in [0, instances)) is: layer-major, so one layer's
// experts are consecutive.
struct param_instance {
  std::int64_t layer = 0;
  std::int64_t expert = 0;
};
constexpr param_instance instance_of(const param_row& row, const shape& s, std::int64_t i) {
  if (row.where == placement::expert) return {i / s.experts.get(), i % s.experts.get()};
  if (row.where == placement::layer) return {i, 0};
  return {};
}

// Whether layer `layer` has a row: the row's block is in the layer's kind (every layer of a
// decoder of one kind; in a mixture whose layers differ, the dense MLP's rows on its dense layers,
// the router's and experts' on its sparse ones).
constexpr bool in_layer(const param_row& row, const shape& s, std::int64_t layer) {
  if (row.where != placement::layer && row.where != placement::expert) return true;
  return ((row.layer_kinds >> kind_of_layer(s, layer)) & 1U) != 0;
}
// Copy `i` of a row exists in the model (every copy does unless a mixture's layers differ).
constexpr bool exists(const param_row& row, const shape& s, std::int64_t i) {
  return in_layer(row, s, instance_of(row, s, i).layer);
}
// Copies of a row that exist: instances() less those of layers without it.
constexpr std::int64_t existing_instances(const param_row& row, const shape& s) {
  if (row.where != placement::layer && row.where != placement::expert) return 1;
  std::int64_t layers = 0;
  for (std::int64_t i = 0; i < s.layers.get(); ++i) layers += in_layer(row, s, i);
  return row.where == placement::expert ? layers * s.experts.get() : layers;
}

// A row's plan, from its geometry alone: the HF sources' shapes, each tp rank's shard (each
// source's local units side by side along the split dim), all shards side by side.
constexpr param_plan plan_of(const param_row& row, const shape& s, const layout& l) {
  param_plan p;
  p.row = &row;
  p.geo = row.geometry(s);
  const row_geometry& g = p.geo;
  const std::int64_t tp = g.split < 0 ? 1 : l.tp.get();
  const auto shaped = [&](std::int64_t along) {
    return g.split == 1 ? mat(g.across, along) : g.across == 0 ? vec(along) : mat(along, g.across);
  };
  std::int64_t local = 0;
  for (std::size_t i = 0; i < g.sources.size(); ++i) {
    const geometry_source& x = g.sources[i];
    if (x.units == 0) continue;
    p.hf_shapes[i] = shaped(x.extent());
    local += local_units(x, tp) * x.unit;
  }
  if (row.concatenated) p.hf_shapes = {shaped(g.total()), dims{}, dims{}};  // [Q; K; V], [gate; up]
  if (g.vocab) local = padded_vocab(s, l) / tp;  // the vocabulary is read only here
  p.local = shaped(local);
  p.global = shaped(local * tp);
  p.split_dim = g.split;
  p.tied = is_lm_head_row(row) && s.tie_embeddings.get();
  if (p.tied) p.tied_source = find_row(arch_of(s), "embed.weight")->hf[0];
  return p;
}

// Thrown by param_list's lookup for a name the model does not have.
struct no_such_parameter final : std::exception {
  [[nodiscard]] const char* what() const noexcept override { return "megadsl: no such parameter"; }
};

// Every parameter row of a model, in table order (layer rows once, with `{layer}`).
struct param_list {
  std::array<param_plan, max_rows> items{};
  std::size_t count = 0;
  [[nodiscard]] constexpr const param_plan* begin() const { return items.data(); }
  [[nodiscard]] constexpr const param_plan* end() const { return items.data() + count; }
  [[nodiscard]] constexpr const param_plan& operator[](std::string_view name) const {
    for (std::size_t i = 0; i < count; ++i)
      if (items[i].row->name == name) return items[i];
    throw no_such_parameter{};
  }
};

// f(plan) for each row the model has, in table order (no list built: cheaper in constant evaluation).
template <class F>
constexpr void for_each_param(const shape& s, const layout& l, head_info h, F&& f) {
  for (const param_row& row : arch_of(s).rows)
    if (present(row, s, h)) f(plan_of(row, s, l));
}

constexpr param_list plan_params(const shape& s, const layout& l, head_info h) {
  param_list out;
  for_each_param(s, l, h, [&](const param_plan& p) { out.items[out.count++] = p; });
  return out;
}

template <class Spec>
constexpr param_list plan_params() {
  return plan_params(Spec::shape, Spec::layout, head_of<Spec::head>());
}

// Shape of one parameter of a model type on each tp rank: `local_shape<actor>("embed.weight")`.
template <class Spec>
constexpr dims local_shape(std::string_view name) {
  return plan_params<Spec>()[name].local;
}

// Layers of pipeline rank `pp_rank` that have the row.
constexpr std::int64_t layers_with(const param_row& row, const shape& s, const layout& l, std::int64_t pp_rank) {
  if (arch_of(s).kinds.size() == 1) return layers_on_pp_rank(s, l, pp_rank);
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < s.layers.get(); ++i)
    n += place_of_layer(s, l, i).pp_rank == pp_rank && in_layer(row, s, i);
  return n;
}

// Elements each (tp rank, pp rank, ep rank) holds: the plan's figure for memory tables.
constexpr std::int64_t local_elements(const shape& s, const layout& l, head_info h,
                                      std::int64_t pp_rank) {
  std::int64_t total = 0;
  const std::int64_t last = l.pp.get() - 1;
  for_each_param(s, l, h, [&](const param_plan& p) {
    switch (p.row->where) {
      case placement::first_stage:
        if (pp_rank == 0) total += p.local.numel();
        break;
      case placement::layer:
        total += p.local.numel() * layers_with(*p.row, s, l, pp_rank);
        break;
      case placement::expert:  // experts / ep of each layer on each rank of the ep group
        total += p.local.numel() * layers_with(*p.row, s, l, pp_rank) * (s.experts.get() / l.ep.get());
        break;
      case placement::last_stage:
        // A tied lm_head is the embedding itself when both live on one rank.
        if (pp_rank == last && !(p.tied && pp_rank == 0)) total += p.local.numel();
        break;
    }
  });
  return total;
}

}  // namespace megadsl
