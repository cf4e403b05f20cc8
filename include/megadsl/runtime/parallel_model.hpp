// The running model: an actor (`causal_lm<...>`) or a critic (`value_model<...>`) type becomes
// this rank's shards, and runs forward and backward over the layout's process groups.
//
//   megadsl::parallel_groups groups = megadsl::parallel_groups::build(dist, actor::layout);
//   megadsl::parallel_model<actor> model(groups);
//   auto out = model.forward({.input_ids = ids, .attention_mask = mask});   // out.log_probs (b, s)
//
// One runtime for every family: the composition's blocks become each layer's modules
// (layers/layer_plan.hpp). The stage lives in two explicit instantiations (src/runtime/decoder_stage.cpp):
// with tensor parallelism, and without it. A static tp of 1 selects the second, which contains no
// tensor-parallel collective (DESIGN §10); at cp = 1 it issues none at all (context parallelism's
// are the attention's all-to-alls and the outputs' gather). The pipeline schedule and the
// transfers between stages are the executor's (runtime/pipeline_executor.hpp), not the model's.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "megadsl/dropout.hpp"
#include "megadsl/model.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/runtime/offload.hpp"
#include "megadsl/shard_plan.hpp"
#include "megadsl/sliding_window.hpp"

namespace megadsl {

class lora_set;  // layers/lora_linear.hpp

struct model_options {
  std::uint64_t seed = 1234;         // TP-invariant init: full tensors from the seed, then sliced
  double init_std = 0.02;            // normal(0, init_std) for projections and embeddings
  bool test_init = false;            // also random norm weights and biases (stronger tests)
  // The parameters' dtype: what the optimizer updates and gradients accumulate in (Megatron's
  // main params and main grads). fp32 by default.
  at::ScalarType dtype = at::kFloat;
  // The dtype the layers compute in; nullopt = `dtype`. bf16 over fp32 parameters is Megatron's
  // mixed precision: weights are cast at use, the cast's backward accumulates fp32 gradients,
  // norms, softmax and the log-prob/entropy math stay in fp32.
  std::optional<at::ScalarType> compute_dtype;
  // Where the parameters and activations live. CUDA tensors use NCCL groups, CPU tensors Gloo.
  at::Device device = at::kCPU;
  // The checkpoint's sliding attention window and its layers (hf_config::attention_window),
  // applied in the padded and the remove-padding path. load_hf refuses a model whose window
  // differs from its config.json's.
  sliding_window attention_window;
  // Dropout in training steps (forward_backward; never in forward(): log-probs, values and
  // inference run without), at the checkpoint's rates (hf_config::dropout), with masks the same in
  // every layout (layers/dropout.hpp). load_hf refuses a model whose rates differ from its
  // config.json's unless `dropout_chosen`.
  dropout_rates dropout;
  // The caller chose `dropout` (all 0: train without, as RL recipes usually do): load_hf then takes
  // a config.json with other rates.
  bool dropout_chosen = false;
  // LibTorch's deterministic algorithms (process-wide), and cuBLAS's fixed workspace on CUDA.
  // Where a kernel has no deterministic version (the flash attention backward on CUDA) LibTorch
  // warns and runs it anyway.
  bool deterministic = false;
  // The LM head's logits and log-softmax this many tokens at a time, in training too (forward and
  // backward, the head's GEMM recomputed in the backward), so a micro-batch's (tokens x vocab / tp)
  // logits are never whole. 0: chunks of 2^25 logits where a micro-batch has more than 2^28
  // (1 GiB in fp32); -1: training never chunks (inference always does). return_logits computes
  // them whole. forward_options::head_chunk_tokens overrides it for one call.
  std::int64_t head_chunk_tokens = 0;
  // verl's enable_activation_offload: with layout recompute full, the input each layer keeps for
  // its rerun waits in pinned host memory, copied there and prefetched back one layer ahead on a
  // side stream (layers/activation_offload.hpp). The numbers are unchanged. Refused without full
  // recompute (then a layer keeps all its activations, and those are not offloaded).
  bool offload_activations = false;
  // A mixture of experts' auxiliary losses in training (forward_backward), Megatron's: the switch
  // load-balancing loss over each micro-batch's tokens (or per sequence) and the router z-loss,
  // each times its coefficient, averaged over micro-batches and dp ranks, and added through the
  // backward (the loss callback does not see them; parallel_model::moe_aux_loss() reports them).
  double moe_aux_loss_coeff = 0.0;         // Megatron's moe_aux_loss_coeff (HF's router_aux_loss_coef)
  bool moe_aux_loss_per_sequence = false;  // Megatron's seq_aux_loss
  double moe_z_loss_coeff = 0.0;
  // A router with an expert bias (DeepSeek-V3's e_score_correction_bias: it selects experts, never
  // weighs them, and no gradient moves it): the aux-loss-free balancing of Megatron's
  // moe_router_enable_expert_bias. finalize_grads sums the step's tokens per expert over dp and cp
  // and moves each bias by rate * sign(mean - load) (Megatron's moe_router_bias_update_rate,
  // 1e-3); 0: the bias stays as loaded.
  double moe_expert_bias_update_rate = 1e-3;
  // Before the first collective of forward / forward_backward (and a trainer's step), the ranks
  // check that they were given the same batch: its shapes always, its values too with this on
  // (a 64-bit hash of the bytes; ranks that disagree end together, naming the ranks).
  bool batch_checksum = true;

