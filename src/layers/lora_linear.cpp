// LoRA adapters beside their base linears (layers/lora_linear.hpp).
#include "megadsl/layers/lora_linear.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

#include "megadsl/layers/module.hpp"
#include "megadsl/parallel/comm.hpp"

namespace megadsl {

void lora_set::add(const at::Tensor& base, std::int64_t layer, lora_shard adapter) {
  const auto [it, fresh] = by_base_.try_emplace(base.unsafeGetTensorImpl(), entries_.size());
  if (fresh) entries_.emplace_back();
  entry& e = entries_[it->second];
  e.layer = layer;
  e.adapters.push_back(std::move(adapter));
  ++count_;
}

const std::vector<lora_shard>* lora_set::use(const at::Tensor& base) const {
  if (!enabled_ || by_base_.empty() || !base.defined()) return nullptr;
  const auto it = by_base_.find(base.unsafeGetTensorImpl());
  if (it == by_base_.end()) return nullptr;
  const entry& e = entries_[it->second];
  e.applied = true;
  return &e.adapters;
}

std::vector<lora_shard>* lora_set::adapters_of(const at::Tensor& base) {
  if (!base.defined()) return nullptr;
  const auto it = by_base_.find(base.unsafeGetTensorImpl());
  return it == by_base_.end() ? nullptr : &entries_[it->second].adapters;
}

void lora_set::gather_whole(const comm_group* tp) const {
  // Every module's A and B in one flat buffer, this rank's main pieces written and the rest 0,
  // summed over tp in one collective; a base whole on every tp rank is written by each alike and
  // not summed.
  struct spot {
    const lora_shard* a;
    std::int64_t at;
  };
  std::vector<spot> spots;
  std::int64_t total = 0;
  const std::int64_t r = settings_.rank.get();
  for (const entry& e : entries_)
    for (const lora_shard& a : e.adapters) {
      spots.push_back({&a, total});
      total += r * (a.in + a.out);
    }
  if (spots.empty()) return;
  const at::Tensor flat = at::zeros({total}, spots.front().a->whole.options().dtype(at::kFloat));
  at::Tensor split_sum = at::zeros({total}, flat.options().dtype(at::kBool));  // elements summed over tp
  for (const spot& s : spots) {
    const lora_shard& a = *s.a;
    at::Tensor A = flat.narrow(0, s.at, r * a.in).view({r, a.in});
    at::Tensor B = flat.narrow(0, s.at + r * a.in, a.out * r).view({a.out, r});
    at::Tensor sharded = a.along_output ? B : A;
    const at::Tensor held = (a.along_output ? A : B);
    const bool sum = a.base_split && tp != nullptr && tp->size() > 1;
    // The whole matrix is the same on every tp rank: tp rank 0's alone when summing.
    if (!sum || tp->rank() == 0) held.copy_(a.whole.detach());
    for (const lora_shard::piece& p : a.pieces)
      if (!sum || p.main) sharded.narrow(a.along_output ? 0 : 1, p.global_offset, p.extent).copy_(p.part.detach());
    if (sum) split_sum.narrow(0, s.at, r * (a.in + a.out)).fill_(true);
  }
  if (tp != nullptr && tp->size() > 1) {
    at::Tensor summed = flat.clone();
    tp->all_reduce(summed);
    flat.copy_(at::where(split_sum, summed, flat));
  }
  for (const spot& s : spots) {
    const lora_shard& a = *s.a;
    whole_[a.module] = {flat.narrow(0, s.at, r * a.in).view({r, a.in}).clone(),
                        flat.narrow(0, s.at + r * a.in, a.out * r).view({a.out, r}).clone(), a.scaling};
  }
}

std::vector<at::Tensor> lora_set::tensors() const {
  std::vector<at::Tensor> out;
  for (const entry& e : entries_)
    for (const lora_shard& a : e.adapters) {
      out.push_back(a.whole);
      for (const lora_shard::piece& p : a.pieces) out.push_back(p.part);
    }
  return out;
}

std::shared_ptr<lora_set> lora_set::with_tensors(const std::vector<at::Tensor>& values) const {
  auto out = std::make_shared<lora_set>(*this);
  std::size_t i = 0;
  const auto next = [&](const at::Tensor& like) {
    if (i >= values.size() || !values[i].sizes().equals(like.sizes()))
      throw std::invalid_argument("megadsl: LoRA: " + std::to_string(values.size()) +
                                  " tensors do not match the adapters' shapes (at tensor " + std::to_string(i) + ")");
    return values[i++];
  };
  for (entry& e : out->entries_)
    for (lora_shard& a : e.adapters) {
      a.whole = next(a.whole);
      for (lora_shard::piece& p : a.pieces) p.part = next(p.part);
    }
  if (i != values.size())
    throw std::invalid_argument("megadsl: LoRA: " + std::to_string(values.size()) + " tensors for " + std::to_string(i) +
                                " adapter tensors");
  out->whole_.clear();
  return out;
}

std::pair<at::Tensor, at::Tensor> lora_set::whole(const std::string& module) const {
  const auto it = whole_.find(module);
  if (it == whole_.end()) return {};
  return {it->second.a, it->second.b};
}

bool lora_set::adapts(const at::Tensor& base) const {
  return base.defined() && by_base_.contains(base.unsafeGetTensorImpl());
}

at::Tensor lora_set::merged(std::string_view hf_name, const at::Tensor& w) const {
  if (!hf_name.ends_with(".weight")) return w;
  const auto it = whole_.find(std::string(hf_name.substr(0, hf_name.size() - 7)));
  if (it == whole_.end()) return w;
  const whole_adapter& x = it->second;
  return w.to(at::kFloat) + at::matmul(x.b.to(w.device(), at::kFloat), x.a.to(w.device(), at::kFloat)) * x.scaling;
}

void lora_set::check_applied(std::int64_t layer) const {
  if (!enabled_ || by_base_.empty() || checked_[layer]) return;
  for (const entry& e : entries_)
    if (e.layer == layer && !e.applied)
      throw std::logic_error("megadsl: the LoRA adapter on " + e.adapters.front().module +
                             " was not applied: its block reads that weight without the layer context's linears; "
                             "adapters on this block are not supported yet (leave the module out of target_modules)");
  checked_[layer] = true;
}

at::Tensor with_lora(const at::Tensor& y, const at::Tensor& x, const std::vector<lora_shard>& adapters, const layer_context& c) {
  at::Tensor out = y;
  const std::int64_t n = y.size(-1);
  for (const lora_shard& a : adapters) {
    if (a.along_output) {
      // (rows, r) once, then each piece's output columns: (rows, extent) padded into (rows, n).
      // PEFT's order: lora_B(lora_A(x)) * scaling.
      const at::Tensor down = at::linear(x, c.w(a.whole));
      for (const lora_shard::piece& p : a.pieces)
        out = out + at::constant_pad_nd(at::linear(down, c.w(p.part)) * a.scaling, {p.local_offset, n - p.local_offset - p.extent});
    } else {
      // The pieces' partial products over this rank's input columns, summed: (rows, r); then B.
      at::Tensor down;
      for (const lora_shard::piece& p : a.pieces) {
        const at::Tensor part = at::linear(x.narrow(-1, p.local_offset, p.extent), c.w(p.part));
        down = down.defined() ? down + part : part;
      }
      if (down.defined()) out = out + at::linear(down, c.w(a.whole)) * a.scaling;
    }
  }
  return out;
}

}  // namespace megadsl
