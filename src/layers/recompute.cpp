#include "megadsl/layers/recompute.hpp"

#include "megadsl/layers/activation_offload.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <utility>

namespace megadsl {
namespace {

std::atomic<std::int64_t> reruns{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The region travels with the autograd node as an opaque capsule.
struct region : torch::CustomClassHolder {
  explicit region(core_region f) : run(std::move(f)) {}
  core_region run;
};

struct recompute_fn : torch::autograd::Function<recompute_fn> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, const c10::intrusive_ptr<region>& f) {
    ctx->save_for_backward(inputs.vec());  // the region's inputs: what is kept instead of its insides
    ctx->saved_data["region"] = c10::IValue::make_capsule(f);
    return f->run(inputs.vec());  // grad mode is off inside a custom function's forward
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const auto f = c10::static_intrusive_pointer_cast<region>(ctx->saved_data["region"].toCapsule());
    const at::AutoGradMode on(true);
    ++reruns;
    variable_list inputs;
    for (const at::Tensor& t : saved) inputs.push_back(t.detach().requires_grad_(true));
    const at::Tensor out = f->run(inputs);
    variable_list d = torch::autograd::grad({out}, inputs, {grads[0]}, /*retain_graph=*/std::nullopt,
                                            /*create_graph=*/false, /*allow_unused=*/true);
    d.emplace_back();  // the region itself
    return d;
  }
};

struct layer_holder : torch::CustomClassHolder {
  layer_holder(layer_region f, std::shared_ptr<activation_offload> o, std::int64_t s)
      : run(std::move(f)), offload(std::move(o)), slot(s) {}
  layer_region run;
  std::shared_ptr<activation_offload> offload;  // where x waits, or null: saved as it is
  std::int64_t slot;
};

struct recompute_layer_fn : torch::autograd::Function<recompute_layer_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const c10::intrusive_ptr<layer_holder>& f) {
    if (f->offload) f->offload->store(f->slot, x);
    else ctx->save_for_backward({x});
    ctx->saved_data["layer"] = c10::IValue::make_capsule(f);
    return f->run(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto f = c10::static_intrusive_pointer_cast<layer_holder>(ctx->saved_data["layer"].toCapsule());
    const at::Tensor x =
        (f->offload ? f->offload->load(f->slot) : ctx->get_saved_variables()[0].detach()).requires_grad_(true);
    const at::AutoGradMode on(true);
    ++reruns;
    const at::Tensor out = f->run(x);
    // A backward inside the backward (the engine runs it re-entrantly): the leaves it reaches are
    // x and this layer's parameters, whose .grad it accumulates.
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), {}};
  }
};

}  // namespace

std::int64_t recompute_reruns() { return reruns.load(); }

at::Tensor recompute_layer(layer_region f, const at::Tensor& x, std::shared_ptr<activation_offload> offload,
                           std::int64_t slot) {
  if (!at::GradMode::is_enabled()) return f(x);
  // An input outside the graph (a frozen embedding) still feeds parameters that learn: as a leaf
  // of its own, it gives the layer's output a backward, hence the rerun.
  const at::Tensor input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return recompute_layer_fn::apply(input, c10::make_intrusive<layer_holder>(std::move(f), std::move(offload), slot));
}

at::Tensor recompute_in_backward(core_region f, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return f(inputs);
  return recompute_fn::apply(at::TensorList(inputs), c10::make_intrusive<region>(std::move(f)));
}

at::Tensor recompute_in_backward(attention_core f, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return recompute_in_backward(
      core_region([f = std::move(f)](const std::vector<at::Tensor>& x) { return f(x[0], x[1], x[2]); }), {q, k, v});
}

}  // namespace megadsl
