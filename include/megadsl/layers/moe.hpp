// The mixture-of-experts MLP of one rank: HF's router and the experts, with the experts of a layer
// split over the expert-parallel group and tokens dispatched to them by all-to-all (Megatron's
// alltoall dispatcher at etp = 1). Activations are token-major (T, h); nothing here knows a
// family: the families (Mixtral, Qwen2-MoE, Qwen3-MoE) differ in names, the shared expert and
// whether the top-k weights are renormalised.
//
//   const routing r = route(at::linear(x, router_weight), /*top_k=*/2, /*renormalise=*/true);
//   const at::Tensor y = moe_experts(x, r, mine, silu_activation, groups_ep);   // (T, h)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "megadsl/parallel/comm.hpp"
#include "megadsl/layers/module.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Which experts each token goes to, and with which weights: indices (T, k) int64, weights (T, k)
// fp32 (HF keeps routing weights in fp32 until they scale the experts' outputs).
// With on_input (Llama 4) each weight scales the token before its expert, not the expert's output.
struct routing {
  at::Tensor indices;
  at::Tensor weights;
  bool on_input = false;
};

// HF's router (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock): softmax
// over every expert in fp32, the top k, and with `renormalise` (Mixtral always; Qwen's
// norm_topk_prob) the k weights divided by max(their sum, floor). logits: (T, E).
routing route(const at::Tensor& logits, std::int64_t top_k, bool renormalise, double floor = 0);
// That router's weights for given experts (router replay): the softmax's, renormalised alike.
at::Tensor softmax_weights(const at::Tensor& logits, const at::Tensor& indices, bool renormalise, double floor = 0);

// ERNIE 4.5's router (Ernie4_5_MoeTopKRouter): softmax over every expert in fp32, the experts
// chosen by probabilities + bias (the bias selects, never weighs), their probabilities divided by
// max(sum, floor) (moe_norm_min). logits: (T, E) fp32; bias: (E) fp32.
routing route_softmax_biased(const at::Tensor& logits, const at::Tensor& bias, std::int64_t top_k, double floor);

// DeepSeek-V3's router (DeepseekV3TopkRouter; GLM-4.5's Glm4MoeTopkRouter): scores sigmoid(logits)
// in fp32; the experts chosen by scores + bias (the bias selects, never weighs) among the
// group_top_k best of `groups` equal groups, a group scored by the sum of its two best biased
// scores; the weights the chosen scores, divided by their sum + 1e-20 with `renormalise`, times
// `scale`, kept in fp32. logits: (T, E) fp32; bias: (E) fp32.
routing route_sigmoid_grouped(const at::Tensor& logits, const at::Tensor& bias, std::int64_t top_k, std::int64_t groups,
                              std::int64_t group_top_k, bool renormalise, double scale);
// That router's weights for given experts (router replay): the same scores, renormalisation, scale.
at::Tensor sigmoid_weights(const at::Tensor& logits, const at::Tensor& indices, bool renormalise, double scale);

// Llama 4's router (Llama4Router): the top k of the logits as they are (in their dtype), each
// chosen expert fed the token times sigmoid(logit) (fp32, cast to the token's dtype where it
// scales it): on_input. Replayed experts take sigmoid_weights(logits, indices, false, 1).
routing route_sigmoid_on_input(const at::Tensor& logits, std::int64_t top_k);

// A router's expert bias and the tokens its experts received in this step's training forwards:
// the aux-loss-free balancing of DeepSeek-V3 (Megatron's moe_router_enable_expert_bias). Each
// mixture with a bias registers one with its stage (layer_plan_args::expert_loads).
struct expert_load {
  at::Tensor bias;    // (E) fp32: the parameter, moved in place by the update, never by a gradient
  at::Tensor tokens;  // (E) fp64: real tokens routed to each expert (a token counts once per expert)
};
// Megatron's get_updated_expert_bias on counts already summed over the replicas that saw other
// tokens (dp and cp): bias += rate * sign(mean(tokens) - tokens), then the counts restart at 0.
void update_expert_bias(expert_load& e, const at::Tensor& tokens, double rate);

// A mixture's router as its module (a router slot's node, blocks/routers.hpp; the mixture module's
// child 0): its logits over the whole stream, its routing, the weights of given experts (router
// replay) and the probabilities its load-balancing loss weighs. The base holds what every router
// has: its weight (E, h) and the bias on its logits (E, if any), replicated, their gradients
// partial over tp; its expert bias (E, if any) with its load counts, registered for the balancing
// update; and the shape's routing numbers (experts, top_k, norm_topk). Each router's module is its
// own file and reads its own config keys (block_build::setting).
class router_module : public block_module {
 public:
  explicit router_module(const block_build& b);
  // (T, E) of the whole stream x (T, h): in fp32 where the router's knobs say (x and the weight
  // cast, as HF does; DeepSeek's, HunYuan's wg, ERNIE's gate), else in the compute dtype.
  [[nodiscard]] virtual at::Tensor logits(const at::Tensor& x, const layer_context& c) const;
  // The experts of each token and their weights, (T, k) each.
  [[nodiscard]] virtual routing route(const at::Tensor& logits) const = 0;
  // The weights the router gives the experts `indices` (T, k) (router replay), as route would.
  [[nodiscard]] virtual at::Tensor weights_of(const at::Tensor& logits, const at::Tensor& indices) const = 0;
  // The probabilities Megatron's load-balancing loss weighs (T, E) fp32.
  [[nodiscard]] virtual at::Tensor balance_probs(const at::Tensor& logits) const = 0;
  // Its expert bias and this step's counts (null: it has none).
  [[nodiscard]] expert_load* load() { return load_.bias.defined() ? &load_ : nullptr; }

