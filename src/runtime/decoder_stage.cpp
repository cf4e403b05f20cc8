// This rank's stage of any decoder composition, once with tensor parallelism and once without
// (explicitly instantiated below): its parameters, its chunks of layers and the head. Each layer
// is one module built from the family's blocks (layers/layer_plan.hpp); the stage runs them and
// knows no block kind, so a new family adds no instantiation. The pipeline executor
// (runtime/pipeline_executor.hpp) runs its chunks in the layout's schedule. Activations are
// token-major (T, h); under SP each rank holds T/tp rows.
// Over 600 lines on purpose: the forward, the recompute and the head share the stage's chunk state.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "megadsl/formulas.hpp"
#include "megadsl/require_valid.hpp"
#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/layers/dropout.hpp"
#include "megadsl/layers/fused_ops.hpp"
#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/layer_plan.hpp"
#include "megadsl/layers/moe.hpp"
#include "megadsl/layers/activation_offload.hpp"
#include "megadsl/layers/recompute.hpp"
#include "megadsl/layers/ring_attention.hpp"
#include "megadsl/layers/vocab_parallel.hpp"
#include "megadsl/parallel/agreement.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/runtime/pipeline_executor.hpp"
#include "megadsl/runtime/squared_sum.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/shard_io.hpp"
#include "cpu_allocator.hpp"
#include "name_seed.hpp"

namespace megadsl::detail {
namespace {

// Inference computes the LM head and its log-softmax a block of tokens at a time, about
// lm_head_chunk_elements logits (128 MB in fp32, ~1000 tokens of a 32k vocabulary): the whole (T, V)
// is never held, and the blocks stay tall enough for the GEMM (64-token blocks made the LM head
// 1.7x slower here). Training computes them whole (one pass, the fused kernels where they apply)
// up to lm_head_whole_max_elements a micro-batch, in such blocks beyond it (formulas.hpp's
// lm_head_training_chunk; chunked_head_logprob_entropy: the GEMM again in the backward).

// The full HF tensor of `name`, the same on every rank and under every layout (DESIGN §13), as its
// row says it starts: a norm's weight at 1, or at 0 for a (1 + w) norm (Gemma's zero-centred
// weights), a bias at 0, a constant row at its value (test_init perturbs these), the rest N(0, init_std).
at::Tensor init_full(std::string_view hf_name, const dims& d, const model_options& o, const param_row& row) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(name_seed(hf_name, o.seed));
  const std::vector<std::int64_t> size = d.rank == 1 ? std::vector<std::int64_t>{d.rows}
                                                     : std::vector<std::int64_t>{d.rows, d.cols};
  const bool bias = is_bias(row);
  const bool norm = !bias && (row.init == param_init::ones || row.init == param_init::zeros);  // a norm's weight
  at::Tensor t;
  if (row.init == param_init::constant) t = (o.test_init ? at::normal(0.0, 0.1, size, gen) : at::zeros(size)) + row.init_value;
  else if (norm) t = (o.test_init ? at::normal(0.0, 0.1, size, gen) : at::zeros(size)) + (row.init == param_init::zeros ? 0.0 : 1.0);
  else if (bias) t = o.test_init ? at::normal(0.0, o.init_std, size, gen) : at::zeros(size);
  else t = at::normal(0.0, o.init_std, size, gen);
  return t.to(o.dtype);  // on the CPU: the same generator stream on every device
}

// One virtual pipeline chunk of this rank: global stage chunk * pp + pp_rank.
struct chunk_info {
  std::int64_t first_layer = 0, count = 0;
  bool first_stage = false;  // holds the embedding
  bool last_stage = false;   // holds the final norm and the head
};

template <bool Tp>
class decoder_stage final : public model_core, public pipeline_stage {
 public:
  decoder_stage(const runtime_config& c, parallel_groups& g)
      : cfg_(c), plans_(plan_params(c.s, c.l, c.head)), groups_(&g), executor_(*g.pp, c.l.vpp.get()),
        device_(c.options.device),
        compute_(c.options.compute()), routing_slots_(routing_slots(c.s)), invariant_(c.l.invariant.get()) {
    if (invariant_ && !device_.is_cpu() && !device_.is_cuda())
      throw std::invalid_argument("megadsl: layout invariant runs on the CPU and CUDA, not on " + device_.str() +
                                  "; build the model on one of them or without invariant");
    if (invariant_ && device_.is_cuda() && c.s.linear_layers.get() != 0)
      throw std::invalid_argument("megadsl: layout invariant on CUDA does not cover the gated DeltaNet yet: its chunked "
                                  "rule's batched GEMMs and its conv change kernels with the batch (a sequence's fp32 "
                                  "log-probs moved by 4.8e-6 on an H200); build this model on the CPU for invariant, "
                                  "or without invariant");
    if (c.options.offload_activations && c.l.recompute.get() != recompute_kind::full)
      throw std::invalid_argument(std::string("megadsl: offload_activations moves the input each layer keeps under "
                                              "recompute full to host memory, and this layout's recompute is ") +
                                  std::string(name_of(c.l.recompute.get())) + "; set recompute full, or leave offload off");
    if (c.options.deterministic) {
      ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
      at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    }
    pp_size_ = c.l.pp.get();
    pp_rank_ = g.pp->rank();
    if (g.pp->size() != pp_size_)
      throw std::invalid_argument("megadsl: the pp group has " + std::to_string(g.pp->size()) +
                                  " ranks but the layout says pp = " + std::to_string(pp_size_));
    for (std::int64_t chunk = 0; chunk < c.l.vpp.get(); ++chunk) {
      const stage_range r = chunk_layers(c.s, c.l, pp_rank_, chunk);
      chunks_.push_back({r.first_layer, r.count, pp_rank_ == 0 && chunk == 0,
                         pp_rank_ == pp_size_ - 1 && chunk == c.l.vpp.get() - 1});
    }
    if constexpr (Tp) {
      tp_ = g.tp.get();
      tp_size_ = tp_->size();
      tp_rank_ = tp_->rank();
      if (tp_size_ != c.l.tp.get())
        throw std::invalid_argument("megadsl: the tp group has " + std::to_string(tp_size_) +
                                    " ranks but the layout says tp = " + std::to_string(c.l.tp.get()));
      sp_ = c.l.sp.get();
    }
    if (c.l.cp.get() > 1) {
      if (g.cp == nullptr || g.cp->size() != c.l.cp.get())
        throw std::invalid_argument("megadsl: the layout has cp = " + std::to_string(c.l.cp.get()) +
                                    " but the groups have no cp group of that size; build them with "
                                    "parallel_groups::build(dist, layout) for this layout");
      cp_ = g.cp.get();
      cp_size_ = cp_->size();
      cp_rank_ = cp_->rank();
      if (cp_ring(c.l)) {
        const std::int64_t a2a = cp_a2a_size(c.l);
        if (a2a > 1 && (g.cp_a2a == nullptr || g.cp_a2a->size() != a2a || g.cp_ring == nullptr))
          throw std::invalid_argument("megadsl: the layout has cp_comm a2a+ring with cp_a2a = " + std::to_string(a2a) +
                                      " but the groups have no all-to-all group of that size; build them with "
                                      "parallel_groups::build(dist, layout) for this layout");
        ring_ = a2a > 1 ? g.cp_ring.get() : cp_;
        ring_a2a_ = a2a > 1 ? g.cp_a2a.get() : nullptr;
      }
    }
    if (c.s.experts.get() > 0) {
      const std::int64_t ep = c.l.ep.get();
      if (expert_tp(c.l) != c.l.tp.get())
        throw std::invalid_argument("megadsl: etp = " + std::to_string(expert_tp(c.l)) + " with tp = " +
                                    std::to_string(c.l.tp.get()) + ": experts split over fewer ranks than the attention "
                                    "are not implemented yet; use etp = 0 (etp = tp, Megatron's default)");
      if (ep > 1 && (g.ep == nullptr || g.ep->size() != ep || g.edp == nullptr))
        throw std::invalid_argument("megadsl: the layout has ep = " + std::to_string(ep) +
                                    " but the groups have no ep group of that size; build them with "
                                    "parallel_groups::build(dist, layout) for this layout");
      ep_ = ep > 1 ? g.ep.get() : nullptr;
      experts_per_rank_ = c.s.experts.get() / ep;
      first_expert_ = (ep > 1 ? g.ep->rank() : 0) * experts_per_rank_;
    }
    // Every rank builds the same model (config.json, layout, head, dtypes, options), or none does.
    agree_on(*g.world, "built different models", fields_of(c),
             "every rank must build the same model: the same config.json, layout, head and options");
    if (device_.is_cpu()) tune_cpu_allocator();
    build_parameters();
  }

