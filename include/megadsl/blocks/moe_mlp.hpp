// The mixture of experts: routers, experts (split or stacked HF storage), shared experts.
#pragma once

#include "megadsl/blocks/gated_mlp.hpp"

namespace megadsl::blocks {

struct moe_knobs {
  moe_names names = moe_names::qwen;  // Mixtral's or Qwen's HF tensor names
  bool shared_expert = false;         // Qwen2-MoE's shared expert and its sigmoid gate
  moe_router router = moe_router::softmax;
  bool shared_experts = false;        // DeepSeek's ungated shared experts (mlp.shared_experts.*), added
  bool fp32_router = false;           // the softmax router's logits in fp32 whatever the compute dtype (HunYuan's wg)
};

// A mixture of gated experts behind a top-k router: the shape gives experts, top_k, expert_ffn,
// norm_topk (and shared_expert_ffn). Experts split over ep (whole experts) and each expert over
// etp = tp like a gated MLP; tokens travel to their experts by all-to-all (layers/moe.hpp). The
// router is replicated; under tp its gradient is summed over tp, since the experts' outputs it
// weighs are partial sums there.
// What the mixture's module is told: the experts' activation and what the block's knobs and names
// decide of the router and the experts.
struct moe_module_knobs {
  static constexpr std::string_view knobs_name = "moe_module_knobs";
  activation act = activation::silu;
  bool fp32_router = false;     // the softmax router's logits in fp32 (HunYuan)
  bool clamped_swiglu = false;  // gpt-oss's experts (the block's own keys swiglu_alpha, swiglu_limit)
  bool input_router = false;    // Llama 4: top-k of the logits, the experts' input scaled by sigmoid(logit)
  bool biased_softmax = false;  // ERNIE 4.5: softmax scores, the expert bias added to select only
};

template <activation A = activation::silu, moe_knobs K = moe_knobs{}>
struct moe_mlp {
  static constexpr bool mixtral = K.names == moe_names::mixtral;
  static constexpr bool gpt_oss = K.names == moe_names::gpt_oss;
  // gpt-oss's experts' clamped SwiGLU, its config.json keys (GptOssExperts' alpha and limit): gate
  // <= limit, up in [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate).
  static constexpr config_setting swiglu_alpha{.key = "swiglu_alpha", .fallback = 1.702, .least = 1e-6,
                                               .meaning = "the clamped SwiGLU's sigmoid(alpha * gate)"};
  static constexpr config_setting swiglu_limit{.key = "swiglu_limit", .fallback = 7.0, .least = 1e-6,
                                               .meaning = "the experts clamp gate and up to [-limit, limit]"};
  static constexpr bool llama4 = K.names == moe_names::llama4;
  static constexpr moe_module_knobs knobs{A, K.fp32_router, gpt_oss, llama4, K.router == moe_router::softmax_biased};
  static constexpr void details(const shape& s, basic_text<256>& t) {
    const auto known = [](const dim& v) { return v.is_static() ? v.get() : std::int64_t{-1}; };
    if constexpr (gpt_oss)
      t.add("  router + bias -> top ", known(s.top_k), " of ", known(s.experts),
            ", softmax over them; experts clamped SwiGLU + biases  [mlp: router, experts.{gate_up,down}_proj(_bias), stacked]");
    else if constexpr (K.router == moe_router::sigmoid_on_input)
      t.add("  router -> top ", known(s.top_k), " of ", known(s.experts),
            ", each expert fed x * sigmoid(logit); + shared gated_mlp  [feed_forward: router, experts.{gate_up,down}_proj "
            "stacked, shared_expert]");
    else if constexpr (K.router == moe_router::sigmoid_grouped)
      t.add("  router sigmoid + expert bias -> top ", known(s.top_k), " of ", known(s.experts), " in the best ",
            known(s.group_top_k), " of ", known(s.expert_groups), " groups",
            s.norm_topk.is_static() && s.norm_topk.get() ? ", renormalised" : "", ", x ", s.routed_scale.is_static() ? s.routed_scale.get() : -1.0,
            "  [mlp: gate (+ e_score_correction_bias), experts.E.gate/up/down_proj]");
    else if constexpr (K.router == moe_router::softmax_biased)
      t.add("  router softmax (fp32) + expert bias -> top ", known(s.top_k), " of ", known(s.experts),
            ", unbiased scores renormalised  [mlp: gate, moe_statics.e_score_correction_bias, experts.E.gate/up/down_proj]");
    else
      t.add("  router softmax -> top ", known(s.top_k), " of ", known(s.experts),
            s.norm_topk.is_static() && s.norm_topk.get() ? ", renormalised" : "",
            mixtral ? "  [block_sparse_moe: gate, experts.E.w1/w3/w2]"
            : K.names == moe_names::hunyuan ? (K.fp32_router ? " (fp32)  [mlp: gate.wg, experts.E.gate/up/down_proj]"
                                                             : "  [mlp: gate.wg, experts.E.gate/up/down_proj]")
                                            : "  [mlp: gate, experts.E.gate/up/down_proj]");
    if (K.shared_expert) t.add("; + sigmoid(gate(x)) * shared gated_mlp  [mlp: shared_expert, shared_expert_gate]");
    if (K.shared_experts && !(s.shared_expert_ffn.is_static() && s.shared_expert_ffn.get() == 0))
      t.add("; + shared experts' gated_mlp  [mlp: shared_experts]");
    if (K.names == moe_names::hunyuan) t.add("; + shared gated_mlp  [mlp: shared_mlp]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    if constexpr (gpt_oss) {
      b.setting(swiglu_alpha);
      b.setting(swiglu_limit);
    }
    const slot at = layer.module(mixtral ? "block_sparse_moe" : llama4 ? "feed_forward" : "mlp");
    static_assert(llama4 == (K.router == moe_router::sigmoid_on_input) && (!llama4 || (!K.shared_expert && !K.shared_experts && !K.fp32_router)),
                  "megadsl: Llama 4's mixture is its router on the experts' input with its own ungated shared expert");
    static_assert(!(K.shared_expert && K.shared_experts), "megadsl: a mixture has Qwen's gated shared expert or DeepSeek's shared experts, not both");
    static_assert(!(K.names == moe_names::hunyuan && (K.shared_expert || K.shared_experts)),
                  "megadsl: HunYuan's names include its ungated shared MLP (mlp.shared_mlp); set no other shared expert");
    static_assert(!gpt_oss || (!K.shared_expert && !K.shared_experts && K.router == moe_router::softmax && !K.fp32_router),
                  "megadsl: gpt-oss's mixture is its softmax router with a bias and no shared expert");
    static_assert((K.names == moe_names::ernie) == (K.router == moe_router::softmax_biased) &&
                      (K.router != moe_router::softmax_biased || K.fp32_router),
                  "megadsl: ERNIE 4.5's names hold its biased softmax router, whose logits are in fp32");
    b.param(at, {"router.weight", &geo::router,
                 {K.names == moe_names::hunyuan ? "gate.wg.weight" : gpt_oss || llama4 ? "router.weight" : "gate.weight"}, 1,
                 presence::always, false, true});
    if constexpr (gpt_oss)  // applied on every tp rank alike: replicated, its gradient partial over tp like the weight's
      b.param(at, {"router.bias", &geo::expert_vector, {"router.bias"}, 1, presence::always,
                   false, true});
    // The expert bias selects, never weighs: no gradient reaches it (zero, and no weight decay on a
    // vector, so AdamW leaves it as it is); the trainer's balancing update moves it (finalize_grads).
    if constexpr (K.router == moe_router::sigmoid_grouped)
      b.param(at, {"router.expert_bias", &geo::expert_vector, {"gate.e_score_correction_bias"}, 1,
                   presence::always, false, false, param_init::zeros});
    if constexpr (K.router == moe_router::softmax_biased)  // (1, E) in HF's file
      b.param(at, {"router.expert_bias", &geo::expert_vector, {"moe_statics.e_score_correction_bias"}, 1, presence::always,
                   false, false, param_init::zeros, false, 0, hf_form::one_row});
    if constexpr (gpt_oss) {
      // One tensor per layer and projection holds every expert (HF's stored layout, no converter):
      // gate_up_proj (E, h, 2 f) with gate and up columns interleaved, down_proj (E, f, h), and
      // their biases (E, 2 f) interleaved alike and (E, h). The down bias is added once (tp rank 0:
      // the experts' outputs are partial sums over tp), its gradient summed over tp.
      b.param(at, {"experts.{expert}.gate_up.weight", &geo::gate_up<&geo::expert_ffn, false>, {"experts.gate_up_proj"}, 1,
                   presence::always, true, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts_interleaved});
      b.param(at, {"experts.{expert}.gate_up.bias", &geo::gate_up<&geo::expert_ffn, true>, {"experts.gate_up_proj_bias"}, 1,
                   presence::always, true, false, param_init::zeros, true, 0, hf_form::as_held, hf_stacking::experts_interleaved});
      b.param(at, {"experts.{expert}.down.weight", &geo::down<&geo::expert_ffn>, {"experts.down_proj"}, 1,
                   presence::always, false, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts});
      b.param(at, {"experts.{expert}.down.bias", &geo::hidden, {"experts.down_proj_bias"}, 1,
                   presence::always, false, true, param_init::zeros, true, 0, hf_form::as_held, hf_stacking::experts});
    } else if constexpr (llama4) {
      // Stacked like gpt-oss's, without biases: gate_up_proj (E, h, 2 f) with the gate's columns
      // first, then the up's; down_proj (E, f, h).
      b.param(at, {"experts.{expert}.gate_up.weight", &geo::gate_up<&geo::expert_ffn, false>, {"experts.gate_up_proj"}, 1,
                   presence::always, true, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts});
      b.param(at, {"experts.{expert}.down.weight", &geo::down<&geo::expert_ffn>, {"experts.down_proj"}, 1,
                   presence::always, false, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts});
      b.param(at, {"shared_expert.gate_up.weight", &geo::gate_up<&geo::shared_ffn, false>,
                   {"shared_expert.gate_proj.weight", "shared_expert.up_proj.weight"}, 2});
      b.param(at, {"shared_expert.down.weight", &geo::down<&geo::shared_ffn>, {"shared_expert.down_proj.weight"}, 1});
    } else if constexpr (mixtral) {
      b.param(at, {"experts.{expert}.gate_up.weight", &geo::gate_up<&geo::expert_ffn, false>,
                   {"experts.{expert}.w1.weight", "experts.{expert}.w3.weight"}, 2,
                   presence::always, false, false, param_init::normal, true});
      b.param(at, {"experts.{expert}.down.weight", &geo::down<&geo::expert_ffn>, {"experts.{expert}.w2.weight"}, 1,
                   presence::always, false, false, param_init::normal, true});
    } else {
      b.param(at, {"experts.{expert}.gate_up.weight", &geo::gate_up<&geo::expert_ffn, false>,
                   {"experts.{expert}.gate_proj.weight", "experts.{expert}.up_proj.weight"}, 2,
                   presence::always, false, false, param_init::normal, true});
      b.param(at, {"experts.{expert}.down.weight", &geo::down<&geo::expert_ffn>, {"experts.{expert}.down_proj.weight"}, 1,
                   presence::always, false, false, param_init::normal, true});
    }
    if constexpr (K.shared_expert) {
      b.param(at, {"shared_expert.gate_up.weight", &geo::gate_up<&geo::shared_ffn, false>,
                   {"shared_expert.gate_proj.weight", "shared_expert.up_proj.weight"}, 2});
      b.param(at, {"shared_expert.down.weight", &geo::down<&geo::shared_ffn>, {"shared_expert.down_proj.weight"}, 1});
      // Applied to the whole (gathered) input on every tp rank: replicated, its gradient partial
      // per tp rank (it scales the shared expert's partial sums).
      b.param(at, {"shared_expert_gate.weight", &geo::one_row, {"shared_expert_gate.weight"}, 1,
                   presence::always, false, true});
    }
    if constexpr (K.names == moe_names::hunyuan) {  // the same rows under HunYuan's names, without a gate
      b.param(at, {"shared_expert.gate_up.weight", &geo::gate_up<&geo::shared_ffn, false>,
                   {"shared_mlp.gate_proj.weight", "shared_mlp.up_proj.weight"}, 2});
      b.param(at, {"shared_expert.down.weight", &geo::down<&geo::shared_ffn>, {"shared_mlp.down_proj.weight"}, 1});
    }
    if constexpr (K.shared_experts) {  // the same rows under DeepSeek's names, without a gate; none at width 0
      b.param(at, {"shared_expert.gate_up.weight", &geo::gate_up<&geo::shared_ffn, false>,
                   {"shared_experts.gate_proj.weight", "shared_experts.up_proj.weight"}, 2,
                   presence::shared_experts});
      b.param(at, {"shared_expert.down.weight", &geo::down<&geo::shared_ffn>, {"shared_experts.down_proj.weight"}, 1,
                   presence::shared_experts});
    }
    if constexpr (!gpt_oss) b.uses(A);  // gpt-oss's experts apply their clamped SwiGLU whatever hidden_act says
    b.routes = true;
    basic_text<64> name("moe_mlp<");
    // (ERNIE's names say its router: the two go together.)
    name.add(gpt_oss ? std::string_view("clamped_swiglu") : name_of(A),
             mixtral ? ", mixtral" : K.names == moe_names::hunyuan ? ", hunyuan" : gpt_oss ? ", gpt_oss" : llama4 ? ", llama4"
             : K.names == moe_names::ernie ? ", ernie" : ", qwen",
             K.shared_expert ? ", shared" : "",
             K.router == moe_router::sigmoid_grouped ? ", sigmoid_grouped" : K.router == moe_router::sigmoid_on_input ? ", sigmoid_on_input" : "",
             K.shared_experts ? ", shared_experts" : "",
             K.fp32_router ? ", fp32_router" : "", ">");
    basic_text<64> label("moe_mlp<");
    label.add(gpt_oss ? std::string_view("clamped_swiglu") : name_of(A), ">");
    // The dense MLP's estimate (the paper has no mixture): the experts' activations per token are
    // top_k of them, each narrower.
    return b.costs(b.node(at, &modules::moe_mlp, {}, name.view(), label.view(), &details,
                          knobs_of(knobs)),
                   mlp_keeps);
  }
};

}  // namespace megadsl::blocks