  [[nodiscard]] at::ScalarType compute() const { return compute_dtype.value_or(dtype); }
};

struct batch {
  at::Tensor input_ids;       // (b, s) int64
  at::Tensor attention_mask;  // (b, s) 1 = token, 0 = padding (left or right)
  at::Tensor labels;          // optional (b, s): log p(labels[t] | tokens <= t); default: next token
  // Router replay (a mixture of experts): optional (b, s, layers, top_k) int64, the experts each
  // token goes to in each layer, as a recorded forward returned them (`routed_experts`) or a
  // rollout engine reported them. The router's weights for them still come from the live router
  // (so it keeps learning); a position holding -1 (padding) is routed live.
  at::Tensor routed_experts;
  // Optional (b,) float: each row's sampling temperature (logits / t_row before log-probs and
  // entropy), for rows a rollout sampled at different temperatures. forward_options::temperature
  // must then stay 1.
  at::Tensor temperature;
};

struct forward_options {
  double temperature = 1.0;   // logits / temperature before log-probs and entropy (never in place)
  bool entropy = true;
  bool return_logits = false; // gathers the full vocab: (b, s, vocab); costly, off by default
  bool record_routing = false; // a mixture of experts: return the routing (model_output::routed_experts)
  // The LM head's chunk of tokens for this call (model_options::head_chunk_tokens); 0: the model's.
  std::int64_t head_chunk_tokens = 0;
  // The caller has checked already that the ranks agree on these batches (a trainer's step checks
  // the batch they come from): forward_backward skips its own check.
  bool batch_checked = false;
};

struct model_output {
  at::Tensor log_probs;  // actor: (b, s) fp32, 0 where `valid` is false
  at::Tensor entropy;    // actor: (b, s) fp32, 0 at padding
  at::Tensor logits;     // actor, on request: (b, s, vocab)
  at::Tensor values;     // critic: (b, s) fp32, 0 at padding
  at::Tensor valid;      // (b, s) bool: where log_probs (actor) or values (critic) are defined
  // With record_routing: (b, s, layers, top_k) int64, the experts each token went to (the replayed
  // ones when the batch carried routed_experts), -1 at padding and in dense layers. From forward() in any layout; from
  // forward_backward's loss callback at pp = 1 only (each stage knows its own layers' routing).
  at::Tensor routed_experts;
};

// The loss of micro-batch `index` from its outputs, on the last pipeline stage. It should already
// be normalised the way the step wants it summed (e.g. divided by the global token count).
using loss_function = std::function<at::Tensor(const model_output& out, std::int64_t index)>;

struct named_parameter {
  std::string name;          // e.g. "layers.3.qkv.weight"
  at::Tensor tensor;         // this rank's shard (local shape of the plan)
  const param_plan* plan;    // how it is sharded
  bool tp_partial_grad;      // gradient is partial per tp rank (SP-applied replicated weights, q/k norms): finalize_grads sums it
  bool counted_in_norm;      // false for copies (replicated on other tp ranks, tied copy, kv replica)
  param_instance at{};       // its layer (and expert), for the HF names it binds
};

struct runtime_config {
  shape s;        // fully static (resolved)
  layout l;       // fully static (resolved)
  head_info head;
  model_options options;
};

namespace detail {

class model_core {
 public:
  virtual ~model_core() = default;
  virtual model_output forward(const batch& b, const forward_options& o) = 0;
  virtual std::vector<model_output> forward(const std::vector<batch>& microbatches, const forward_options& o) = 0;
  virtual double forward_backward(const std::vector<batch>& microbatches, const loss_function& loss,
                                  const forward_options& o) = 0;
  virtual std::vector<named_parameter>& parameters() = 0;
  virtual std::vector<named_parameter>& trainable_parameters() = 0;
  virtual void finalize_grads(bool over_dp) = 0;
  virtual double grad_norm() = 0;
  virtual std::vector<std::int64_t> norm_elements() = 0;
  virtual double moe_aux_loss() = 0;
  virtual const runtime_config& config() const = 0;
  virtual void attach_lora(std::shared_ptr<lora_set> adapters) = 0;
  virtual const lora_set* lora() const = 0;
};

template <bool TensorParallel>
std::unique_ptr<model_core> make_model_core(const runtime_config& c, parallel_groups& g);
extern template std::unique_ptr<model_core> make_model_core<true>(const runtime_config&, parallel_groups&);
extern template std::unique_ptr<model_core> make_model_core<false>(const runtime_config&, parallel_groups&);

// Static fields of `declared` must equal `actual`'s; dynamic ones take `actual`'s. Throws
// std::invalid_argument listing every disagreeing field, then the violated rules.
runtime_config resolve_config(const shape& declared_shape, const layout& declared_layout,
                              const shape& actual_shape, const layout& actual_layout, head_info head,
                              const model_options& options);

}  // namespace detail

// Fresh adapters for `settings` (verl's lora_rank / lora_alpha / target_modules): PEFT's default
// initialisation, A Kaiming-uniform (bound 1 / sqrt(in)) and B zero, drawn per module from `seed`
// and its HF name, so the same in every layout (runtime/lora_io.cpp).
std::shared_ptr<lora_set> new_adapters(const lora& settings, const runtime_config& c, std::int64_t tp_rank,
                                       const std::vector<named_parameter>& params, std::uint64_t seed);

template <ModelSpec Spec>
class parallel_model {
 public:
  // Compiled in only when the type allows tp > 1.
  static constexpr bool tensor_parallel = !tp_is_static_one(Spec::layout);