  const runtime_config& config() const override { return cfg_; }
  std::vector<named_parameter>& parameters() override { return params_; }
  std::vector<named_parameter>& trainable_parameters() override { return lora_ != nullptr ? lora_params_ : params_; }
  const lora_set* lora() const override { return lora_.get(); }

  // The adapters become what training updates and the base is frozen: no gradient, so no
  // optimizer state, distributed-optimizer slice or gradient sync for it. Each adapter tensor is
  // a named_parameter of its base's plan; how its gradient is summed (layers/lora_linear.hpp):
  //   the matrix whole on a split base (A of a column base, B of a row one): partial over tp,
  //       then the same on every tp rank, counted once;
  //   its pieces: whole on their rank; a replicated kv head's summed over the ranks of that head,
  //       counted on its main replica;
  //   on a base whole on every tp rank: the same on each (partial over tp under SP, as the base's).
  void attach_lora(std::shared_ptr<lora_set> adapters) override {
    if (adapters != nullptr && !cfg_.head.actor)
      throw std::invalid_argument("megadsl: LoRA on a critic (value model) is not supported yet: its value head would stay "
                                  "frozen with the base (PEFT trains it as a module to save); train the critic whole");
    lora_ = std::move(adapters);
    lora_params_.clear();
    lora_replicas_.clear();
    for (named_parameter& p : params_) p.tensor.requires_grad_(lora_ == nullptr);
    if (lora_ == nullptr) return;
    for (const named_parameter& p : params_) {
      std::vector<lora_shard>* list = lora_->adapters_of(p.tensor);
      if (list == nullptr) continue;
      for (lora_shard& a : *list) {
        const bool split = a.base_split;
        const std::string sharded = a.module + (a.along_output ? ".lora_B.weight" : ".lora_A.weight");
        a.whole.requires_grad_(true);
        lora_params_.push_back({a.module + (a.along_output ? ".lora_A.weight" : ".lora_B.weight"), a.whole, p.plan,
                                split || p.tp_partial_grad, tp_rank_ == 0, p.at});
        lora_replicas_.push_back(0);
        for (lora_shard::piece& x : a.pieces) {
          x.part.requires_grad_(true);
          lora_params_.push_back({sharded + "@" + std::to_string(x.global_offset), x.part, p.plan,
                                  !split && p.tp_partial_grad, split ? x.main : tp_rank_ == 0, p.at});
          lora_replicas_.push_back(split ? x.replica_units : 0);
        }
      }
    }
  }

  model_output forward(const batch& b, const forward_options& o) override {
    agree_on_batch(*groups_->world, batch_call::forward, groups_->me.dp, {fields_of(b)}, cfg_.options.batch_checksum,
                   fields_of(o));
    if (pp_size_ == 1) {  // with the autograd graph
      const micro_input in = prepare(b);
      return head(run_chunk(0, in, {}), in, o);
    }
    return pipelined_inference({b}, o).front();
  }

  std::vector<model_output> forward(const std::vector<batch>& microbatches, const forward_options& o) override {
    if (microbatches.empty()) throw std::invalid_argument("megadsl: forward needs at least one micro-batch");
    std::vector<named_tensors> given;
    for (const batch& b : microbatches) given.push_back(fields_of(b));
    agree_on_batch(*groups_->world, batch_call::forward, groups_->me.dp, given, cfg_.options.batch_checksum, fields_of(o));
    if (pp_size_ > 1) return pipelined_inference(microbatches, o);
    std::vector<model_output> out;  // pp = 1: one after the other, each with its graph
    for (const batch& b : microbatches) {
      const micro_input in = prepare(b);
      out.push_back(head(run_chunk(0, in, {}), in, o));
    }
    return out;
  }

  double forward_backward(const std::vector<batch>& microbatches, const loss_function& loss,
                          const forward_options& o) override {
    const auto m = static_cast<std::int64_t>(microbatches.size());
    if (m == 0) throw std::invalid_argument("megadsl: forward_backward needs at least one micro-batch");
    if (!o.batch_checked) {
      std::vector<named_tensors> given;
      for (const batch& b : microbatches) given.push_back(fields_of(b));
      agree_on_batch(*groups_->world, batch_call::forward_backward, groups_->me.dp, given, cfg_.options.batch_checksum,
                     fields_of(o));
    }
    require_valid(cfg_.s, cfg_.l, run_facts{.microbatches = m});
    const running_inputs running(inputs_);
    // Megatron's scale of the auxiliary losses: a mean over micro-batches and dp ranks; each tp
    // rank routes the same tokens, and their gradients are summed over tp (copy_to_tp, the
    // router's tp-partial gradient), so each holds 1 / tp of it.
    run_.aux_scale = 1.0 / static_cast<double>(m * groups_->dp->size() * tp_size_);
    run_.aux_total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
    struct training_run {
      bool& flag;
      explicit training_run(bool& f) : flag(f) { flag = true; }
      ~training_run() { flag = false; }
    } const in_training(run_.training);
    ++training_calls_;  // each step's dropout masks are its own
    inputs_.reserve(microbatches.size());
    for (const batch& b : microbatches) inputs_.push_back(prepare(b));
    return executor_.forward_backward(*this, m, [&](const at::Tensor& hidden, std::int64_t mb) {
      return loss(head(hidden, inputs_[static_cast<std::size_t>(mb)], o), mb);
    });
  }

