// A mixture of gated experts behind its router (the router slot's module, child 0: HF's softmax
// router, DeepSeek-V3's grouped sigmoid router with its expert bias, a family's own), with a
// shared expert (behind a sigmoid gate, Qwen2-MoE's, or ungated), Megatron's auxiliary losses and
// router replay. gpt-oss's experts: biases and the clamped SwiGLU.
// The whole stream on every tp rank (gathered under SP), its real tokens routed by the replicated
// router (the same routing on every tp rank), sent to their experts over the ep group, each
// expert this tp rank's shard of it; partial sums over tp until the reduction.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "megadsl/blocks/experts.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/layers/moe.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace {

class moe_mlp final : public layer_module {
 public:
  explicit moe_mlp(const block_build& b)
      : router_(b.child_as<router_module>(0)), shared_gate_up_(b.find("shared_expert.gate_up.weight")),
        shared_down_(b.find("shared_expert.down.weight")), shared_gate_(b.find("shared_expert_gate.weight")),
        act_(activation_fn_of(b.knobs<blocks::experts_knobs>().act)), k_(b.knobs<blocks::experts_knobs>()),
        alpha_(k_.clamped_swiglu ? b.setting("swiglu_alpha") : 0.0), limit_(k_.clamped_swiglu ? b.setting("swiglu_limit") : 0.0),
        tp_rank_(b.args.tp_rank), experts_(b.s().experts.get()), first_expert_(b.args.first_expert) {
    for (std::int64_t e = first_expert_; e < first_expert_ + b.args.experts_per_rank; ++e) {
      const std::string prefix = "experts." + std::to_string(e) + ".";
      gate_up_.push_back(b.require(prefix + "gate_up.weight"));
      down_.push_back(b.require(prefix + "down.weight"));
      if (const at::Tensor t = b.find(prefix + "gate_up.bias"); t.defined()) gate_up_bias_.push_back(t);
      if (const at::Tensor t = b.find(prefix + "down.bias"); t.defined()) down_bias_.push_back(t);
    }
  }

  at::Tensor forward(const at::Tensor& h2, layer_context& c) override {
    const std::int64_t tokens = c.tokens();
    const at::Tensor full = c.to_tp(h2);                                        // (T', h)
    const std::int64_t stream = full.size(0);
    const at::Tensor x = stream != tokens ? full.narrow(0, 0, tokens) : full;  // (T, h): SP padding rows stay out
    const at::Tensor logits = router_->logits(x, c);  // (T, E)
    routing r = router_->route(logits);                // (T, k) each
    if (c.replay.defined()) {
      // Router replay: the given experts (the live ones where a position holds -1), weighted by
      // the live router's probabilities for them, renormalised (and scaled) as the live top-k would be.
      const at::Tensor given = c.replay.select(1, c.layer);  // (T, k)
      const at::Tensor live = given.select(1, 0).lt(0).unsqueeze(1);
      r.indices = at::where(live, r.indices, given);
      r.weights = router_->weights_of(logits, r.indices);
    }
    c.routed.select(1, c.layer).copy_(r.indices);
    // The balancing counts: this rank's real tokens per expert, in training forwards, once.
    if (expert_load* load = router_->load(); load != nullptr && c.run.training && !c.run.rerun) {
      const at::Tensor valid = c.pk.token_valid.narrow(0, 0, tokens).to(at::kDouble).unsqueeze(1).expand_as(r.indices);
      load->tokens.index_add_(0, r.indices.reshape({-1}), valid.reshape({-1}).to(load->tokens.device()));
    }
    const bool invariant = c.l.invariant.get();
    const model_options& o = c.options;
    const bool aux = c.run.training && (o.moe_aux_loss_coeff != 0 || o.moe_z_loss_coeff != 0);
    std::vector<at::Tensor> gate_up, down;
    for (const at::Tensor& t : gate_up_) gate_up.push_back(c.w(t));
    for (const at::Tensor& t : down_) down.push_back(c.w(t));
    local_experts mine{experts_, first_expert_, std::move(gate_up), std::move(down)};
    mine.invariant = invariant;
    for (const at::Tensor& t : gate_up_bias_) mine.gate_up_bias.push_back(c.w(t));
    // The experts' outputs are partial sums over tp: their down bias is added on tp rank 0 only
    // (times 0 elsewhere, so that every rank's gradient of it is defined: 0 there).
    for (const at::Tensor& t : down_bias_) mine.down_bias.push_back(tp_rank_ == 0 ? c.w(t) : c.w(t) * 0);
    if (k_.clamped_swiglu)
      mine.glu = [alpha = alpha_, limit = limit_](const at::Tensor& gate_up) { return clamped_swiglu(gate_up, alpha, limit); };
    // Invariant arithmetic: the experts' and the shared expert's down projections by chunks of their
    // intermediate size, summed over tp in invariant_chunk_sum's tree before the combine: y whole
    // on every tp rank, no reduction after.
    const std::int64_t chunks = invariant ? invariant_k_chunks / (c.tp != nullptr ? c.tp->size() : 1) : 0;
    mine.chunks = chunks;
    mine.chunk_group = c.tp;
    if (c.lora != nullptr) {  // the experts' adapters (PEFT's target_parameters), each beside its expert
      std::vector<const std::vector<lora_shard>*> up_adapters, down_adapters;
      bool any = false;
      for (std::size_t j = 0; j < gate_up_.size(); ++j) {
        up_adapters.push_back(c.lora->use(gate_up_[j]));
        down_adapters.push_back(c.lora->use(down_[j]));
        any = any || up_adapters.back() != nullptr || down_adapters.back() != nullptr;
      }
      if (any)
        mine.adapt = [&c, up = std::move(up_adapters), down = std::move(down_adapters)](std::size_t j, bool is_down, const at::Tensor& in,
                                                                                       const at::Tensor& y) {
          const std::vector<lora_shard>* a = is_down ? down[j] : up[j];
          return a != nullptr ? with_lora(y, in, *a, c) : y;
        };
    }
    at::Tensor y = moe_experts(x, r, mine, act_, c.ep);  // (T, h): partial over tp, or whole (invariant)
    if (shared_gate_up_.defined()) {  // + shared(x): behind sigmoid(gate(x)) (Qwen2-MoE) or ungated (DeepSeek)
      const at::Tensor inner = gated(c.linear(x, shared_gate_up_), act_);  // (T, fs/tp)
      const at::Tensor shared = invariant ? invariant_chunk_sum(invariant_subtree_linear(inner, c.w(shared_down_), chunks).unsqueeze(0), c.tp, false)
                                          : c.linear(inner, shared_down_);
      y = shared_gate_.defined() ? y + pointwise(c.linear(x, shared_gate_), [](const at::Tensor& t) { return at::sigmoid(t); }) * shared : y + shared;
    }
    if (aux) y = attach_loss(y, auxiliary_losses(logits, r, c, *router_));
    if (stream != tokens) y = at::constant_pad_nd(y, {0, 0, 0, stream - tokens});  // (T', h)
    if (invariant) return c.tp != nullptr && c.sp ? scatter_to_sp(y, *c.tp) : y;
    return c.from_tp(y);
  }

