// A mixture's router slot (blocks::moe's first argument): how it picks and weighs each token's
// experts, its rows under the HF names the family binds, and its module (the router's own file).
// A router is a type with
//   static constexpr int lower(arch_builder&, const slot&)   its rows and its module's node
//   signature, signature_tail                                 its parts of the mixture's name
//   static constexpr void details(const shape&, basic_text<256>&)  its words in `describe`
//   static constexpr void hf_names(basic_text<256>&)               its HF tensors there
// and a family's own router lives with it (models/llama4/input_sigmoid_router.hpp).
#pragma once

#include <concepts>
#include <string_view>

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// A router's HF tensors, relative to its mixture's HF module, bound by the family: its weight
// (E, h), a bias on its logits (E) and an expert bias that selects only (E, or one row (1, E):
// expert_bias_form); empty: none.
struct router_names {
  std::string_view weight = "gate.weight";
  std::string_view bias = {};
  std::string_view expert_bias = {};
  hf_form expert_bias_form = hf_form::as_held;
};
inline constexpr router_names hf_router_names{};
// DeepSeek-V3's names, which GLM-4.5 and Kimi K2 share: the expert bias beside the gate.
inline constexpr router_names hf_grouped_router_names{.expert_bias = "gate.e_score_correction_bias"};

// What a router's module is told.
struct router_knobs {
  static constexpr std::string_view knobs_name = "router_knobs";
  bool fp32 = false;  // its logits in fp32 whatever the compute dtype
};

// A size in `describe`: the shape's, or -1 where it is not known yet.
constexpr std::int64_t shown(const dim& v) { return v.is_static() ? v.get() : std::int64_t{-1}; }
// A tensor name as `describe` abbreviates it ("gate.weight" -> "gate").
constexpr std::string_view stem(std::string_view hf) {
  return hf.ends_with(".weight") ? hf.substr(0, hf.size() - 7) : hf;
}

// The router's rows under `at` (its megadsl prefix `router`): the weight (replicated, its gradient
// partial over tp, since the experts' outputs it weighs are partial sums there), the logits' bias
// (the same), and the expert bias: it selects, never weighs, so no gradient reaches it (zero, and
// no weight decay on a vector, so AdamW leaves it as it is); the trainer's balancing update moves
// it (finalize_grads).
constexpr void router_rows(arch_builder& b, const slot& at, const router_names& n) {
  b.param(at, {"weight", &geo::router, {n.weight}, 1, presence::always, false, true});
  if (!n.bias.empty()) b.param(at, {"bias", &geo::expert_vector, {n.bias}, 1, presence::always, false, true});
  if (!n.expert_bias.empty())
    b.param(at, {"expert_bias", &geo::expert_vector, {n.expert_bias}, 1, presence::always, false, false,
                 param_init::zeros, false, 0, n.expert_bias_form});
}
constexpr void router_hf_names(basic_text<256>& t, const router_names& n) {
  t.add(stem(n.weight));
  if (!n.bias.empty()) t.add(", ", n.bias);
  if (!n.expert_bias.empty()) t.add(", ", n.expert_bias);
}

// HF's router (Mixtral, Qwen2/3-MoE, OLMoE, HunYuan, gpt-oss): softmax over every expert in fp32,
// the top k, renormalised per the shape's norm_topk (divided by their sum). With a
// bias on its logits (gpt-oss's router.bias): the top k of the logits weighed by a softmax over
// the k, the same numbers. Fp32: its logits in fp32 (HunYuan's wg).
template <const router_names& N = hf_router_names, bool Fp32 = false>
struct softmax_router {
  static_assert(N.expert_bias.empty(), "megadsl: a softmax router has no expert bias (grouped_sigmoid_router has one)");
  static_assert(!Fp32 || N.bias.empty(), "megadsl: a router in fp32 with a bias on its logits is not supported yet");
  static constexpr router_knobs knobs{Fp32};
  static constexpr std::string_view signature = "", signature_tail = Fp32 ? ", fp32_router" : "";
  static constexpr void details(const shape& s, basic_text<256>& t) {
    if constexpr (!N.bias.empty())
      t.add("router + bias -> top ", shown(s.top_k), " of ", shown(s.experts), ", softmax over them");
    else
      t.add("router softmax", Fp32 ? " (fp32)" : "", " -> top ", shown(s.top_k), " of ", shown(s.experts),
            s.norm_topk.is_static() && s.norm_topk.get() ? ", renormalised" : "");
  }
  static constexpr void hf_names(basic_text<256>& t) { router_hf_names(t, N); }
  static constexpr int lower(arch_builder& b, const slot& at) {
    router_rows(b, at, N);
    return b.node(at, &modules::softmax_router, {}, {}, {}, nullptr, knobs_of(knobs));
  }
};