  // ---- pipeline_stage: what the executor runs ----
  std::int64_t chunk_count() const override { return static_cast<std::int64_t>(chunks_.size()); }
  bool is_first(std::int64_t chunk) const override { return chunks_[static_cast<std::size_t>(chunk)].first_stage; }
  bool is_last(std::int64_t chunk) const override { return chunks_[static_cast<std::size_t>(chunk)].last_stage; }
  at::Tensor forward(std::int64_t chunk, std::int64_t mb, const at::Tensor& input) override {
    return run_chunk(chunk, inputs_[static_cast<std::size_t>(mb)], input);
  }
  // Hidden states between stages: (T'/tp, h) under SP, else (T', h).
  at::Tensor activation_buffer(std::int64_t mb) const override {
    const micro_input& in = inputs_[static_cast<std::size_t>(mb)];
    const std::int64_t rows = sp_ ? in.pk.ids.size(0) / tp_size_ : in.pk.ids.size(0);
    return at::empty({rows, cfg_.s.hidden.get()}, at::TensorOptions().dtype(compute_).device(device_));
  }

  void finalize_grads(bool over_dp) override {
    if (lora_ != nullptr) {
      // The base is frozen, the routers' expert biases included (PEFT's adapters ship without
      // them): the step's expert loads are dropped.
      finalize_lora_grads(over_dp);
      for (const expert_load* e : expert_loads_) e->tokens.zero_();
      return;
    }
    for (auto& p : params_) {
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      at::Tensor g = p.tensor.grad();
      // An expert's replicas are the expert-data-parallel group's: the ep group's ranks hold
      // other experts, and their tokens' gradients arrived through the all-to-all.
      const bool expert = p.plan->row->where == placement::expert;
      if (over_dp) (expert && groups_->edp != nullptr ? *groups_->edp : groups_->gradient_dp()).all_reduce(g);
      if constexpr (Tp) {
        if (p.tp_partial_grad) tp_->all_reduce(g);
        if (has_replicas(p.plan->geo, tp_size_)) sum_replicas(*p.plan, g);
      }
    }
    // Tied embeddings across stages: the first stage's embedding and the last stage's copy.
    if (tied_end_ != nullptr) {
      at::Tensor g = tied_end_->tensor.grad();
      groups_->embedding->all_reduce(g);
    }
    update_expert_biases();
  }

  // The adapters' gradients (attach_lora): summed over dp in one collective (an expert's over edp),
  // over tp in another (the tp-partial ones), then each replicated kv head's rows of B over the
  // ranks of that head.
  void finalize_lora_grads(bool over_dp) {
    std::vector<at::Tensor> grads, expert_grads, partial;
    for (named_parameter& p : lora_params_) {
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      // An expert's adapter: its replicas are the expert-data-parallel group's, as its expert's.
      (p.plan->row->where == placement::expert && groups_->edp != nullptr ? expert_grads : grads).push_back(p.tensor.grad());
      if (p.tp_partial_grad) partial.push_back(p.tensor.grad());
    }
    const auto sum_flat = [](const comm_group& group, const std::vector<at::Tensor>& ts) {
      if (ts.empty() || group.size() == 1) return;
      std::vector<at::Tensor> flat;
      for (const at::Tensor& t : ts) flat.push_back(t.reshape({-1}));
      at::Tensor all = at::cat(flat);
      group.all_reduce(all);
      std::int64_t at = 0;
      for (const at::Tensor& t : ts) {
        t.view({-1}).copy_(all.narrow(0, at, t.numel()));
        at += t.numel();
      }
    };
    if (over_dp) sum_flat(groups_->gradient_dp(), grads);
    if (over_dp && !expert_grads.empty()) sum_flat(*groups_->edp, expert_grads);
    if constexpr (Tp) {
      sum_flat(*tp_, partial);
      for (std::size_t i = 0; i < lora_params_.size(); ++i) {
        const std::int64_t units = lora_replicas_[i];
        if (units == 0) continue;
        at::Tensor g = lora_params_[i].tensor.grad();
        const at::Tensor all = tp_->all_gather(g.contiguous().unsqueeze(0), 0);  // (tp, extent, r)
        const std::int64_t my_unit = tp_rank_ * units / tp_size_;
        at::Tensor sum = at::zeros_like(g);
        for (std::int64_t r = 0; r < tp_size_; ++r)
          if (r * units / tp_size_ == my_unit) sum += all[r];
        g.copy_(sum);
      }
    }
  }

  // The aux-loss-free balancing of the routers with an expert bias (Megatron's
  // _update_router_expert_bias in finalize_model_grads): this stage's layers' counts in one
  // tensor, summed over the ranks that routed other tokens (dp and cp; every tp rank routed the
  // same whole stream), then each bias moved by rate * sign(mean - load). Always over dp, whether
  // the gradients are summed here or reduce-scattered by the distributed optimizer: the balance is
  // the global batch's, as Megatron's all-reduce over tp x cp x dp makes it.
  void update_expert_biases() {
    if (expert_loads_.empty()) return;
    std::vector<at::Tensor> counts;
    for (const expert_load* e : expert_loads_) counts.push_back(e->tokens);
    at::Tensor all = at::stack(counts);  // (layers here, E) fp64
    groups_->gradient_dp().all_reduce(all);
    const double rate = cfg_.options.moe_expert_bias_update_rate;
    for (std::size_t i = 0; i < expert_loads_.size(); ++i) {
      if (rate != 0) update_expert_bias(*expert_loads_[i], all[static_cast<std::int64_t>(i)], rate);
      else expert_loads_[i]->tokens.zero_();
    }
  }

  double moe_aux_loss() override {
    // The same answer on every rank without a collective when there is nothing to sum (a dense
    // model, or the coefficients at 0: the configuration is every rank's).
    const model_options& o = cfg_.options;
    if (routing_slots_ == 0 || (o.moe_aux_loss_coeff == 0 && o.moe_z_loss_coeff == 0)) return 0.0;
    at::Tensor t = run_.aux_total.defined() ? run_.aux_total.clone()
                                        : at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
    groups_->world->all_reduce(t);  // tp ranks' shares, the stages' layers, the dp ranks' means
    return t.item<double>();
  }