  // For a static model; `actual_*` fill the dynamic fields (e.g. from config.json / CLI flags).
  explicit parallel_model(parallel_groups& groups, const model_options& options = {},
                       const shape& actual_shape = Spec::shape, const layout& actual_layout = Spec::layout)
      : core_(detail::make_model_core<tensor_parallel>(
            detail::resolve_config(Spec::shape, Spec::layout, actual_shape, actual_layout,
                                   head_of<Spec::head>(), options),
            groups)) {
    // Adapters in the type (causal_lm<M, L, lora{...}>): fresh, attached, the base frozen.
    if constexpr (adapters_of<Spec>().enabled())
      attach_lora(new_adapters(adapters_of<Spec>(), core_->config(), groups.me.tp, core_->parameters(), options.seed));
  }

  // Outputs for the whole batch on every rank. With pp = 1 they carry the autograd graph (call
  // backward on anything computed from them); with pp > 1 this is inference (no graph) and the
  // last stage's outputs are broadcast over the pipeline.
  model_output forward(const batch& b, const forward_options& o = {}) {
    require_on_device("forward");
    return core_->forward(b, o);
  }

  // Each micro-batch's outputs on every rank: at pp > 1 inference pipelined over the stages (the
  // stages work on different micro-batches at once; no graph), at pp = 1 one after the other with
  // the graph. The same outputs as forward() on each micro-batch alone.
  std::vector<model_output> forward(const std::vector<batch>& microbatches, const forward_options& o = {}) {
    require_on_device("forward");
    return core_->forward(microbatches, o);
  }

  // Forward and backward of every micro-batch in the pipeline schedule of the layout (no
  // pipelining, 1F1B, or interleaved 1F1B), accumulating gradients; returns the summed loss
  // (the same on every rank). Call finalize_grads() before the optimizer step.
  double forward_backward(const std::vector<batch>& microbatches, const loss_function& loss,
                          const forward_options& o = {}) {
    require_on_device("forward_backward");
    return core_->forward_backward(microbatches, loss, o);
  }

