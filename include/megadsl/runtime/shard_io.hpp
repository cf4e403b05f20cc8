// HF tensors <-> per-rank shards, driven by the shard plan (DESIGN §4-§6). One implementation
// serves TP-invariant initialisation, checkpoint loading and saving, and gathering for tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "megadsl/parallel/comm.hpp"
#include "megadsl/shard_plan.hpp"

namespace megadsl {

// One slice of one HF tensor inside a tp rank's local shard: the rows (dim 0) or columns (dim 1)
// [local_offset, local_offset + extent) of the shard are the rows/columns [global_offset,
// global_offset + extent) of HF source `slot` (row.hf[slot]); the other dimension is whole.
// The one description of how shards map to HF tensors: shard_from_hf, hf_from_shards and the
// distributed checkpoint all read it.
struct shard_piece {
  int slot = 0;
  int dim = 0;
  std::int64_t local_offset = 0;
  std::int64_t global_offset = 0;
  std::int64_t extent = 0;
  int source = 0;  // the row's geometry source it comes from (slot is 0 for every source of one HF tensor)

  bool operator==(const shard_piece&) const = default;
};

// Which pieces of a shard to list.
enum class piece_set : std::int8_t {
  all,           // every element with an HF source (what a rank loads); vocab padding has none
  main_replica,  // only the elements this tp rank is the main replica of (what a rank saves)
};

// The pieces of tp rank `tp_rank`'s local shard, in local order. With piece_set::main_replica the
// pieces of all tp ranks together cover every element of every HF source exactly once:
// replicated parameters belong to tp rank 0; with kv_heads < tp a kv head's k and v rows belong
// to the first rank holding it (tp_rank * kv_heads % tp == 0); vocab padding is never a piece; a
// tied lm_head (the embedding's copy) has none.
std::vector<shard_piece> shard_pieces(const param_plan& p, const shape& s, const layout& l,
                                      std::int64_t tp_rank, piece_set which);

// This tp rank's local shard, from the HF-shaped source tensors in the row's slot order.
at::Tensor shard_from_hf(const param_plan& p, const shape& s, const layout& l, std::int64_t tp_rank,
                         const std::vector<at::Tensor>& hf);

// The HF-shaped tensors back from every tp rank's local shard (in tp rank order): fused tensors
// split, kv replicas taken once, vocab padding dropped.
std::vector<at::Tensor> hf_from_shards(const param_plan& p, const shape& s, const layout& l,
                                       const std::vector<at::Tensor>& shards);

// The HF-shaped tensors of one parameter, gathered from every rank of the tp group.
std::vector<at::Tensor> gather_hf(const param_plan& p, const shape& s, const layout& l,
                                  const comm_group* tp, const at::Tensor& local);

// The row's name for one layer: "layers.{layer}.qkv.weight" -> "layers.3.qkv.weight".
std::string with_layer(std::string_view pattern, std::int64_t layer);
// ... and for one expert: "layers.{layer}.experts.{expert}.down.weight" -> "layers.3.experts.5.down.weight".
std::string with_instance(std::string_view pattern, param_instance at);

// How HF stores the experts of a row with hf_stacking (gpt-oss): one tensor per layer holds every
// expert, each matrix (in, out) (x @ W), gate and up columns interleaved where the row says so.
//   hf_key             the name of source `slot` for one instance: the HF name, and for an expert's
//                      slice of a stack "name[e]" (a unique key: initialisation seeds, the
//                      distributed checkpoint, gathered lists before merge_stacked)
//   expert_from_stack  expert e of the stored stack, as nn.Linear holds it: (out, in) or (out),
//                      [gate; up] de-interleaved
//   stack_slice_of     the inverse: one expert's tensor in the stack's layout
//   merge_stacked      "name[e]" entries of a list (in stack_slice_of's layout) joined into "name",
//                      stacked by e, at the place of the first; every e from 0 must be there
std::string hf_key(const param_row& row, int slot, param_instance at);
at::Tensor expert_from_stack(const at::Tensor& stack, const param_row& row, std::int64_t expert);
at::Tensor stack_slice_of(const at::Tensor& linear, const param_row& row);
void merge_stacked(std::vector<std::pair<std::string, at::Tensor>>& tensors);

// A tensor as HF's file holds it and as megadsl does (param_row::form):
//   held_form       HF's 0-dim buffer -> (1), a conv's (rows, 1, cols) -> (rows, cols), one row
//                   (1, n) -> (n); anything else as is
//   hf_stored_form  the inverse, and an expert's tensor of a stacked row as its slice of the stack
at::Tensor held_form(const param_row& row, const at::Tensor& stored);

// The share of tp rank `rank` of `tp` in a tensor of slots (geo::column_slots: Qwen3.5's
// in_proj_qkv, the DeltaNet's conv; rows of each slot, 0 for none): each slot's first row in the
// whole tensor and its rows here, in slot order; side by side they are [slot0_r ; slot1_r ; ...].
// Every slot's rows must split over tp (the caller checks).
struct slot_share {
  std::int64_t first = 0, rows = 0;
};
std::vector<slot_share> slot_shares(const std::vector<std::int64_t>& slots, std::int64_t tp, std::int64_t rank);
at::Tensor hf_stored_form(const param_row& row, const at::Tensor& held);

}  // namespace megadsl