  std::vector<std::int64_t> norm_elements() override {
    std::vector<std::int64_t> out;
    if (lora_ != nullptr) {
      for (const auto& p : lora_params_) out.push_back(p.counted_in_norm ? p.tensor.numel() : 0);
      return out;
    }
    out.reserve(params_.size());
    for (const auto& p : params_) {
      const std::int64_t n = p.tensor.numel();
      if (p.plan->row->where == placement::expert) {
        // Split over tp, or replicated and counted on tp rank 0 (gpt-oss's down bias).
        out.push_back(p.counted_in_norm ? n : 0);
      } else if (has_replicas(p.plan->geo, tp_size_)) {
        // Units that are another rank's replicas (its kv heads) do not count: this rank's main pieces.
        const std::int64_t per_row = n / p.tensor.size(p.plan->split_dim);
        std::int64_t mine = 0;
        for (const shard_piece& x : shard_pieces(*p.plan, cfg_.s, cfg_.l, tp_rank_, piece_set::main_replica))
          mine += x.extent * per_row;
        out.push_back(mine);
      } else {
        out.push_back(p.counted_in_norm ? n : 0);
      }
    }
    return out;
  }

  double grad_norm() override {
    at::Tensor sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
    at::Tensor expert_sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
    const std::vector<std::int64_t> counted = norm_elements();  // copies and kv replicas left out
    const std::vector<named_parameter>& trained = trainable_parameters();
    for (std::size_t i = 0; i < trained.size(); ++i) {
      const at::Tensor& g = trained[i].tensor.grad();
      if (!g.defined() || counted[i] == 0) continue;
      // An expert's: other experts are on the other ep ranks.
      (trained[i].plan->row->where == placement::expert ? expert_sq : sq) += squared_sum(g.reshape({-1}).narrow(0, 0, counted[i]));
    }
    if (ep_ != nullptr) ep_->all_reduce(expert_sq);
    sq += expert_sq;
    if constexpr (Tp) tp_->all_reduce(sq);
    groups_->pp->all_reduce(sq);
    return std::sqrt(sq.item<double>());  // one device sync per step
  }

 private:
  struct micro_input {
    packed_tokens pk;     // this rank's tokens: its cp share of `whole` (the whole stream at cp = 1)
    packed_tokens whole;  // cp > 1: the whole stream, whose sequences attention and the outputs see
    rope_tables rope;     // at the whole stream's positions
    rope_tables local_rope;  // the sliding layers' plain RoPE (shape::local_rope_theta; undefined: none)
    // A mixture of experts: the routing to replay (T, layers, k) int64 (undefined: route live),
    // and the routing each layer took, filled as the layers run (T, layers, k), -1 until then;
    // both of this rank's tokens.
    at::Tensor replay, routed;
    dropout_draw dropout;  // a training step with dropout: the rates, the step's salt, the stream's keys
    at::Tensor cp_places;  // ring cp: each whole-stream token's place among the ranks' shares (packing.hpp)
    ring_tokens ring_rows;  // ring cp: the positions and sequences of the rows the ring's queries are

    [[nodiscard]] const packed_tokens& sequences() const { return whole.ids.defined() ? whole : pk; }
  };

  // The micro-batches of one run of the executor, emptied when it ends, by return or by exception.
  // (A loss callback must not call forward() on the same model: the run owns inputs_.)
  struct running_inputs {
    std::vector<micro_input>& inputs;
    explicit running_inputs(std::vector<micro_input>& v) : inputs(v) { inputs.clear(); }
    ~running_inputs() { inputs.clear(); }
    running_inputs(const running_inputs&) = delete;
    running_inputs& operator=(const running_inputs&) = delete;
  };

  micro_input prepare(const batch& b) const {
    // Padded to a multiple of cp (and of tp within each cp share under SP).
    // Invariant arithmetic packs every batch: attention then runs one sequence at a time, whatever
    // the padding (layers/invariant.hpp).
    const std::int64_t rows_multiple = cp_size_ * (sp_ ? tp_size_ : 1) * (invariant_ && device_.is_cuda() ? invariant_cuda_rows : 1);
    micro_input in{pack_tokens(b, cfg_.l.rmpad.get() || invariant_, rows_multiple, cfg_.s.vocab.get()), {}, {}, {}, {}, {}, {}};
    in.pk.to(device_);
    const at::Tensor inv_freq = rope_inv_freq(cfg_.s, in.pk.max_position + 1).to(device_);
    in.rope = rope_for_positions(inv_freq, in.pk.positions.narrow(0, 0, in.pk.tokens), cfg_.s);
    if (cfg_.s.local_rope_theta.get() != 0) {  // RoPE per layer type: the sliding layers' is plain, with its own base
      shape local = cfg_.s;
      local.rope_theta = cfg_.s.local_rope_theta.get();
      local.rope = {};
      in.local_rope = rope_for_positions(rope_inv_freq(local, in.pk.max_position + 1).to(device_),
                                         in.pk.positions.narrow(0, 0, in.pk.tokens), local);
    }
    // Dropout in a training step (the model's, or LoRA's on the adapters' inputs): a key per row of
    // the whole stream, this rank's share of them.
    const bool lora_dropout = lora_ != nullptr && lora_->enabled() && lora_->settings().dropout.get() > 0;
    const bool dropout = run_.training && (cfg_.options.dropout.any() || lora_dropout);
    if (dropout) in.dropout = {cfg_.options.dropout, dropout_step_salt(cfg_.options.seed, training_calls_), dropout_token_keys(in.pk), {}};
    if (cp_ != nullptr && cp_ring(cfg_.l)) {
      // Ring cp: this rank's load-balanced share (chunks i and 2 cp - 1 - i of every sequence), its
      // rows' RoPE tables (its attention rotates its own rows), its rows' dropout keys.
      in.whole = std::move(in.pk);
      const cp_ring_split split =
          ring_split(in.whole, cp_size_, (sp_ ? tp_size_ : 1) * (invariant_ && device_.is_cuda() ? invariant_cuda_rows : 1));
      in.pk = ring_share(in.whole, split, cp_rank_);
      in.cp_places = split.places;
      if (ring_a2a_ == nullptr) {
        in.ring_rows = ring_tokens_of(in.pk, split.rows);
      } else {  // a2a+ring: the all-to-all group's shares end to end, in its rank order
        const std::int64_t a2a = ring_a2a_->size(), first = cp_rank_ / a2a * a2a;
        std::vector<at::Tensor> positions, sequences;
        for (std::int64_t r = first; r < first + a2a; ++r) {
          const ring_tokens t = ring_tokens_of(r == cp_rank_ ? in.pk : ring_share(in.whole, split, r), split.rows);
          positions.push_back(t.position);
          sequences.push_back(t.sequence);
        }
        in.ring_rows = {at::cat(positions), at::cat(sequences)};
      }
      in.rope = rope_for_positions(inv_freq, in.pk.positions, cfg_.s);
      if (in.local_rope.cos.defined()) {
        shape local = cfg_.s;
        local.rope_theta = cfg_.s.local_rope_theta.get();
        local.rope = {};
        in.local_rope = rope_for_positions(rope_inv_freq(local, in.whole.max_position + 1).to(device_), in.pk.positions, local);
      }
      if (dropout) {
        const std::int64_t whole_rows = in.whole.ids.size(0);
        in.dropout.whole_keys = at::constant_pad_nd(in.dropout.keys, {0, whole_rows - in.dropout.keys.size(0)});
        in.dropout.keys = in.dropout.whole_keys.index_select(0, split.order.narrow(0, cp_rank_ * split.rows, split.rows));
      }
    } else if (cp_ != nullptr) {
      in.whole = std::move(in.pk);
      in.pk = cp_share(in.whole, cp_size_, cp_rank_);
      if (dropout) {
        const std::int64_t rows = in.pk.ids.size(0);
        in.dropout.whole_keys = in.dropout.keys;
        in.dropout.keys = in.dropout.whole_keys.narrow(0, cp_rank_ * rows, rows);
      }
    }
    const shape& s = cfg_.s;
    if (b.routed_experts.defined() && routing_slots_ == 0)
      throw std::invalid_argument("megadsl: the batch carries routed_experts, but this model has no experts to route to");
    if (routing_slots_ == 0) return in;
    const std::int64_t layers = s.layers.get(), k = routing_slots_;
    in.routed = at::full({in.pk.tokens, layers, k}, -1, at::TensorOptions().dtype(at::kLong).device(device_));
    if (b.routed_experts.defined()) {
      const at::Tensor& r = b.routed_experts;
      const std::vector<std::int64_t> want{in.pk.batch, in.pk.seq, layers, k};
      if (r.sizes().vec() != want || r.scalar_type() != at::kLong)
        throw std::invalid_argument("megadsl: routed_experts has shape " + c10::str(r.sizes()) + " (" +
                                    std::string(c10::toString(r.scalar_type())) + "); this batch and model need (" +
                                    std::to_string(in.pk.batch) + ", " + std::to_string(in.pk.seq) + ", " +
                                    std::to_string(layers) + ", " + std::to_string(k) +
                                    ") int64: batch, sequence, layers, top_k, as a recorded forward returns it");
      const at::Tensor by_position = r.to(device_).reshape({in.pk.batch * in.pk.seq, layers, k});
      const at::Tensor given = by_position.index_select(0, in.sequences().index);  // (T, L, k) of the whole stream
      // A position is replayed whole or routed live whole: -1 in every slot or in none.
      if (given.numel() > 0 && !at::equal(given.lt(0).all(-1), given.lt(0).any(-1)))
        throw std::invalid_argument("megadsl: routed_experts holds a position with -1 in some of its top_k slots only; "
                                    "mark a position to route live with -1 in every slot");
      if (given.numel() > 0 && (given.max().item<std::int64_t>() >= s.experts.get() || given.min().item<std::int64_t>() < -1))
        throw std::invalid_argument("megadsl: routed_experts names experts outside 0.." + std::to_string(s.experts.get() - 1) +
                                    " (or below -1, the padding mark); was it recorded for another model?");
      in.replay = cp_ == nullptr ? given : by_position.index_select(0, in.pk.index);  // this rank's tokens
    }
    return in;
  }