 protected:
  at::Tensor weight_;  // (E, h)
  at::Tensor bias_;    // (E) or undefined
  bool fp32_ = false;
  expert_load load_;   // (bias undefined: none)
  std::int64_t experts_ = 0, top_k_ = 0;
  bool norm_topk_ = false;
};

// The experts this rank holds: experts [first, first + gate_up.size()) of the layer's `experts`,
// which must be ep_rank * experts / ep onward (checked). Under etp = tp each is this tp rank's
// shard (f = expert_ffn / tp) and the output is a partial sum over tp.
struct local_experts {
  std::int64_t experts = 0;          // in the layer (every rank of the ep group holds experts / ep)
  std::int64_t first = 0;            // ep_rank * experts / ep
  std::vector<at::Tensor> gate_up;   // experts / ep of (2 f, h): per expert [gate; up] rows
  std::vector<at::Tensor> down;      // experts / ep of (h, f)
  // gpt-oss's: each expert's biases (empty: none) and its GLU on the [gate; up] output (empty:
  // act(gate) * up). down_bias is added to the expert's output before its routing weight scales it.
  std::vector<at::Tensor> gate_up_bias;  // experts / ep of (2 f)
  std::vector<at::Tensor> down_bias;     // experts / ep of (h)
  std::function<at::Tensor(const at::Tensor&)> glu;
  bool invariant = false;  // the experts' GEMMs in fixed row tiles (layers/invariant.hpp)
  // > 0 (invariant arithmetic): each expert's down projection by this many chunks of its local
  // intermediate size, summed in invariant_chunk_sum's tree with the other tp ranks' chunks
  // (`chunk_group`, null at tp 1) before the combine: the output is then whole on every tp rank.
  std::int64_t chunks = 0;
  const comm_group* chunk_group = nullptr;
  // LoRA adapters on the experts (layers/lora_linear.hpp), empty: none: y (n, out) of local expert
  // j's gate_up (down: false) or down projection (true) on x, plus its adapter's update.
  std::function<at::Tensor(std::size_t j, bool down, const at::Tensor& x, const at::Tensor& y)> adapt;
};

// sum_j weights[t, j] * expert_{indices[t, j]}(x_t) for every token t of x (T, h) (with
// r.on_input: sum_j expert_{indices[t, j]}(weights[t, j] * x_t)). The (token,
// slot) assignments are sorted by expert, sent to the ranks that hold their experts (all_to_all
// over `ep`; nullptr or a group of one: every expert is here), run through each expert's gated MLP,
// sent back and summed per token. Differentiable in x, in the routing weights and in the experts'
// weights; the expert-parallel backward is the same all-to-all with the counts swapped.
at::Tensor moe_experts(const at::Tensor& x, const routing& r, const local_experts& e, activation_fn act,
                       const comm_group* ep);

// Megatron's auxiliary losses of a router, over the tokens whose `valid` (T) is 1. probs: the
// router's softmax over every expert (T, E) fp32; indices: the experts each token went to (T, k).
//   switch_load_balancing_loss  E / (k T^2) * sum_e P_e f_e, P_e = sum_t probs[t, e], f_e = tokens
//                               routed to e (switch_load_balancing_loss_func)
//   sequence_load_balancing_loss  the same per sequence (`sequence` (T) its index in [0, sequences)),
//                               mean over sequences (sequence_load_balancing_loss_func)
//   router_z_loss               mean_t logsumexp(logits[t])^2 (z_loss_func)
at::Tensor switch_load_balancing_loss(const at::Tensor& probs, const at::Tensor& indices, const at::Tensor& valid);
at::Tensor sequence_load_balancing_loss(const at::Tensor& probs, const at::Tensor& indices, const at::Tensor& valid,
                                        const at::Tensor& sequence, std::int64_t sequences);
at::Tensor router_z_loss(const at::Tensor& logits, const at::Tensor& valid);
// The sigmoid router's probabilities for the load-balancing loss (Megatron's
// compute_routing_scores_for_aux_loss): sigmoid(logits) normalised over the experts (+ 1e-20).
at::Tensor sigmoid_balance_probs(const at::Tensor& logits);

// `y` unchanged; in the backward, `loss` (a scalar) receives gradient 1 as if it had been added
// to the objective (Megatron's MoEAuxLossAutoScaler): an auxiliary loss rides on the activations.
at::Tensor attach_loss(const at::Tensor& y, const at::Tensor& loss);

}  // namespace megadsl
