// Megatron's distributed optimizer (`use_distributed_optimizer`): AdamW's moments sharded over dp
// (an expert's over the expert-data-parallel group). The gradients are reduce-scattered in buckets,
// each rank updates its slice of every parameter, and the slices are all-gathered after.
#include "trainer_impl.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "megadsl/runtime/squared_sum.hpp"

namespace megadsl {

// Each parameter's slice for the distributed optimizer: the dp (x cp) group's (an expert's
// replicas are the expert-data-parallel group's) rank r holds flat elements [r * chunk, (r + 1) * chunk).
std::vector<detail::trainer_impl::slice> detail::slices_of(std::vector<named_parameter>& params, const parallel_groups& g) {
  std::vector<detail::trainer_impl::slice> out;
  for (named_parameter& p : params) {
    if (!p.tensor.is_contiguous())
      throw std::logic_error("megadsl: the distributed optimizer needs contiguous parameters; " + p.name + " is not");
    const bool expert = p.plan->row->where == placement::expert && g.edp != nullptr;
    const comm_group* group = expert ? g.edp.get() : &g.gradient_dp();
    const at::Tensor flat = p.tensor.detach().view(-1);
    const std::int64_t n = flat.numel(), ranks = group->size();
    detail::trainer_impl::slice sl;
    if (ranks == 1) {
      sl.size = sl.chunk = n;
      sl.view = flat;
    } else {
      sl.group = group;
      sl.chunk = (n + ranks - 1) / ranks;
      sl.offset = std::min(n, group->rank() * sl.chunk);
      sl.size = std::min(n, sl.offset + sl.chunk) - sl.offset;
      sl.view = flat.narrow(0, sl.offset, sl.size);
    }
    out.push_back(std::move(sl));
  }
  return out;
}

namespace {

// A slice's elements padded to its chunk: what each rank contributes to an all-gather.
at::Tensor padded(const at::Tensor& t, std::int64_t chunk) {
  return t.numel() == chunk ? t : at::constant_pad_nd(t, {0, chunk - t.numel()});
}

// A piece of a parameter's slice chunk: [from, from + length) of each rank's chunk of parameter
// `param`. A parameter larger than a bucket (an embedding) travels in several pieces, so that no
// collective's buffer exceeds a bucket.
struct slice_piece {
  std::size_t param;
  std::int64_t from, length;
};

// The pieces of every slice over `group`, in parameter order, `flush`ed in buckets of at most
// `bucket_elements` in all (`bucket_elements / group size` per rank).
template <class Flush>
void in_buckets(const std::vector<detail::trainer_impl::slice>& slices, const comm_group& group,
                std::int64_t bucket_elements, Flush&& flush) {
  const std::int64_t per_rank = std::max<std::int64_t>(1, bucket_elements / group.size());
  std::vector<slice_piece> bucket;
  std::int64_t filled = 0;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].group != &group) continue;
    for (std::int64_t from = 0; from < slices[i].chunk;) {
      const std::int64_t length = std::min(slices[i].chunk - from, per_rank - filled);
      bucket.push_back({i, from, length});
      filled += length;
      from += length;
      if (filled == per_rank) {
        flush(bucket);
        bucket.clear();
        filled = 0;
      }
    }
  }
  if (!bucket.empty()) flush(bucket);
}

// The groups the slices are sharded over, each once.
std::vector<const comm_group*> slice_groups(const std::vector<detail::trainer_impl::slice>& slices) {
  std::vector<const comm_group*> groups;
  for (const auto& sl : slices)
    if (sl.group != nullptr && std::find(groups.begin(), groups.end(), sl.group) == groups.end()) groups.push_back(sl.group);
  return groups;
}

// Every parameter whole again after the distributed optimizer's step: the slices all-gathered in
// buckets, each rank's part copied into its place.
void gather_slices(std::vector<named_parameter>& params, const std::vector<detail::trainer_impl::slice>& slices,
                   std::int64_t bucket_elements) {
  for (const comm_group* group : slice_groups(slices))
    in_buckets(slices, *group, bucket_elements, [&](const std::vector<slice_piece>& bucket) {
      std::vector<at::Tensor> mine;  // this rank's part of each piece, padded to the piece's length
      for (const slice_piece& pc : bucket) {
        const auto& sl = slices[pc.param];
        const std::int64_t begin = std::min(sl.size, pc.from), count = std::min(sl.size, pc.from + pc.length) - begin;
        mine.push_back(padded(sl.view.narrow(0, begin, count), pc.length));
      }
      const at::Tensor all = group->all_gather(at::cat(mine).unsqueeze(0), 0);  // (ranks, bucket / ranks)
      std::int64_t at = 0;
      for (const slice_piece& pc : bucket) {
        const at::Tensor flat = params[pc.param].tensor.detach().view(-1);
        const std::int64_t n = flat.numel(), chunk = slices[pc.param].chunk;
        for (std::int64_t r = 0; r < group->size(); ++r) {
          const std::int64_t begin = std::min(n, r * chunk + pc.from), count = std::min(n, begin + pc.length) - begin;
          if (r != group->rank() && count > 0) flat.narrow(0, begin, count).copy_(all[r].narrow(0, at, count));
        }
        at += pc.length;
      }
    });
}

}  // namespace

