// The layer context's linears and mappings, and module_params' lookup: shared by every block.
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/layers/module.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/packing.hpp"

namespace megadsl {

at::Tensor module_params::find(std::string_view local_name) const {
  const auto it = tensors_.find(local_name);
  return it == tensors_.end() ? at::Tensor() : it->second;
}

at::Tensor module_params::require(std::string_view local_name) const {
  at::Tensor t = find(local_name);
  if (!t.defined())
    throw std::logic_error("megadsl: layer " + std::to_string(layer) + " has no parameter \"" + std::string(local_name) +
                           "\" that its block binds; the block's parameter rows and its module disagree");
  return t;
}

at::Tensor layer_context::w(const at::Tensor& p) const {
  return p.defined() && p.scalar_type() != compute ? p.to(compute) : p;
}

at::Tensor layer_context::to_tp(const at::Tensor& x) const {
  if (tp == nullptr) return x;
  return sp ? gather_from_sp(x, *tp) : copy_to_tp(x, *tp);
}

at::Tensor layer_context::from_tp(const at::Tensor& y) const {
  if (tp == nullptr) return y;
  return sp ? reduce_scatter_to_sp(y, *tp) : reduce_from_tp(y, *tp);
}

at::Tensor layer_context::linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const {
  const at::Tensor y = linear_in(l.invariant.get(), x, w(weight), w(bias));
  const std::vector<lora_shard>* adapters = lora != nullptr ? lora->use(weight) : nullptr;
  return adapters != nullptr ? with_lora(y, x, *adapters, *this) : y;
}

at::Tensor layer_context::column(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const {
  return linear(to_tp(x), weight, bias);
}

at::Tensor layer_context::row(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const {
  const std::vector<lora_shard>* adapters = lora != nullptr ? lora->use(weight) : nullptr;
  if (adapters != nullptr && l.invariant.get())
    throw std::logic_error("megadsl: LoRA adapters with invariant arithmetic are refused where they are loaded");
  // The adapters' low-rank partial sums join the base's before its reduction over tp.
  const at::Tensor y = l.invariant.get() ? invariant_row_linear(x, w(weight), tp, sp)
                                         : from_tp(adapters != nullptr ? with_lora(at::linear(x, w(weight)), x, *adapters, *this)
                                                                       : at::linear(x, w(weight)));
  return bias.defined() ? y + w(bias) : y;
}

std::int64_t layer_context::tokens() const { return pk.tokens; }

}  // namespace megadsl