// DeepSeek-V3's router (DeepSeek-V3, GLM-4.5, Kimi K2): sigmoid scores in fp32, the experts chosen
// by scores + an expert bias (selecting only, balanced by load in training) among the best
// topk_group of n_group groups, the chosen scores renormalised per norm_topk, times
// routed_scaling_factor. Those three are its own config keys; their defaults are the config
// class's, bound by the family (Glm4MoeConfig's here, DeepseekV3Config's 2.5, 8, 4 there).
struct grouped_router_defaults {
  double routed_scaling_factor = 1.0;
  double n_group = 1, topk_group = 1;
};
template <const router_names& N = hf_grouped_router_names, grouped_router_defaults D = grouped_router_defaults{}>
struct grouped_sigmoid_router {
  static_assert(!N.expert_bias.empty() && N.bias.empty(), "megadsl: the grouped sigmoid router has an expert bias and no bias on its logits");
  static constexpr config_setting scale_key{.key = "routed_scaling_factor", .fallback = D.routed_scaling_factor,
                                            .meaning = "the chosen experts' weights multiplied by it"};
  static constexpr config_setting groups_key{.key = "n_group", .fallback = D.n_group, .kind = setting_kind::integer,
                                             .least = 1, .meaning = "the experts in this many equal groups"};
  static constexpr config_setting group_top_k_key{.key = "topk_group", .fallback = D.topk_group,
                                                  .kind = setting_kind::integer, .least = 1,
                                                  .meaning = "a token's experts from its this many best groups"};
  static constexpr router_knobs knobs{true};
  static constexpr std::string_view signature = ", sigmoid_grouped", signature_tail = "";
  // Its three numbers (-1 while the settings are not known).
  static constexpr double of(const shape& s, const config_setting& c) { return s.settings.dynamic ? -1.0 : setting(s, c.key); }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add("router sigmoid + expert bias -> top ", shown(s.top_k), " of ", shown(s.experts), " in the best ",
          static_cast<std::int64_t>(of(s, group_top_k_key)), " of ", static_cast<std::int64_t>(of(s, groups_key)), " groups",
          s.norm_topk.is_static() && s.norm_topk.get() ? ", renormalised" : "", ", x ", of(s, scale_key));
  }
  // The experts split into n_group equal groups (each scored by its two best experts), a token's
  // top_k experts from its topk_group best groups.
  static constexpr void rule(const shape& s, const layout&, violations& out) {
    if (s.settings.dynamic || !s.experts.is_static() || !s.top_k.is_static()) return;
    const auto e = s.experts.get(), top_k = s.top_k.get();
    const auto g = static_cast<std::int64_t>(setting(s, groups_key.key)), k = static_cast<std::int64_t>(setting(s, group_top_k_key.key));
    if (e < 1) return;  // (moe_routing_valid names the count)
    if (g < 1 || e % g != 0 || (g > 1 && e / g < 2))
      out.add("moe_routing_valid", {g, e})
          .add("n_group = ", g, " does not split ", e, " experts into equal groups of at least 2; use a divisor of ", e,
               " (1: no groups)");
    else if (k < 1 || k > g || top_k > k * (e / g))
      out.add("moe_routing_valid", {k, g})
          .add("topk_group = ", k, " of ", g, " groups of ", e / g, " experts cannot hold top_k = ", top_k,
               "; use 1 <= topk_group <= ", g, " with topk_group * ", e / g, " >= top_k");
  }
  static constexpr void hf_names(basic_text<256>& t) { router_hf_names(t, N); }
  static constexpr int lower(arch_builder& b, const slot& at) {
    b.setting(scale_key);
    b.setting(groups_key);
    b.setting(group_top_k_key);
    b.rule(&rule);
    router_rows(b, at, N);
    return b.node(at, &modules::grouped_sigmoid_router, {}, {}, {}, nullptr, knobs_of(knobs));
  }
};

template <class R>
concept router_slot = requires(arch_builder& b, const slot& at, const shape& s, basic_text<256>& t) {
  { R::lower(b, at) } -> std::same_as<int>;
  { R::signature } -> std::convertible_to<std::string_view>;
  { R::signature_tail } -> std::convertible_to<std::string_view>;
  R::details(s, t);
  R::hf_names(t);
};

}  // namespace megadsl::blocks