  // This rank's parameters in table order (layers expanded with their global index).
  std::vector<named_parameter>& parameters() { return core_->parameters(); }
  // What training updates: parameters(), or with LoRA adapters attached the adapters' tensors
  // (the base frozen), each named "<HF module>.lora_A.weight" / ".lora_B.weight" (a piece of B or
  // A in a fused or split base: "...weight@<its first HF row or column>").
  std::vector<named_parameter>& trainable_parameters() { return core_->trainable_parameters(); }

  // Megatron's finalize_model_grads (of trainable_parameters()): sum over dp (an expert's over the expert-data-parallel
  // group), over tp for partial gradients (SP-applied norms, value head, router) and kv-head
  // replicas, and over the embedding group for tied embeddings across stages.
  // `over_dp` false leaves out the sums over dp and edp: the distributed optimizer reduce-scatters
  // those itself, each rank keeping the summed gradient of its slice only.
  void finalize_grads(bool over_dp = true) { core_->finalize_grads(over_dp); }

  // Global gradient 2-norm over tp and pp, each parameter element counted once.
  double grad_norm() { return core_->grad_norm(); }
  // For each parameter (in parameters()' order), how many of its leading flat elements the
  // gradient norm counts on this rank: all, none (a copy: replicated over tp, the tied copy), or
  // the query rows of a fused q/k/v whose kv rows are another rank's replicas. Summed over the
  // world once each rank holds a distinct part of every gradient (the distributed optimizer's
  // slices), this gives grad_norm().
  std::vector<std::int64_t> norm_elements() { return core_->norm_elements(); }
  // The auxiliary losses (model_options::moe_*) the last forward_backward added, summed over
  // layers, as Megatron scales them; the same on every rank (a collective: call it on all). 0 for
  // a dense model or with the coefficients at 0.
  double moe_aux_loss() { return core_->moe_aux_loss(); }
  const runtime_config& config() const { return core_->config(); }
  // LoRA adapters on this rank's linears (runtime/lora_io.hpp's load_peft_adapter or
  // new_adapters), applied in every forward from now on; the base is frozen and training updates
  // the adapters (trainable_parameters()). Null removes them and unfreezes the base. Attach them
  // before make_trainer: a trainer keeps the parameter list it was built with. The routers' expert
  // biases stay as loaded too (the step's expert loads are dropped).
  void attach_lora(std::shared_ptr<lora_set> adapters) { core_->attach_lora(std::move(adapters)); }
  [[nodiscard]] const lora_set* lora() const { return core_->lora(); }

  // Between phases (verl's param_offload / grad_offload): this rank's parameters and, separately,
  // their gradients moved to host memory, their device storage freed (runtime/offload.hpp); the
  // same tensors come back with reload(). forward and forward_backward refuse while offloaded.
  void offload(bool params = true, bool grads = true) {
    std::vector<at::Tensor> ps, gs;
    for (const named_parameter& p : parameters()) {
      ps.push_back(p.tensor);
      gs.push_back(p.tensor.grad());
    }
    if (params && !parameters_.offloaded()) parameters_.offload(ps);
    if (grads && !gradients_.offloaded()) gradients_.offload(gs);
  }
  void reload() {
    parameters_.reload();
    gradients_.reload();
  }
  // Whether parameters or gradients are offloaded (their tensors must not be read meanwhile).
  [[nodiscard]] bool offloaded() const { return parameters_.offloaded() || gradients_.offloaded(); }
  // Bytes on the device now: the parameters' storage and the gradients' (0 while offloaded).
  [[nodiscard]] std::int64_t parameter_bytes() {
    std::vector<at::Tensor> ps;
    for (const named_parameter& p : parameters()) ps.push_back(p.tensor);
    return storage_bytes(ps);
  }
  [[nodiscard]] std::int64_t gradient_bytes() {
    std::vector<at::Tensor> gs;
    for (const named_parameter& p : parameters()) gs.push_back(p.tensor.grad());
    return storage_bytes(gs);
  }

 private:
  void require_on_device(const char* what) const {
    if (parameters_.offloaded() || gradients_.offloaded())
      throw std::logic_error(std::string("megadsl: ") + what + ": the model's " +
                             (parameters_.offloaded() ? "parameters are" : "gradients are") +
                             " offloaded to host memory; call reload() first");
  }

  std::unique_ptr<detail::model_core> core_;
  offload_set parameters_, gradients_;
};

}  // namespace megadsl