// A moment of the distributed optimizer's slice, whole: gathered over the slice's group.
at::Tensor detail::whole_moment(const at::Tensor& part, const detail::trainer_impl::slice& sl, const at::Tensor& param) {
  if (sl.group == nullptr) return part.view(param.sizes()).clone();
  const at::Tensor all = sl.group->all_gather(padded(part, sl.chunk).unsqueeze(0), 0);  // (ranks, chunk)
  return all.reshape({-1}).narrow(0, 0, param.numel()).view(param.sizes()).clone();
}

void detail::trainer_impl::scatter_grads(std::int64_t bucket_elements) {
  std::vector<named_parameter>& ps = *params;
  for (std::size_t i = 0; i < slices.size(); ++i)
    if (slices[i].group == nullptr) slices[i].view.mutable_grad() = ps[i].tensor.grad().view(-1);  // no replicas
  for (const comm_group* group : slice_groups(slices))
    in_buckets(slices, *group, bucket_elements, [&](const std::vector<slice_piece>& bucket) {
      const std::int64_t ranks = group->size();
      std::int64_t total = 0;
      for (const slice_piece& pc : bucket) total += pc.length;
      // (ranks, total): row r holds its part of rank r's chunk of each piece, padded with zeros.
      at::Tensor rows = at::zeros({ranks, total}, ps[bucket.front().param].tensor.options());
      std::int64_t at = 0;
      for (const slice_piece& pc : bucket) {
        const at::Tensor g = ps[pc.param].tensor.grad().view(-1);
        const std::int64_t n = g.numel(), chunk = slices[pc.param].chunk;
        for (std::int64_t r = 0; r < ranks; ++r) {
          const std::int64_t begin = std::min(n, r * chunk + pc.from), count = std::min(n, begin + pc.length) - begin;
          if (count > 0) rows[r].narrow(0, at, count).copy_(g.narrow(0, begin, count));
        }
        at += pc.length;
      }
      const at::Tensor mine = group->reduce_scatter(rows, 0).view(-1);  // (total): this rank's sums
      at = 0;
      for (const slice_piece& pc : bucket) {
        slice& sl = slices[pc.param];
        const std::int64_t begin = std::min(sl.size, pc.from), count = std::min(sl.size, pc.from + pc.length) - begin;
        // Allocated at its first piece, when the gradients reduced before it are freed already.
        if (pc.from == 0) sl.view.mutable_grad() = at::empty({sl.size}, ps[pc.param].tensor.options());
        if (count > 0) sl.view.mutable_grad().narrow(0, begin, count).copy_(mine.narrow(0, at, count));
        // The whole gradient is not needed once its last piece is reduced.
        if (pc.from + pc.length >= sl.chunk) ps[pc.param].tensor.mutable_grad().reset();
        at += pc.length;
      }
    });
}

double detail::trainer_impl::slice_norm() {
  const std::vector<std::int64_t> counted = model.norm_elements();
  at::Tensor sq = at::zeros({1}, at::kDouble);
  bool on_device = false;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const at::Tensor& g = slices[i].view.grad();
    if (!g.defined()) continue;
    // The counted elements are a prefix [0, counted) of the flat parameter; the slice holds
    // [offset, offset + size).
    const std::int64_t begin = slices[i].offset, end = std::min(counted[i], begin + slices[i].size);
    if (end <= begin) continue;
    if (!on_device) {
      sq = sq.to(g.device());
      on_device = true;
    }
    sq += squared_sum(g.narrow(0, 0, end - begin));
  }
  groups->world->all_reduce(sq);
  return std::sqrt(sq.item<double>());
}

void detail::trainer_impl::optimizer_step() {
  if (!scatters())
    for (std::size_t i = 0; i < slices.size(); ++i) {
      const at::Tensor& g = (*params)[i].tensor.grad();
      slices[i].view.mutable_grad() = g.defined() ? g.view(-1).narrow(0, slices[i].offset, slices[i].size) : at::Tensor();
    }
  adamw->step();
  if (!slices.empty()) gather_slices(*params, slices, opt.grad_bucket_elements);
  // The reduce-scattered gradients are spent: nothing of them is kept between steps.
  if (scatters())
    for (auto& sl : slices) sl.view.mutable_grad().reset();
}

}  // namespace megadsl
