// LoRA adapters beside their base linears (layers/lora_linear.hpp).
#include "megadsl/layers/lora_linear.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

#include "megadsl/layers/module.hpp"

namespace megadsl {

void lora_set::add(const at::Tensor& base, std::int64_t layer, lora_shard adapter) {
  entry& e = by_base_[base.unsafeGetTensorImpl()];
  e.layer = layer;
  e.adapters.push_back(std::move(adapter));
  ++count_;
}

const std::vector<lora_shard>* lora_set::use(const at::Tensor& base) const {
  if (by_base_.empty() || !base.defined()) return nullptr;
  const auto it = by_base_.find(base.unsafeGetTensorImpl());
  if (it == by_base_.end()) return nullptr;
  it->second.applied = true;
  return &it->second.adapters;
}

bool lora_set::adapts(const at::Tensor& base) const {
  return base.defined() && by_base_.contains(base.unsafeGetTensorImpl());
}

void lora_set::add_whole(std::string module, at::Tensor a, at::Tensor b, double scaling) {
  whole_[std::move(module)] = {std::move(a), std::move(b), scaling};
}

at::Tensor lora_set::merged(std::string_view hf_name, const at::Tensor& w) const {
  if (!hf_name.ends_with(".weight")) return w;
  const auto it = whole_.find(std::string(hf_name.substr(0, hf_name.size() - 7)));
  if (it == whole_.end()) return w;
  const whole_adapter& x = it->second;
  return w.to(at::kFloat) + at::matmul(x.b.to(w.device(), at::kFloat), x.a.to(w.device(), at::kFloat)) * x.scaling;
}

void lora_set::check_applied(std::int64_t layer) const {
  if (by_base_.empty() || checked_[layer]) return;
  for (const auto& [base, e] : by_base_)
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
