// The training step of an RLHF actor or critic with verl's losses (runtime/losses.hpp: the policy
// losses with dual-clip, every loss_agg_mode, KL and entropy terms, the clipped value loss):
// micro-batches through the pipeline schedule, gradients finalised over dp/tp/pp (and the embedding
// group), clipped by the global norm, AdamW.
//
// Losses are aggregated over the *global* batch (verl's global_batch_info): each micro-batch's
// loss is divided by the loss tokens (or sequences) of every micro-batch and dp rank, so the
// result does not depend on how the batch is split, and equals single-process training.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "megadsl/batching.hpp"
#include "megadsl/runtime/losses.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {

// The parameters weight decay applies to: Megatron's rule (matrices only; no decay on biases, norm
// weights and other vectors), or every parameter (torch's AdamW over model.parameters(), as verl's
// FSDP engine builds it).
enum class weight_decay_scope : std::uint8_t { matrices, all };

struct optimizer_config {
  double lr = 1e-5;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;
  weight_decay_scope decay_on = weight_decay_scope::matrices;
  double clip_grad = 1.0;      // global gradient norm; <= 0 disables clipping
  // Megatron's distributed optimizer (verl's default, use_distributed_optimizer): each dp rank
  // keeps the AdamW moments of 1/dp of every parameter (of an expert's over the expert-data-
  // parallel group) and updates only that slice; the updated slices are all-gathered over dp. The
  // same numbers as the replicated optimizer (AdamW is element-wise; the gradients are
  // reduce-scattered instead of all-reduced, which sums them in another order), 8/dp bytes of
  // state per parameter instead of 8. Checkpoints hold the whole moments either way.
  bool distributed = true;
  // The distributed optimizer reduce-scatters the gradients (and all-gathers the parameters) in
  // buckets of about this many elements, each a (dp, elements / dp) buffer for one collective.
  // Megatron's buckets are 40M elements of its contiguous gradient buffer; megadsl copies the
  // gradients into the bucket, so a smaller one bounds the transient memory (64 MB in fp32).
  std::int64_t grad_bucket_elements = std::int64_t{16} << 20;
  // Learning rate and weight decay at a step (samples consumed so far); default: constant.
  std::function<double(std::int64_t)> lr_at;
  std::function<double(std::int64_t)> weight_decay_at;
};

// The global batch, the same tensors on every rank; each dp rank trains on its rows.
struct rollout_batch {
  at::Tensor input_ids, attention_mask;  // (B, s)
  at::Tensor loss_mask;                  // (B, s) 1 where position t's output (log p of token t+1, or value) is trained
  at::Tensor old_log_probs, advantages;  // actor (B, s)
  at::Tensor ref_log_probs;              // actor, when kl_coeff > 0
  at::Tensor old_values, returns;        // critic (B, s)
  at::Tensor rollout_is_weights;         // actor, optional (B, s): verl's rollout importance-sampling weights
  at::Tensor temperature;                // actor, optional (B,): each row's sampling temperature in the update
  // Router replay (R2: recorded by the log-prob pass, model_output::routed_experts; R3: from the
  // rollout engine): (B, s, layers, top_k) int64, replayed in the update's forward and backward.
  // It travels with its rows through the dp split, the balancer and the micro-batches.
  at::Tensor routed_experts;
  // Fields a custom loss reads (custom_loss below), each (B, ...): they travel with their rows
  // through the dp split, the balancer and the micro-batches, like the fields above.
  std::map<std::string, at::Tensor> extra;
};

// A loss of the caller's own, run per micro-batch on the last pipeline stage with the model's
// outputs and the micro-batch's fields (on the outputs' device), and the global batch's counts to
// normalise by (its losses must add up over micro-batches and dp ranks, as verl's do: the loss_mask's
// tokens and rows with any, or without a loss_mask the real tokens and rows). Its metrics
// are averaged over the micro-batches and dp ranks and reach every rank.
using custom_loss = std::function<loss_result(const model_output& out, const rollout_batch& mb, const loss_norm& global)>;

struct step_options {
  custom_loss loss;       // the caller's loss in place of the configured one
  // Each dp rank passes its own rows (verl dispatches each dp rank its share) instead of every
  // rank the global batch: the ranks of one replica must agree, the global counts are summed
  // over dp, and with dynamic batching the dp ranks take the most micro-batches any of them needs.
  bool dp_local = false;
};

struct step_metrics {
  double loss = 0;        // global token-mean loss
  double grad_norm = 0;   // before clipping
  double lr = 0;
  std::int64_t tokens = 0;  // real tokens of the global batch
  double seconds = 0;
  double tokens_per_second = 0;
  double moe_aux_loss = 0;  // a mixture's auxiliary losses added through the backward (model_options::moe_*)
  // The gradient norm or the loss was NaN or infinite (a NaN advantage, a -inf old log-prob):
  // the update was not applied and the step not counted (Megatron skips such iterations).
  bool skipped = false;
  // verl's loss metrics under verl's names (losses.hpp): "actor/pg_loss", "actor/pg_clipfrac",
  // "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy_loss", "actor/kl_loss",
  // "critic/vf_loss", "critic/vf_clipfrac". Losses summed over micro-batches and dp ranks (the
  // global batch's), fractions and ppo_kl averaged over them (verl's aggregations).
  std::map<std::string, double> losses;
};

