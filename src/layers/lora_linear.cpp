// LoRA adapters beside their base linears (layers/lora_linear.hpp).
#include "megadsl/layers/lora_linear.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "megadsl/layers/dropout.hpp"
#include "megadsl/layers/module.hpp"
#include "megadsl/parallel/comm.hpp"

namespace megadsl {

void lora_set::add(const at::Tensor& base, std::int64_t layer, lora_shard adapter) {
  const auto [it, fresh] = by_base_.try_emplace(base.unsafeGetTensorImpl(), entries_.size());
  if (fresh) entries_.emplace_back();
  entry& e = entries_[it->second];
  e.layer = layer;
  // Every expert's HF tensors (other ep ranks' too: a merge may write theirs once gathered).
  for (const lora_shard::hf_part& h : adapter.hf_parts)
    for (std::int64_t x = 0; x < adapter.experts; ++x) {
      std::string name = h.name;
      if (const std::size_t at = name.find("{expert}"); at != std::string::npos) name.replace(at, 8, std::to_string(x));
      expert_parts_[name] = {adapter.module, x, h.offset, h.rows};
    }
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

void lora_set::gather_whole(const comm_group* tp, const comm_group* ep) const {
  // Every module's A and B in one flat buffer, this rank's main pieces written and the rest 0,
  // summed over tp in one collective; a base whole on every tp rank is written by each alike and
  // not summed. A mixture's experts: each module's stack holds every expert, this rank's written
  // and the other ep ranks' 0, then summed over ep.
  struct spot {
    std::int64_t at = 0, experts = 0;
    std::int64_t in = 0, out = 0;
    double scaling = 1.0;
  };
  std::unordered_map<std::string, spot> spots;
  std::vector<std::string> order;  // (the same on every rank of a stage)
  std::int64_t total = 0;
  const std::int64_t r = settings_.rank.get();
  at::TensorOptions options;
  for (const entry& e : entries_)
    for (const lora_shard& a : e.adapters) {
      options = a.whole.options().dtype(at::kFloat);
      if (spots.contains(a.module)) continue;
      const std::int64_t stacked = r * std::max<std::int64_t>(1, a.experts);
      spots[a.module] = {total, a.experts, a.in, a.out, a.scaling};
      order.push_back(a.module);
      total += stacked * (a.in + a.out);
    }
  if (order.empty()) return;
  const at::Tensor flat = at::zeros({total}, options);
  at::Tensor tp_sum = at::zeros({total}, flat.options().dtype(at::kBool));  // elements summed over tp
  at::Tensor ep_sum = at::zeros({total}, flat.options().dtype(at::kBool));  // over ep (the experts')
  for (const entry& e : entries_)
    for (const lora_shard& a : e.adapters) {
      const spot& s = spots.at(a.module);
      const std::int64_t E = std::max<std::int64_t>(1, s.experts);
      // This shard's expert's A (r, in) and B (out, r) in PEFT's stacks (a linear: the whole).
      at::Tensor A = flat.narrow(0, s.at, E * r * a.in).view({E, r, a.in}).select(0, std::max<std::int64_t>(0, a.expert));
      at::Tensor B = flat.narrow(0, s.at + E * r * a.in, a.out * r * E).view({a.out, r, E}).select(2, std::max<std::int64_t>(0, a.expert));
      at::Tensor sharded = a.along_output ? B : A;
      const at::Tensor held = a.along_output ? A : B;
      const bool sum = a.base_split && tp != nullptr && tp->size() > 1;
      // The whole matrix is the same on every tp rank: tp rank 0's alone when summing.
      if (!sum || tp->rank() == 0) held.copy_(a.whole.detach());
      for (const lora_shard::piece& p : a.pieces)
        if (!sum || p.main) sharded.narrow(a.along_output ? 0 : 1, p.global_offset, p.extent).copy_(p.part.detach());
      if (sum) tp_sum.narrow(0, s.at, E * r * (a.in + a.out)).fill_(true);
      if (a.experts > 0) ep_sum.narrow(0, s.at, E * r * (a.in + a.out)).fill_(true);
    }
  const auto sum_over = [&](const comm_group* group, const at::Tensor& mask) {
    if (group == nullptr || group->size() == 1) return;
    at::Tensor summed = at::where(mask, flat, at::zeros_like(flat));
    group->all_reduce(summed);
    flat.copy_(at::where(mask, summed, flat));
  };
  sum_over(tp, tp_sum);
  sum_over(ep, ep_sum);
  for (const std::string& module : order) {
    const spot& s = spots.at(module);
    const std::int64_t stacked = r * std::max<std::int64_t>(1, s.experts);
    whole_[module] = {flat.narrow(0, s.at, stacked * s.in).view({stacked, s.in}).clone(),
                      flat.narrow(0, s.at + stacked * s.in, s.out * stacked).view({s.out, stacked}).clone(), s.scaling,
                      s.experts};
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
  if (const auto part = expert_parts_.find(std::string(hf_name)); part != expert_parts_.end()) {
    // An expert's HF tensor: its rows of expert e's update s B_e A_e.
    const expert_part& p = part->second;
    const auto it = whole_.find(p.module);
    if (it == whole_.end()) return w;
    const whole_adapter& x = it->second;
    const std::int64_t r = settings_.rank.get();
    const at::Tensor a = x.a.view({x.experts, r, x.a.size(1)}).select(0, p.expert);                  // (r, in)
    const at::Tensor b = x.b.view({x.b.size(0), r, x.experts}).select(2, p.expert).narrow(0, p.offset, p.rows);  // (rows, r)
    return w.to(at::kFloat) + at::matmul(b.to(w.device(), at::kFloat), a.to(w.device(), at::kFloat)) * x.scaling;
  }
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
      const at::Tensor down = at::linear(lora_input_dropout(x, c, a.module, a.dropout, 0), c.w(a.whole));
      for (const lora_shard::piece& p : a.pieces)
        out = out + at::constant_pad_nd(at::linear(down, c.w(p.part)) * a.scaling, {p.local_offset, n - p.local_offset - p.extent});
    } else {
      // The pieces' partial products over this rank's input columns, summed: (rows, r); then B.
      at::Tensor down;
      for (const lora_shard::piece& p : a.pieces) {
        const at::Tensor in = lora_input_dropout(x.narrow(-1, p.local_offset, p.extent), c, a.module, a.dropout, p.global_offset);
        const at::Tensor part = at::linear(in, c.w(p.part));
        down = down.defined() ? down + part : part;
      }
      if (down.defined()) out = out + at::linear(down, c.w(a.whole)) * a.scaling;
    }
  }
  return out;
}

}  // namespace megadsl