 private:
  // This layer's auxiliary losses over the micro-batch's real tokens, scaled (run.aux_scale).
  static at::Tensor auxiliary_losses(const at::Tensor& local_logits, const routing& r, layer_context& c, const router_module& router) {
    const model_options& o = c.options;
    const packed_tokens& pk = c.sequences();
    at::Tensor logits = local_logits, indices = r.indices;  // (T, E), (T, k)
    if (c.cp != nullptr) {
      // Over the whole stream: every cp rank computes the same losses, and each one's gradient
      // reaches the router through its own tokens' logits (the gather's backward keeps its rows).
      const at::Tensor places = c.cp_places != nullptr ? *c.cp_places : at::Tensor();
      logits = gather_from_cp(local_logits, c.pk.ids.size(0), pk.tokens, *c.cp, places);
      indices = gather_from_cp(r.indices, c.pk.ids.size(0), pk.tokens, *c.cp, places);
    }
    const at::Tensor valid = pk.token_valid;  // (T) 0/1: the padded path runs padding positions too
    at::Tensor loss = at::zeros({}, logits.options().dtype(at::kFloat));
    if (o.moe_aux_loss_coeff != 0) {
      const at::Tensor probs = router.balance_probs(logits);
      const at::Tensor balance =
          o.moe_aux_loss_per_sequence
              ? sequence_load_balancing_loss(probs, indices, valid, at::floor_divide(pk.index, pk.seq), pk.batch)
              : switch_load_balancing_loss(probs, indices, valid);
      loss = loss + o.moe_aux_loss_coeff * balance;
    }
    if (o.moe_z_loss_coeff != 0) loss = loss + o.moe_z_loss_coeff * router_z_loss(logits, valid);
    loss = loss * c.run.aux_scale;
    // Once per forward, not again in a recompute; each cp rank holds the whole value.
    if (!c.run.rerun) c.run.aux_total += loss.detach().to(at::kDouble) / static_cast<double>(c.cp ? c.cp->size() : 1);
    return loss;
  }

  std::unique_ptr<router_module> router_;
  std::vector<at::Tensor> gate_up_, down_;               // this rank's experts: (2 f/tp, h), (h, f/tp)
  std::vector<at::Tensor> gate_up_bias_, down_bias_;     // their biases (gpt-oss): (2 f/tp), (h) replicated; or none
  at::Tensor shared_gate_up_, shared_down_, shared_gate_;  // the shared expert (undefined: none; no gate: ungated)
  activation_fn act_;
  blocks::experts_knobs k_;  // the experts' activation or clamped SwiGLU, as the block says
  double alpha_ = 0, limit_ = 0;
  std::int64_t tp_rank_ = 0;
  std::int64_t experts_ = 0, first_expert_ = 0;  // in the layer; this ep rank's first
};

}  // namespace

std::unique_ptr<block_module> modules::moe_mlp(const block_build& b) { return std::make_unique<megadsl::moe_mlp>(b); }

}  // namespace megadsl
