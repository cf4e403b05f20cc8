// The trainer's state (private to src/runtime/): the model's hooks, AdamW, and the distributed
// optimizer's slices. trainer.cpp runs the steps; distributed_optimizer.cpp shards the optimizer.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "megadsl/runtime/offload.hpp"
#include "megadsl/runtime/trainer.hpp"

namespace megadsl {

namespace detail {

class trainer_impl {
 public:
  model_hooks model;
  std::vector<named_parameter>* params = nullptr;
  const parallel_groups* groups = nullptr;
  bool actor = true;
  optimizer_config opt;
  actor_loss_config actor_cfg;
  critic_loss_config critic_cfg;
  std::unique_ptr<torch::optim::AdamW> adamw;
  // The distributed optimizer: for each parameter (in params' order) the slice this rank updates,
  // which AdamW holds in the parameter's place. Empty with the replicated optimizer.
  struct slice {
    const comm_group* group = nullptr;  // dp (edp for an expert); null: the whole parameter is here
    std::int64_t chunk = 0;             // elements per rank: ceil(numel / group size)
    std::int64_t offset = 0, size = 0;  // this rank's [offset, offset + size) of the flat parameter
    at::Tensor view;                    // (size,) a view of the parameter's storage, no autograd
  };
  std::vector<slice> slices;
  offload_set optimizer_offload;  // AdamW's moments while offloaded
  std::int64_t steps = 0, samples = 0;

  // The tensor AdamW updates for parameter i: the parameter, or this rank's slice of it.
  [[nodiscard]] const at::Tensor& optimized(std::size_t i) const {
    return slices.empty() ? (*params)[i].tensor : slices[i].view;
  }
  // Every gradient dropped (the parameters' and the slices' views of them).
  void zero_grads() {
    for (auto& sl : slices) sl.view.mutable_grad().reset();  // views: AdamW's zero_grad cannot detach them
    adamw->zero_grad();
    for (auto& p : *params) p.tensor.mutable_grad().reset();
  }
  // With the distributed optimizer over a group of more than one rank, the gradients are
  // reduce-scattered: each rank receives the dp-summed gradient of its slices only.
  [[nodiscard]] bool scatters() const {
    return std::any_of(slices.begin(), slices.end(), [](const slice& sl) { return sl.group != nullptr; });
  }
  // The dp (edp) sums of the finalized-over-tp gradients, each rank's slices only, in buckets of
  // about `bucket_elements` per collective; the parameters' whole gradients are dropped after.
  void scatter_grads(std::int64_t bucket_elements);
  // The global gradient norm from the slices: each element of the model is in one rank's slice.
  double slice_norm();
  // AdamW's step on what it holds; with the distributed optimizer each slice's gradient is its
  // part of the reduced, clipped gradient, and the slices are all-gathered after.
  void optimizer_step();
  std::int64_t skipped = 0;  // steps not applied: their gradient norm or loss was not finite
  bool batch_checksum = true;  // the ranks compare the global batch's values too, not only its shapes
};

}  // namespace detail

namespace detail {

// Each parameter's slice for the distributed optimizer (empty-grouped where the group has one rank).
std::vector<trainer_impl::slice> slices_of(std::vector<named_parameter>& params, const parallel_groups& g);
// A moment of a slice, whole: gathered over the slice's group (the checkpoint's layout-free form).
at::Tensor whole_moment(const at::Tensor& part, const trainer_impl::slice& sl, const at::Tensor& param);

}  // namespace detail

}  // namespace megadsl