  // (b, s, layers, k) from a micro-batch's routing, -1 at padding (and at layers not run here).
  // The routing each token of the batch took: (b, s, layers, k), -1 at padding.
  at::Tensor routing_of(const micro_input& in) const { return in.sequences().unpack(whole_stream(in.routed + 1, in)) - 1; }

  // Per-token values of this rank's tokens (T_cp, ...) -> the whole stream's (T, ...): gathered
  // over cp, the backward keeping this rank's rows (every cp rank computes the same loss from
  // them). The identity at cp = 1.
  at::Tensor whole_stream(const at::Tensor& mine, const micro_input& in) const {
    return cp_ == nullptr ? mine : gather_from_cp(mine, in.pk.ids.size(0), in.whole.tokens, *cp_, in.cp_places);
  }

  // A parameter as the layers use it: cast to the compute dtype (a no-op without mixed precision).
  at::Tensor w(const at::Tensor& p) const {
    return p.defined() && p.scalar_type() != compute_ ? p.to(compute_) : p;
  }

  // Outputs of the last stage, broadcast over the pipeline (inference with pp > 1).
  // Inference of micro-batches through the pipeline, overlapped across the stages; the last stage
  // broadcasts each micro-batch's outputs over the pipeline.
  std::vector<model_output> pipelined_inference(const std::vector<batch>& microbatches, const forward_options& o) {
    c10::NoGradGuard no_grad;
    const running_inputs running(inputs_);
    inputs_.reserve(microbatches.size());
    for (const batch& b : microbatches) inputs_.push_back(prepare(b));
    std::vector<model_output> out(microbatches.size());
    executor_.forward(*this, static_cast<std::int64_t>(microbatches.size()), [&](const at::Tensor& hidden, std::int64_t mb) {
      out[static_cast<std::size_t>(mb)] = head(hidden, inputs_[static_cast<std::size_t>(mb)], o);
    });
    for (std::size_t mb = 0; mb < out.size(); ++mb) {
      out[mb] = broadcast_outputs(out[mb], inputs_[mb], o);
      if (o.record_routing && routing_slots_ > 0) {
        // Each stage knows its own layers' routing: the sum over stages of (routing + 1), zero
        // where a layer ran elsewhere.
        at::Tensor all = routing_of(inputs_[mb]) + 1;
        groups_->pp->all_reduce(all);
        out[mb].routed_experts = all - 1;
      }
    }
    return out;
  }

  model_output broadcast_outputs(model_output out, const micro_input& in, const forward_options& o) {
    const std::int64_t b = in.pk.batch, s = in.pk.seq;
    const int root = static_cast<int>(pp_size_ - 1);
    auto share = [&](at::Tensor& t, std::vector<std::int64_t> shape, at::ScalarType dtype) {
      if (!t.defined()) t = at::zeros(shape, at::TensorOptions().dtype(dtype).device(device_));
      at::Tensor wire = t.to(dtype == at::kBool ? at::kByte : dtype).contiguous();  // Gloo has no bool
      groups_->pp->broadcast(wire, root);
      t = wire.to(dtype);
    };
    share(out.valid, {b, s}, at::kBool);
    if (cfg_.head.actor) {
      share(out.log_probs, {b, s}, at::kFloat);
      if (o.entropy) share(out.entropy, {b, s}, at::kFloat);
      if (o.return_logits) share(out.logits, {b, s, cfg_.s.vocab.get()}, at::kFloat);
    } else {
      share(out.values, {b, s}, at::kFloat);
    }
    return out;
  }