// What continuing a run exactly needs besides the parameters: the counters that drive the
// learning-rate schedule and AdamW's per-parameter state. Distributed checkpoints carry it.
struct training_state {
  std::int64_t steps = 0;      // optimizer steps taken
  std::int64_t samples = 0;    // samples consumed: the argument of lr_at / weight_decay_at
  std::int64_t adam_step = 0;  // AdamW's step count (bias correction), the same for every parameter
  // AdamW's moments, one per parameter in the order of the parameter vector, each shaped like
  // that parameter's local shard; both empty while the optimizer has not stepped.
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
};

// Rows [begin, end) of every defined tensor of the batch.
rollout_batch slice_rows(const rollout_batch& b, std::int64_t begin, std::int64_t end);

namespace detail {
class trainer_impl;
}

// What the trainer asks of its model (a parallel_model<Spec>; model_hooks_of below).
struct model_hooks {
  std::function<double(const std::vector<batch>&, const loss_function&, const forward_options&)> forward_backward;
  std::function<void(bool over_dp)> finalize;            // parallel_model::finalize_grads
  std::function<double()> grad_norm;                     // of finalized (dp-summed) gradients
  std::function<std::vector<std::int64_t>()> norm_elements;  // parallel_model::norm_elements
  std::function<double()> aux_loss;                      // parallel_model::moe_aux_loss
};

template <ModelSpec Spec>
model_hooks model_hooks_of(parallel_model<Spec>& model) {
  return {.forward_backward = [&model](const std::vector<batch>& mbs, const loss_function& loss,
                                       const forward_options& o) { return model.forward_backward(mbs, loss, o); },
          .finalize = [&model](bool over_dp) { model.finalize_grads(over_dp); },
          .grad_norm = [&model] { return model.grad_norm(); },
          .norm_elements = [&model] { return model.norm_elements(); },
          .aux_loss = [&model] { return model.moe_aux_loss(); }};
}

class trainer {
 public:
  // Use make_trainer below.
  trainer(model_hooks model, std::vector<named_parameter>& params, const parallel_groups& groups, bool actor,
          const optimizer_config& opt, const actor_loss_config& actor_cfg, const critic_loss_config& critic_cfg);
  ~trainer();
  trainer(trainer&&) noexcept;
  trainer& operator=(trainer&&) noexcept;

  // One optimizer step on the global batch, split over dp ranks, then into `microbatches` (with
  // o.dp_local: this dp rank's own rows); with o.loss, the caller's loss in place of the configured one.
  step_metrics step(const rollout_batch& global, std::int64_t microbatches, const step_options& o = {});
  // The same with verl's dynamic batching: rows balanced over dp ranks by Karmarkar-Karp, then
  // micro-batches that never exceed `options.max_token_len` real tokens (with the interleaved
  // schedule set options.divisible_by = pp). The result does not depend on the split.
  step_metrics step(const rollout_batch& global, const micro_batch_options& options, const step_options& o = {});
  // Before anything else, step() checks that every rank was given the same global batch: its
  // shapes, and its values unless this is off (make_trainer takes model_options::batch_checksum).
  void set_batch_checksum(bool on);
  // The learning rate of the following steps, in place of optimizer_config's rate and schedule:
  // for a caller that runs its own scheduler (verl's engines step theirs once per batch).
  void set_lr(double lr);
  [[nodiscard]] double lr() const;  // the rate the next step uses
  // The weight decay of the following steps, in place of optimizer_config's (and its schedule).
  void set_weight_decay(double wd);
  [[nodiscard]] double weight_decay() const;
  [[nodiscard]] std::int64_t steps_done() const;
  [[nodiscard]] std::int64_t samples_done() const;
  // Steps whose gradient norm or loss was not finite, so not applied (step_metrics::skipped).
  [[nodiscard]] std::int64_t steps_skipped() const;

  // The counters and copies of AdamW's moments. Throws std::logic_error if the parameters
  // disagree on AdamW's step (one step count per checkpoint).
  [[nodiscard]] training_state export_state() const;
  // Bytes of optimizer state this rank holds on the device (AdamW's two moments; 0 before the
  // first step, and while offloaded).
  [[nodiscard]] std::int64_t optimizer_bytes() const;
  // verl's optimizer_offload between phases: AdamW's moments moved to host memory and back
  // (runtime/offload.hpp); step() refuses while they are offloaded.
  void offload_optimizer();
  void reload_optimizer();
  // Continues from `state`: counters set, moments copied into fresh AdamW state (none when the
  // state has no moments). Throws std::invalid_argument naming the parameter whose moment has the
  // wrong shape, or when the number of moments is not the number of parameters.
  void import_state(const training_state& state);

 private:
  step_metrics run(const rollout_batch& given, std::vector<rollout_batch> parts, const step_options& o);
  std::unique_ptr<detail::trainer_impl> impl_;
};

template <ModelSpec Spec>
trainer make_trainer(parallel_model<Spec>& model, const parallel_groups& groups, const optimizer_config& opt = {},
                     const actor_loss_config& actor_cfg = {}, const critic_loss_config& critic_cfg = {}) {
  trainer t(model_hooks_of(model), model.trainable_parameters(), groups, Spec::is_actor, opt, actor_cfg, critic_cfg);
  t.set_batch_checksum(model.config().options.batch_checksum);
  return t;
}

}  // namespace megadsl
