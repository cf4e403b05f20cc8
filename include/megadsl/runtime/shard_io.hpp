// HF tensors <-> per-rank shards, driven by the shard plan (DESIGN §4-§6). One implementation
// serves TP-invariant initialisation, checkpoint loading and saving, and gathering for tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "megadsl/parallel/comm.hpp"
#include "megadsl/shard_plan.hpp"

namespace megadsl {

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

}  // namespace megadsl