  // The chunk's layers; on the first stage from the token ids, else from `input`.
  at::Tensor run_chunk(std::int64_t chunk, const micro_input& in, const at::Tensor& input) {
    const invariant_scope arithmetic(invariant_);
    const chunk_info& ch = chunks_[static_cast<std::size_t>(chunk)];
    at::Tensor x = input;  // (T'/tp or T', h)
    if (ch.first_stage) {
      layer_context c = context(in, 0);
      x = embedding_dropout(embedding_->forward(in.pk.ids, c), c);
      // A frozen embedding under adapters: its output as a leaf that wants a gradient, so a
      // recomputed layer's adapters (whose inputs would otherwise want none) get theirs.
      if (lora_ != nullptr && at::GradMode::is_enabled() && !x.requires_grad()) x = x.detach().requires_grad_(true);
    }
    if (cfg_.l.recompute.get() != recompute_kind::full || !at::GradMode::is_enabled()) {
      for (std::int64_t i = 0; i < ch.count; ++i) x = decoder_layer(x, ch.first_layer + i, in);
      return x;
    }
    // Full recompute: each layer keeps its input only and runs again in the backward. The rerun
    // outlives this call (forward() returns before the caller's backward): it owns a copy of the
    // micro-batch's inputs (tensors shared, not copied).
    const auto kept = std::make_shared<const micro_input>(in);
    const auto offload = cfg_.options.offload_activations ? std::make_shared<activation_offload>(ch.count) : nullptr;
    for (std::int64_t i = 0; i < ch.count; ++i) {
      const std::int64_t layer = ch.first_layer + i;
      x = recompute_layer(
          [this, kept, layer](const at::Tensor& input) {
            // The rerun runs with grad mode on: side effects that must happen once (the
            // auxiliary losses' running total) are skipped there.
            const rerun_scope scope(run_.rerun, at::GradMode::is_enabled());
            const invariant_scope arithmetic(invariant_);
            return decoder_layer(input, layer, *kept);
          },
          x, offload, i);
    }
    return x;
  }

  // Final norm and head on the last stage: per-token outputs scattered back to (b, s).
  model_output head(const at::Tensor& hidden, const micro_input& in, const forward_options& o) {
    const invariant_scope arithmetic(invariant_);
    const shape& s = cfg_.s;
    const packed_tokens& pk = in.pk;
    const std::int64_t tokens = pk.tokens;  // real tokens (T); the stream has T' >= T rows
    layer_context final_context = context(in, s.layers.get());
    const at::Tensor x = final_norm_->forward(hidden, final_context);
    model_output out;
    if (o.record_routing && routing_slots_ > 0 && pp_size_ == 1) out.routed_experts = routing_of(in);
    if (cfg_.head.actor) {
      // The final norm's output on every tp rank, SP padding rows dropped before the LM head: (T, h).
      at::Tensor full = x;
      if constexpr (Tp) full = sp_ ? gather_from_sp(x, *tp_) : copy_to_tp(x, *tp_);
      if (full.size(0) != tokens) full = full.narrow(0, 0, tokens);
      if (pk.temperature.defined() && o.temperature != 1.0)
        throw std::invalid_argument("megadsl: the batch gives per-row temperatures and forward_options::temperature is " +
                                    std::to_string(o.temperature) + "; give one or the other");
      // The padded layout: the LM head and the log-softmax on the real tokens alone, as remove-
      // padding has them; padding positions' outputs are 0 either way (unpack), and their rows
      // were (T x V'/tp) logits, GEMMs and memory for nothing. (Every tp rank has the same rows.)
      at::Tensor labels = pk.labels.narrow(0, 0, tokens);
      at::Tensor temperature = pk.temperature.defined() ? pk.temperature.narrow(0, 0, tokens) : at::Tensor();
      at::Tensor real;  // (n,) the real tokens' rows of the stream; undefined: every row
      if (!pk.rmpad && !pk.no_padding && !o.return_logits && pk.token_valid.defined()) {
        real = pk.real_rows.defined() ? pk.real_rows : pk.token_valid.narrow(0, 0, tokens).nonzero().squeeze(1);
        full = full.index_select(0, real);
        labels = labels.index_select(0, real);
        if (temperature.defined()) temperature = temperature.index_select(0, real);
      }
      const std::int64_t rows_in = full.size(0);
      // The logits' transforms: Gemma2's soft-cap, the head's config key (blocks::lm_head; HF's
      // CausalLM output: Granite's logits / logits_scaling, Cohere's logits * logit_scale), then
      // the temperature, one or per row.
      const head_transform transform{s.final_softcap.get(), logit_scale_, logit_divides_, o.temperature, temperature};
      // Rows [first, first + n) of `full`: their logits, transformed.
      const auto logits_of = [&](std::int64_t first, std::int64_t n) {
        return head_logits(full, w(lm_head_), transform, first, n, invariant_);  // (n, V'/tp), compute dtype
      };
      const vocab_shard shard{tp_rank_ * lm_head_.size(0), s.vocab.get()};
      // Training chunks the head over the tokens (forward and backward) in blocks where its logits
      // would be more than lm_head_whole_max_elements, or as the call's or the model's
      // head_chunk_tokens says (model_options).
      const std::int64_t asked = o.head_chunk_tokens != 0 ? o.head_chunk_tokens : cfg_.options.head_chunk_tokens;
      if (asked < -1)
        throw std::invalid_argument("megadsl: head_chunk_tokens = " + std::to_string(asked) +
                                    "; use a chunk of tokens > 0, 0 (chunks where the logits would pass 1 GiB) or -1 (whole)");
      const std::int64_t block_rows = std::max<std::int64_t>(1, lm_head_chunk_elements / lm_head_.size(0));
      // 16-bit logits through the fused kernels hold a third of fp32's bytes a logit: chunks of the
      // same bytes hold 3x the rows (fewer passes over w's gradient).
      const bool fused_head = fused_kernels_take(at::empty({0}, at::TensorOptions().dtype(compute_).device(device_))) && !invariant_;
      const std::int64_t chunk = lm_head_training_chunk(rows_in, lm_head_.size(0), asked,
                                                        fused_head ? lm_head_fused_logit_bytes : lm_head_fp32_logit_bytes);
      at::Tensor logits;
      logprob_entropy le;
      if (at::GradMode::is_enabled() && !o.return_logits && chunk > 0) {
        le = chunked_head_logprob_entropy(full, w(lm_head_), labels, transform, shard, tp_group(), o.entropy, invariant_, chunk);
      } else if (at::GradMode::is_enabled() || o.return_logits) {
        logits = logits_of(0, rows_in);
        le = vocab_parallel_logprob_entropy(logits, labels, shard, tp_group(), o.entropy, invariant_);
      } else {
        // Inference: the LM head and the log-softmax a block of tokens at a time, so that the
        // whole (T, V'/tp) logits are never held at once.
        // Every tp rank has the same T and shard width, hence the same blocks and collectives.
        const std::int64_t rows = asked > 0 ? asked : block_rows;
        std::vector<at::Tensor> lp, ent;
        for (std::int64_t i = 0; i < rows_in; i += rows) {
          const std::int64_t n = std::min(rows, rows_in - i);
          const logprob_entropy part = vocab_parallel_logprob_entropy(logits_of(i, n), labels.narrow(0, i, n), shard,
                                                                      tp_group(), o.entropy, invariant_);
          lp.push_back(part.log_probs);
          if (o.entropy) ent.push_back(part.entropy);
        }
        const auto joined = [&](const std::vector<at::Tensor>& v) {
          return v.empty() ? at::zeros({0}, full.options().dtype(at::kFloat)) : at::cat(v);
        };
        le.log_probs = joined(lp);
        if (o.entropy) le.entropy = joined(ent);
      }
      if (real.defined()) {  // back to every row of the stream, 0 at padding (differentiable)
        const auto spread = [&](const at::Tensor& v) { return at::zeros({tokens}, v.options()).index_copy(0, real, v); };
        le.log_probs = spread(le.log_probs);
        if (o.entropy) le.entropy = spread(le.entropy);
      }
      const packed_tokens& whole = in.sequences();
      const at::Tensor label_ok = pk.label_valid.narrow(0, 0, tokens);
      out.log_probs = whole.unpack(whole_stream(le.log_probs * label_ok, in));
      out.valid = whole.unpack(whole.label_valid.narrow(0, 0, whole.tokens)).to(at::kBool);
      if (o.entropy) out.entropy = whole.unpack(whole_stream(le.entropy, in));
      if (o.return_logits) {
        at::Tensor full = logits;
        if constexpr (Tp) full = gather_from_tp_last(logits, *tp_);
        out.logits = whole.unpack(whole_stream(full.narrow(1, 0, s.vocab.get()).to(at::kFloat), in));
      }
    } else {
      at::Tensor v = linear_in(invariant_, x, w(value_w_), w(value_b_));  // (T'/tp or T', 1)
      if constexpr (Tp)
        if (sp_) v = gather_from_sp(v, *tp_, /*tensor_parallel_output_grad=*/false);
      const packed_tokens& whole = in.sequences();
      out.values = whole.unpack(whole_stream(v.narrow(0, 0, tokens).squeeze(1).to(at::kFloat), in));
      out.valid = whole.unpack(at::ones({whole.tokens}, at::TensorOptions().dtype(at::kBool).device(device_)));
    }
    return out;
  }

