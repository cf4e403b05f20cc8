// The parallel layout of a model: degrees and switches, each static or dynamic.
//
//   megadsl::layout{.tp = 4, .pp = 2, .sp = true}
//
// Context parallelism shares each sequence's tokens over cp ranks; its attention exchanges heads
// (Ulysses all-to-all: each cp rank a share of the query heads, rule `cp_splits_heads`) or passes
// k/v blocks around a ring (cp_comm_kind::ring, Megatron's p2p: any head count, the tokens of a
// load-balanced split), or both (cp_comm_kind::a2a_ring, Megatron's a2a+p2p: an all-to-all over
// heads within groups of cp_a2a consecutive cp ranks, a ring over the cp / cp_a2a groups).
// Expert parallelism needs a mixture of experts (rule `ep_needs_experts`).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/static_value.hpp"

namespace megadsl {

// What the backward pass keeps (Megatron's recompute_granularity). selective: each layer's
// attention core (RoPE and the attention kernel, from q, k, v to the heads' output) runs again in
// the backward instead of keeping its outputs; full: each layer keeps its input only and runs
// again whole in the backward (Megatron's full granularity, uniform method, one layer per unit).
// The numbers are the same either way (layers/recompute.hpp).
enum class recompute_kind : std::int8_t { none, selective, full };

constexpr std::string_view name_of(recompute_kind r) {
  switch (r) {
    case recompute_kind::none: return "none";
    case recompute_kind::selective: return "selective";
    case recompute_kind::full: return "full";
  }
  return "?";
}

// The kind named `name` (name_of's words), or false: the one parser of the CLI's --recompute and
// Python's recompute=.
constexpr bool recompute_from_name(std::string_view name, recompute_kind& out) {
  for (const recompute_kind r : {recompute_kind::none, recompute_kind::selective, recompute_kind::full})
    if (name_of(r) == name) return out = r, true;
  return false;
}

// How context parallelism's attention communicates (Megatron's cp_comm_type): a2a exchanges heads
// (Ulysses), ring passes k/v blocks rank to rank ("p2p": each rank holds chunks i and 2 cp - 1 - i
// of every sequence, so causal work is even), a2a_ring does both (hierarchical, "a2a+p2p": the
// ring's load-balanced split, then within each group of cp_a2a consecutive cp ranks an all-to-all
// gives each rank the group's rows of 1/cp_a2a of the heads, which ring over the cp / cp_a2a
// groups' ranks holding the same heads).
enum class cp_comm_kind : std::int8_t { a2a, ring, a2a_ring };

constexpr std::string_view name_of(cp_comm_kind k) {
  return k == cp_comm_kind::ring ? "ring" : k == cp_comm_kind::a2a_ring ? "a2a+ring" : "a2a";
}

// The kind named `name` ("a2a", "ring", "a2a+ring", or Megatron's "p2p" and "a2a+p2p"), or false:
// the one parser of the CLI's --cp-comm, Python's cp_comm= and verl's cp_comm_type.
constexpr bool cp_comm_from_name(std::string_view name, cp_comm_kind& out) {
  if (name == "a2a") return out = cp_comm_kind::a2a, true;
  if (name == "ring" || name == "p2p") return out = cp_comm_kind::ring, true;
  if (name == "a2a+ring" || name == "a2a+p2p") return out = cp_comm_kind::a2a_ring, true;
  return false;
}

struct layout {
  dim tp = 1;                  // tensor-parallel degree
  dim pp = 1;                  // pipeline-parallel degree
  dim vpp = 1;                 // virtual pipeline chunks per pipeline rank (interleaved 1F1B)
  dim first_stage_layers = 0;  // 0: even split; else layers on the first pipeline stage
  dim last_stage_layers = 0;   // 0: even split; else layers on the last pipeline stage
  flag sp = false;             // sequence parallelism (needs tp > 1)
  flag rmpad = false;          // remove padding: packed tokens with cu_seqlens
  dim vocab_pad_multiple = 128;  // vocab padded to a multiple of this times tp (Megatron's rule)
  dim cp = 1;                  // context parallel: each rank 1/cp of every sequence's tokens
  maybe<cp_comm_kind> cp_comm = cp_comm_kind::a2a;  // its attention: heads all-to-all (Ulysses), a k/v ring, or both
  dim cp_a2a = 1;              // cp_comm a2a+ring: the all-to-all groups' size (Megatron's hierarchical_context_parallel_sizes[0])
  dim ep = 1;                  // expert parallel: whole experts per rank of the ep group
  dim etp = 0;                 // expert tensor parallel (the expert grid, rank_grid.hpp); 0: = tp
  maybe<recompute_kind> recompute = recompute_kind::none;  // activation recompute in the backward
  // Invariant arithmetic (layers/invariant.hpp): a sequence's outputs the same bits whatever else
  // is in its batch, its padding, micro-batching and this layout's degrees; slower, off by default.
  flag invariant = false;
};

// A layout with every degree and switch known only at run time (command-line tool).
inline constexpr layout dynamic_layout = {
    .tp = dynamic, .pp = dynamic, .vpp = dynamic, .first_stage_layers = dynamic,
    .last_stage_layers = dynamic, .sp = dynamic, .rmpad = dynamic,
    .vocab_pad_multiple = dynamic, .cp = dynamic, .cp_comm = dynamic, .cp_a2a = dynamic, .ep = dynamic, .etp = dynamic,
    .recompute = dynamic, .invariant = dynamic};

constexpr bool tp_is_static_one(const layout& l) { return l.tp.is_static() && l.tp.get() == 1; }

// Whether context parallelism runs the ring (cp > 1 and cp_comm ring or a2a+ring): the
// load-balanced split, k/v blocks passed around.
constexpr bool cp_ring(const layout& l) { return l.cp.get() > 1 && l.cp_comm.get() != cp_comm_kind::a2a; }

// The all-to-all's group size over heads: cp under Ulysses, 1 under the plain ring, cp_a2a under
// a2a+ring (1 at cp = 1).
constexpr std::int64_t cp_a2a_size(const layout& l) {
  if (l.cp.get() <= 1) return 1;
  switch (l.cp_comm.get()) {
    case cp_comm_kind::a2a: return l.cp.get();
    case cp_comm_kind::ring: return 1;
    case cp_comm_kind::a2a_ring: return l.cp_a2a.get();
  }
  return 1;
}
// The ring's size: cp / cp_a2a_size (1 under Ulysses).
constexpr std::int64_t cp_ring_size(const layout& l) { return l.cp.get() / cp_a2a_size(l); }

// The expert tensor-parallel degree: etp, or tp when etp is 0 (Megatron's default).
constexpr std::int64_t expert_tp(const layout& l) { return l.etp.get() == 0 ? l.tp.get() : l.etp.get(); }

}  // namespace megadsl
