// A mixture of gated experts behind HF's softmax top-k router (Mixtral, Qwen2-MoE, Qwen3-MoE) or
// DeepSeek-V3's grouped sigmoid router with its expert bias (DeepSeek-V3, GLM-4.5; the bias counted
// and balanced in finalize_grads), with Qwen2-MoE's shared expert behind a sigmoid gate or
// DeepSeek's ungated shared experts, Megatron's auxiliary losses and router replay. gpt-oss's
// mixture: the router with a bias (its logits' top k, weighed by a softmax over the k: the
// renormalised top k of the softmax over all), experts with biases and the clamped SwiGLU. Llama
// 4's: the top k of the logits, each chosen expert fed the token times sigmoid(logit), and its
// ungated shared expert on the token as it is. ERNIE 4.5's: softmax scores in fp32, chosen with an
// expert bias (balanced like DeepSeek's), the unbiased scores renormalised with a floor.
// The whole stream on every tp rank (gathered under SP), its real tokens routed by the replicated
// router (the same routing on every tp rank), sent to their experts over the ep group, each
// expert this tp rank's shard of it; partial sums over tp until the reduction.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "megadsl/blocks/moe_mlp.hpp"  // its knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/moe.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace {

// The router's and this ep rank's experts' numbers.
struct moe_settings {
  std::int64_t experts = 0, top_k = 0;
  bool norm_topk = false;
  double sum_floor = 0;  // the softmax routers' renormalisation: divided by max(sum, this)
  std::int64_t first_expert = 0, experts_per_rank = 0;  // this ep rank's experts
  std::int64_t groups = 1, group_top_k = 1;              // the sigmoid router's
  double scale = 1.0;
};