  // A source with fewer units than tp ranks (kv heads when kv_heads < tp) lives on several ranks,
  // each of which sees only the gradient from its own query heads: the copies' gradients (a fused
  // q/k/v's k and v rows, a k norm's weight per kv head) are summed, so they stay equal.
  void sum_replicas(const param_plan& p, at::Tensor& grad) {
    const row_geometry& g = p.geo;
    std::vector<at::Tensor> views;  // this rank's replicated pieces of the gradient
    std::int64_t units = 0;
    for (const shard_piece& x : shard_pieces(p, cfg_.s, cfg_.l, tp_rank_, piece_set::all)) {
      const geometry_source& src = g.sources[static_cast<std::size_t>(x.source)];
      if (!src.replicated_when_fewer || src.units >= tp_size_) continue;
      if (units != 0 && units != src.units)
        throw std::logic_error("megadsl: " + std::string(p.row->name) + ": replicated sources of different unit counts");
      units = src.units;
      views.push_back(grad.narrow(x.dim, x.local_offset, x.extent));
    }
    const at::Tensor mine = at::cat(views, p.split_dim);
    const at::Tensor all = tp_->all_gather(mine.contiguous().unsqueeze(0), 0);  // (tp, mine...)
    const std::int64_t my_unit = tp_rank_ * units / tp_size_;
    at::Tensor sum = at::zeros_like(mine);
    for (std::int64_t r = 0; r < tp_size_; ++r)
      if (r * units / tp_size_ == my_unit) sum += all[r];
    std::int64_t at = 0;
    for (at::Tensor& v : views) {
      v.copy_(sum.narrow(p.split_dim, at, v.size(p.split_dim)));
      at += v.size(p.split_dim);
    }
  }

  const comm_group* tp_group() const {
    if constexpr (Tp) return tp_;
    return nullptr;
  }

  // The context of layer `layer`'s blocks on micro-batch `in` (a view: it holds references). With
  // RoPE per layer type (Gemma 3, OLMo 3) a sliding layer takes the local RoPE: the config classes
  // key both by layer_types, so the sliding layers are the local ones.
  layer_context context(const micro_input& in, std::int64_t layer) {
    const bool local = in.local_rope.cos.defined() && cfg_.options.attention_window.of(layer) != 0;
    return layer_context{cfg_.s, cfg_.l, cfg_.options, tp_group(), tp_size_, tp_rank_, sp_, ep_, compute_,
                         in.pk, local ? in.local_rope : in.rope, layer, run_, in.replay, in.routed, cp_,
                         cp_ != nullptr ? &in.whole : nullptr, in.dropout.keys.defined() ? &in.dropout : nullptr,
                         lora_.get(), in.cp_places.defined() ? &in.cp_places : nullptr, ring_, ring_a2a_,
                         in.ring_rows.position.defined() ? &in.ring_rows : nullptr};
  }

  // One decoder layer: its module, built from the family's blocks.
  at::Tensor decoder_layer(const at::Tensor& x, std::int64_t layer, const micro_input& in) {
    layer_context c = context(in, layer);
    at::Tensor y = layers_[static_cast<std::size_t>(layer)]->forward(x, c);
    if (lora_ != nullptr) lora_->check_applied(layer);  // every adapter of the layer went through its linears
    return y;
  }

  bool holds(const param_row& row, param_instance inst) const {
    const std::int64_t layer = inst.layer;
    switch (row.where) {
      case placement::first_stage: return chunks_.front().first_stage;
      case placement::last_stage: return chunks_.back().last_stage;
      case placement::expert:
        if (inst.expert < first_expert_ || inst.expert >= first_expert_ + experts_per_rank_) return false;
        [[fallthrough]];
      case placement::layer:
        for (const chunk_info& c : chunks_)
          if (layer >= c.first_layer && layer < c.first_layer + c.count) return true;
        return false;
    }
    return false;
  }

