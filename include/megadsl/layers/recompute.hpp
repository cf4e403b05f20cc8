// Activation recompute (Megatron's recompute_granularity): a region runs under no-grad in the
// forward, keeping only its inputs; the backward runs it again with autograd on and differentiates
// through that second run. The region must compute the same numbers twice (no dropout here).
//   selective: the token mixer's core (RoPE and the attention kernel; the gated DeltaNet's chunked
//              rule), free of parameters and collectives: differentiated in its inputs only;
//   full:      a whole decoder layer, with its parameters and collectives (every rank of a group
//              recomputes the same layer at the same point of the backward, so the collectives
//              meet): the rerun is back-propagated, which also accumulates the parameters' .grad.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace megadsl {

class activation_offload;  // layers/activation_offload.hpp

// The attention core: (q, k, v) -> the heads' output, shapes as attention_varlen/padded take them.
using attention_core = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

// A core of any inputs (the gated delta rule's q, k, v, g, beta) -> its output.
using core_region = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// f(inputs) with its intermediates dropped: the result is differentiable in every input (each a
// floating tensor), and the backward calls f once more. Without grad mode it is simply f(inputs).
at::Tensor recompute_in_backward(core_region f, const std::vector<at::Tensor>& inputs);
// The attention core's form: f(q, k, v).
at::Tensor recompute_in_backward(attention_core f, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// A decoder layer: (x) -> the layer's output. Called with grad mode off for the forward and on for
// the rerun (GradMode::is_enabled() tells a rerun, for side effects that must happen once).
using layer_region = std::function<at::Tensor(const at::Tensor& x)>;

// f(x) keeping only x: the backward reruns f and back-propagates through it (parameters' .grad
// accumulate as in a plain backward), then passes x's gradient on. Without grad mode it is f(x).
// With `offload`, x waits for the backward in host memory as `offload`'s slot `slot`
// (layers/activation_offload.hpp).
at::Tensor recompute_layer(layer_region f, const at::Tensor& x, std::shared_ptr<activation_offload> offload = nullptr,
                           std::int64_t slot = 0);

// Regions run again by backward passes in this process so far (both kinds): what a test reads to
// know that a layout's recompute is not silently skipped.
std::int64_t recompute_reruns();

}  // namespace megadsl