class moe_mlp final : public layer_module {
 public:
  explicit moe_mlp(const block_build& b)
      : router_(b.require("router.weight")), router_bias_(b.find("router.bias")),
        shared_gate_up_(b.find("shared_expert.gate_up.weight")),
        shared_down_(b.find("shared_expert.down.weight")), shared_gate_(b.find("shared_expert_gate.weight")),
        act_(activation_fn_of(b.knobs<blocks::moe_module_knobs>().act)),
        k_(b.knobs<blocks::moe_module_knobs>()), alpha_(k_.clamped_swiglu ? b.setting("swiglu_alpha") : 0.0),
        limit_(k_.clamped_swiglu ? b.setting("swiglu_limit") : 0.0), tp_rank_(b.args.tp_rank),
        s_{b.s().experts.get(), b.s().top_k.get(), b.s().norm_topk.get(), b.s().topk_sum_floor.get(), b.args.first_expert, b.args.experts_per_rank,
           b.s().expert_groups.get(), b.s().group_top_k.get(), b.s().routed_scale.get()} {
    if (const at::Tensor bias = b.find("router.expert_bias"); bias.defined()) {
      load_.bias = bias;
      load_.tokens = at::zeros({s_.experts}, bias.options().dtype(at::kDouble));
      if (b.args.expert_loads != nullptr) b.args.expert_loads->push_back(&load_);
    }
    for (std::int64_t e = s_.first_expert; e < s_.first_expert + s_.experts_per_rank; ++e) {
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
    const bool sigmoid = load_.bias.defined() && !k_.biased_softmax;
    // The sigmoid router in fp32 (HF casts x and the weight), the softmax router in the compute dtype
    // (in fp32 where the block says so: HunYuan's wg, ERNIE's gate).
    const bool invariant = c.l.invariant.get();
    const at::Tensor logits = sigmoid || k_.fp32_router ? linear_in(invariant, x.to(at::kFloat), router_.to(at::kFloat))  // (T, E)
                                                      : c.linear(x, router_, router_bias_);
    routing r = sigmoid        ? route_sigmoid_grouped(logits, load_.bias.detach(), s_.top_k, s_.groups, s_.group_top_k,
                                                       s_.norm_topk, s_.scale)
                : k_.input_router ? route_sigmoid_on_input(logits, s_.top_k)
                : k_.biased_softmax ? route_softmax_biased(logits, load_.bias.detach(), s_.top_k, s_.sum_floor)
                               : route(logits, s_.top_k, s_.norm_topk, s_.sum_floor);  // (T, k) each
    if (c.replay.defined()) {
      // Router replay: the given experts (the live ones where a position holds -1), weighted by
      // the live router's probabilities for them, renormalised (and scaled) as the live top-k would be.
      const at::Tensor given = c.replay.select(1, c.layer);  // (T, k)
      const at::Tensor live = given.select(1, 0).lt(0).unsqueeze(1);
      r.indices = at::where(live, r.indices, given);
      if (sigmoid) {
        r.weights = sigmoid_weights(logits, r.indices, s_.norm_topk, s_.scale);
      } else if (k_.input_router) {
        r.weights = sigmoid_weights(logits, r.indices, false, 1.0);
      } else {
        r.weights = softmax_weights(logits, r.indices, s_.norm_topk, s_.sum_floor);
      }
    }
    c.routed.select(1, c.layer).copy_(r.indices);
    // The balancing counts: this rank's real tokens per expert, in training forwards, once.
    if (load_.bias.defined() && c.run.training && !c.run.rerun) {
      const at::Tensor valid = c.pk.token_valid.narrow(0, 0, tokens).to(at::kDouble).unsqueeze(1).expand_as(r.indices);
      load_.tokens.index_add_(0, r.indices.reshape({-1}), valid.reshape({-1}).to(load_.tokens.device()));
    }
    const model_options& o = c.options;
    const bool aux = c.run.training && (o.moe_aux_loss_coeff != 0 || o.moe_z_loss_coeff != 0);
    std::vector<at::Tensor> gate_up, down;
    for (const at::Tensor& t : gate_up_) gate_up.push_back(c.w(t));
    for (const at::Tensor& t : down_) down.push_back(c.w(t));
    local_experts mine{s_.experts, s_.first_expert, std::move(gate_up), std::move(down)};
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
    at::Tensor y = moe_experts(x, r, mine, act_, c.ep);  // (T, h): partial over tp, or whole (invariant)
    if (shared_gate_up_.defined()) {  // + shared(x): behind sigmoid(gate(x)) (Qwen2-MoE) or ungated (DeepSeek)
      const at::Tensor inner = gated(c.linear(x, shared_gate_up_), act_);  // (T, fs/tp)
      const at::Tensor shared = invariant ? invariant_chunk_sum(invariant_subtree_linear(inner, c.w(shared_down_), chunks).unsqueeze(0), c.tp, false)
                                          : c.linear(inner, shared_down_);
      y = shared_gate_.defined() ? y + pointwise(c.linear(x, shared_gate_), [](const at::Tensor& t) { return at::sigmoid(t); }) * shared : y + shared;
    }
    if (aux) y = attach_loss(y, auxiliary_losses(logits, r, c, sigmoid || k_.input_router));
    if (stream != tokens) y = at::constant_pad_nd(y, {0, 0, 0, stream - tokens});  // (T', h)
    if (invariant) return c.tp != nullptr && c.sp ? scatter_to_sp(y, *c.tp) : y;
    return c.from_tp(y);
  }

 private:
  // This layer's auxiliary losses over the micro-batch's real tokens, scaled (run.aux_scale).
  static at::Tensor auxiliary_losses(const at::Tensor& local_logits, const routing& r, layer_context& c, bool sigmoid) {
    const model_options& o = c.options;
    const packed_tokens& pk = c.sequences();
    at::Tensor logits = local_logits, indices = r.indices;  // (T, E), (T, k)
    if (c.cp != nullptr) {
      // Over the whole stream: every cp rank computes the same losses, and each one's gradient
      // reaches the router through its own tokens' logits (the gather's backward keeps its rows).
      logits = gather_from_cp(local_logits, c.pk.ids.size(0), pk.tokens, *c.cp);
      indices = gather_from_cp(r.indices, c.pk.ids.size(0), pk.tokens, *c.cp);
    }
    const at::Tensor valid = pk.token_valid;  // (T) 0/1: the padded path runs padding positions too
    at::Tensor loss = at::zeros({}, logits.options().dtype(at::kFloat));
    if (o.moe_aux_loss_coeff != 0) {
      const at::Tensor probs = sigmoid ? sigmoid_balance_probs(logits) : at::softmax(logits, -1, at::kFloat);
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

  at::Tensor router_;                                    // (E, h) replicated, gradient partial over tp
  at::Tensor router_bias_;                               // (E) the same (gpt-oss's; undefined: none)
  std::vector<at::Tensor> gate_up_, down_;               // this rank's experts: (2 f/tp, h), (h, f/tp)
  std::vector<at::Tensor> gate_up_bias_, down_bias_;     // their biases (gpt-oss): (2 f/tp), (h) replicated; or none
  at::Tensor shared_gate_up_, shared_down_, shared_gate_;  // the shared expert (undefined: none; no gate: DeepSeek's)
  activation_fn act_;
  blocks::moe_module_knobs k_;  // the router's kind and the experts' SwiGLU, as the block says
  double alpha_ = 0, limit_ = 0;
  std::int64_t tp_rank_ = 0;
  moe_settings s_;
  expert_load load_;  // the router's expert bias (E) fp32 and its counts (undefined: a router without one)
};

}  // namespace

std::unique_ptr<block_module> modules::moe_mlp(const block_build& b) { return std::make_unique<megadsl::moe_mlp>(b); }

}  // namespace megadsl