  void build_parameters() {
    const shape& s = cfg_.s;
    const layout& l = cfg_.l;
    const bool sp = cfg_.l.sp.get();
    // Each held layer's parameters by local name, and the rest (embedding, final norm, heads).
    std::vector<module_params> layer_params(static_cast<std::size_t>(s.layers.get()));
    module_params outer;
    params_.reserve(plans_.count * static_cast<std::size_t>(s.layers.get()));
    for (const param_plan& p : plans_) {
      const param_row& row = *p.row;
      const std::int64_t count = instances(row, s);
      for (std::int64_t i_th = 0; i_th < count; ++i_th) {
        const param_instance inst = instance_of(row, s, i_th);
        if (!holds(row, inst) || !exists(row, s, i_th)) continue;
        const std::string name = with_instance(row.name, inst);
        // A tied lm_head sharing a rank with the embedding is the very same tensor (pp = 1).
        if (p.tied && chunks_.front().first_stage) {
          outer.add(name, outer.require("embed.weight"));
          continue;
        }
        std::vector<at::Tensor> hf;
        for (int i = 0; i < row.hf_count; ++i) {
          // A tied lm_head's copy (pp > 1) starts from the embedding's values.
          // Seeded by the HF tensor's name (an expert's slice of a stack: "name[e]").
          const std::string source = p.tied ? std::string(p.tied_source) : hf_key(row, i, inst);
          hf.push_back(init_full(source, p.hf_shapes[static_cast<std::size_t>(i)], cfg_.options,
                                 p.tied ? *find_row(arch_of(s), "embed.weight") : row));
        }
        at::Tensor t = shard_from_hf(p, s, l, tp_rank_, hf).to(device_).set_requires_grad(true);
        if (row.where == placement::layer || row.where == placement::expert) {
          const std::string prefix = "layers." + std::to_string(inst.layer) + ".";
          layer_params[static_cast<std::size_t>(inst.layer)].add(name.substr(prefix.size()), t);
        } else {
          outer.add(name, t);
        }
        // Each element once in the gradient norm: tp-sharded on every rank, replicated on tp rank 0.
        const bool counted = !p.tied && (p.split_dim >= 0 || tp_rank_ == 0);
        // Gradients that are partial per tp rank (summed over tp by finalize_grads): replicated
        // weights applied to SP shards, and the rows that say so (a per-head q/k norm applied to
        // each rank's own heads; a router or gate weighing outputs that are partial sums over tp).
        const bool partial = p.split_dim < 0 && (sp || (row.grad_partial_over_tp && tp_size_ > 1));
        params_.push_back({name, t, &p, partial, counted, inst});
      }
    }
    // The modules, bound to their parameters: each held layer, the embedding and the final norm.
    layers_.resize(static_cast<std::size_t>(s.layers.get()));
    expert_loads_.clear();
    const layer_plan_args args{s, l, cfg_.options, tp_rank_, first_expert_, experts_per_rank_, &expert_loads_};
    for (const chunk_info& c : chunks_)
      for (std::int64_t layer = c.first_layer; layer < c.first_layer + c.count; ++layer) {
        module_params& p = layer_params[static_cast<std::size_t>(layer)];
        p.layer = layer;
        layers_[static_cast<std::size_t>(layer)] = build_layer(p, args);
      }
    if (chunks_.front().first_stage) embedding_ = build_embedding(outer, args);
    if (chunks_.back().last_stage) {
      final_norm_ = build_final_norm(outer, args);
      lm_head_ = outer.find("lm_head.weight");
      if (const architecture& a = arch_of(cfg_.s); a.logit_scale >= 0) {
        logit_scale_ = setting(cfg_.s, a.settings[static_cast<std::size_t>(a.logit_scale)].key);
        logit_divides_ = a.logit_divides;
      }
      value_w_ = outer.find("value_head.weight");
      value_b_ = outer.find("value_head.bias");
    }
    // With pp > 1 a tied actor keeps the embedding on the first stage and a copy on the last.
    if (pp_size_ > 1 && cfg_.head.actor && s.tie_embeddings.get())
      for (auto& p : params_)
        if (p.plan->tied || p.plan->row->where == placement::first_stage) tied_end_ = &p;
  }

  runtime_config cfg_;
  param_list plans_;
  parallel_groups* groups_ = nullptr;
  std::int64_t pp_size_ = 1, pp_rank_ = 0;
  std::vector<chunk_info> chunks_;
  pipeline_executor executor_;
  std::vector<micro_input> inputs_;  // the micro-batches the executor is running
  named_parameter* tied_end_ = nullptr;  // this rank's end of a tied embedding across stages
  const comm_group* tp_ = nullptr;
  std::int64_t tp_size_ = 1, tp_rank_ = 0;
  const comm_group* cp_ = nullptr;  // null at cp = 1
  const comm_group* ring_ = nullptr;      // ring cp: the ring (cp_, or a2a+ring's ring group)
  const comm_group* ring_a2a_ = nullptr;  // a2a+ring: the all-to-all group before the ring
  std::int64_t cp_size_ = 1, cp_rank_ = 0;
  bool sp_ = false;
  at::Device device_ = at::kCPU;
  at::ScalarType compute_ = at::kFloat;
  std::int64_t routing_slots_ = 0;  // top_k of the routing a mixture records (0: no mixture)
  std::vector<expert_load*> expert_loads_;  // this rank's routers with an expert bias (their modules own them)
  const comm_group* ep_ = nullptr;  // the expert-parallel group (null at ep = 1)
  run_state run_;                   // training, recompute rerun, the auxiliary losses' scale and sum
  std::uint64_t training_calls_ = 0;  // forward_backward calls so far: each step's dropout salt
  bool invariant_ = false;            // layout::invariant (layers/invariant.hpp)
  struct rerun_scope {
    bool& flag;
    bool saved;
    rerun_scope(bool& f, bool on) : flag(f), saved(f) { flag = on; }
    ~rerun_scope() { flag = saved; }
    rerun_scope(const rerun_scope&) = delete;
    rerun_scope& operator=(const rerun_scope&) = delete;
  };
  std::int64_t experts_per_rank_ = 0, first_expert_ = 0;
  std::unique_ptr<layer_module> embedding_, final_norm_;  // on the first and the last stage
  at::Tensor lm_head_, value_w_, value_b_;               // (V'/tp, h); (1, h), (1)
  double logit_scale_ = 1;     // the LM head's config key's value (blocks::lm_head); 1: none
  bool logit_divides_ = false; // the logits divided by it, not multiplied
  std::vector<std::unique_ptr<layer_module>> layers_;     // by global layer; null where another stage holds it
  std::vector<named_parameter> params_;
  std::shared_ptr<lora_set> lora_;  // LoRA adapters on this rank's layers (layers/lora_linear.hpp); null: none
  std::vector<named_parameter> lora_params_;    // their tensors, what training updates (attach_lora)
  std::vector<std::int64_t> lora_replicas_;     // per lora_params_: a replicated kv head's unit count, else 0
};

}  // namespace

template <bool TensorParallel>
std::unique_ptr<model_core> make_model_core(const runtime_config& c, parallel_groups& g) {
  return std::make_unique<decoder_stage<TensorParallel>>(c, g);
}
template std::unique_ptr<model_core> make_model_core<true>(const runtime_config&, parallel_groups&);
template std::unique_ptr<model_core> make_model_core<false>(const runtime_config&, parallel_groups&);

}  // namespace megadsl::detail
