// A mixture's experts and shared-expert slots (blocks::moe's second and third arguments): their
// rows under the HF names the family binds, and what the mixture's module is told of them. The
// mixture's module runs them (src/layers/moe_mlp.cpp, the dispatch in layers/moe.hpp).
// An experts slot is a type with
//   static constexpr void lower(arch_builder&, const slot&)   its rows (and its config keys)
//   knobs (experts_knobs), signature                         what its module is told, its name
//   details(shape, text), hf_names(text)                      its words and tensors in `describe`
// and a shared-expert slot the same without knobs.
#pragma once

#include <array>
#include <concepts>
#include <string_view>

#include "megadsl/blocks/gated_mlp.hpp"
#include "megadsl/blocks/routers.hpp"  // stem

namespace megadsl::blocks {

// What the mixture's module is told of its experts: their activation, or gpt-oss's clamped SwiGLU
// (its keys swiglu_alpha and swiglu_limit).
struct experts_knobs {
  static constexpr std::string_view knobs_name = "experts_knobs";
  activation act = activation::silu;
  bool clamped_swiglu = false;
};

// Names that differ only in their middle, as `describe` abbreviates them:
// experts.{expert}.gate_proj.weight, ...up_proj..., ...down_proj... -> experts.E.gate/up/down_proj.
template <std::size_t N>
constexpr void abbreviated(basic_text<256>& t, const std::array<std::string_view, N>& names) {
  std::string_view first = names[0];
  std::size_t pre = first.size(), post = first.size();
  for (std::string_view n : names) {
    std::size_t i = 0;
    while (i < pre && i < n.size() && n[i] == first[i]) ++i;
    pre = i;
    std::size_t j = 0;
    while (j < post && j < n.size() && n[n.size() - 1 - j] == first[first.size() - 1 - j]) ++j;
    post = j;
  }
  while (pre > 0 && first[pre - 1] != '.') --pre;                                  // whole words before
  while (post > 0 && first[first.size() - post] != '.' && first[first.size() - post] != '_') --post;  // and after
  if (pre + post > first.size()) post = first.size() - pre;
  const std::string_view head = first.substr(0, pre);
  const std::size_t at = head.find("{expert}");
  if (at == std::string_view::npos) t.add(head);
  else t.add(head.substr(0, at), "E", head.substr(at + 8));
  for (std::size_t k = 0; k < N; ++k) t.add(k == 0 ? "" : "/", names[k].substr(pre, names[k].size() - pre - post));
  t.add(stem(first.substr(first.size() - post)));
}

// Each expert a gated MLP of expert_ffn, one HF tensor per expert and projection (Mixtral's
// experts.E.w1/w3/w2, Qwen's and DeepSeek's experts.E.gate/up/down_proj): split over ep (whole
// experts) and each over etp = tp like a gated MLP.
struct expert_names {
  std::string_view gate = "experts.{expert}.gate_proj.weight";
  std::string_view up = "experts.{expert}.up_proj.weight";
  std::string_view down = "experts.{expert}.down_proj.weight";
};
inline constexpr expert_names hf_expert_names{};

template <activation A = activation::silu, const expert_names& N = hf_expert_names>
struct experts {
  static constexpr experts_knobs knobs{A};
  static constexpr std::string_view signature = name_of(A);
  static constexpr void details(const shape&, basic_text<256>&) {}
  static constexpr void hf_names(basic_text<256>& t) { abbreviated<3>(t, {N.gate, N.up, N.down}); }
  static constexpr void lower(arch_builder& b, const slot& at) {
    b.param(at, {"experts.{expert}.gate_up.weight", &geo::gate_up<&geo::expert_ffn, false>, {N.gate, N.up}, 2,
                 presence::always, false, false, param_init::normal, true});
    b.param(at, {"experts.{expert}.down.weight", &geo::down<&geo::expert_ffn>, {N.down}, 1,
                 presence::always, false, false, param_init::normal, true});
    b.uses(A);
  }
};

// Every expert of a layer in one HF tensor per projection, as transformers stores Llama 4's and
// gpt-oss's (hf_stacking, no converter): gate_up (E, h, 2 f), down (E, f, h), and gpt-oss's
// biases (E, 2 f) and (E, h).
struct stacked_expert_names {
  std::string_view gate_up = "experts.gate_up_proj";
  std::string_view down = "experts.down_proj";
  std::string_view gate_up_bias = {}, down_bias = {};
};

// Stacked experts whose gate_up columns are [gate | up] (Llama 4's), without biases.
template <activation A, const stacked_expert_names& N>
struct stacked_experts {
  static_assert(N.gate_up_bias.empty() && N.down_bias.empty(), "megadsl: stacked_experts have no biases (clamped_swiglu_experts have)");
  static constexpr experts_knobs knobs{A};
  static constexpr std::string_view signature = name_of(A);
  static constexpr void details(const shape&, basic_text<256>&) {}
  static constexpr void hf_names(basic_text<256>& t) { t.add(N.gate_up, ", ", N.down, " stacked"); }
  static constexpr void lower(arch_builder& b, const slot& at) {
    b.param(at, {"experts.{expert}.gate_up.weight", &geo::gate_up<&geo::expert_ffn, false>, {N.gate_up}, 1,
                 presence::always, true, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts});
    b.param(at, {"experts.{expert}.down.weight", &geo::down<&geo::expert_ffn>, {N.down}, 1,
                 presence::always, false, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts});
    b.uses(A);
  }
};

// gpt-oss's experts (GptOssExperts): stacked, gate and up columns interleaved, with biases, each the
// clamped SwiGLU whatever hidden_act says: gate <= limit, up in [-limit, limit],
// (up + 1) * gate * sigmoid(alpha * gate), alpha and limit its own config.json keys. The down bias
// is added once (tp rank 0: the experts' outputs are partial sums over tp), its gradient summed over tp.
template <const stacked_expert_names& N>
struct clamped_swiglu_experts {
  static_assert(!N.gate_up_bias.empty() && !N.down_bias.empty(), "megadsl: clamped_swiglu_experts name their biases");
  static constexpr config_setting swiglu_alpha{.key = "swiglu_alpha", .fallback = 1.702, .least = 1e-6,
                                               .meaning = "the clamped SwiGLU's sigmoid(alpha * gate)"};
  static constexpr config_setting swiglu_limit{.key = "swiglu_limit", .fallback = 7.0, .least = 1e-6,
                                               .meaning = "the experts clamp gate and up to [-limit, limit]"};
  static constexpr experts_knobs knobs{activation::silu, true};
  static constexpr std::string_view signature = "clamped_swiglu";
  static constexpr void details(const shape&, basic_text<256>& t) { t.add("; experts clamped SwiGLU + biases"); }
  static constexpr void hf_names(basic_text<256>& t) { t.add(N.gate_up, ", ", N.down, "(_bias) stacked"); }
  static constexpr void lower(arch_builder& b, const slot& at) {
    b.setting(swiglu_alpha);
    b.setting(swiglu_limit);
    b.param(at, {"experts.{expert}.gate_up.weight", &geo::gate_up<&geo::expert_ffn, false>, {N.gate_up}, 1,
                 presence::always, true, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts_interleaved});
    b.param(at, {"experts.{expert}.gate_up.bias", &geo::gate_up<&geo::expert_ffn, true>, {N.gate_up_bias}, 1,
                 presence::always, true, false, param_init::zeros, true, 0, hf_form::as_held, hf_stacking::experts_interleaved});
    b.param(at, {"experts.{expert}.down.weight", &geo::down<&geo::expert_ffn>, {N.down}, 1,
                 presence::always, false, false, param_init::normal, true, 0, hf_form::as_held, hf_stacking::experts});
    b.param(at, {"experts.{expert}.down.bias", &geo::hidden, {N.down_bias}, 1,
                 presence::always, false, true, param_init::zeros, true, 0, hf_form::as_held, hf_stacking::experts});
  }
};

template <class E>
concept experts_slot = requires(arch_builder& b, const slot& at, const shape& s, basic_text<256>& t) {
  E::lower(b, at);
  { E::knobs } -> std::convertible_to<experts_knobs>;
  { E::signature } -> std::convertible_to<std::string_view>;
  E::details(s, t);
  E::hf_names(t);
};

// ---- shared experts: a gated MLP of shared_expert_ffn on every token, beside the routed ones ----

// A shared expert's HF module (its gate_proj, up_proj, down_proj), relative to its mixture's, its
// gate's tensor (gated_shared_expert) and its part of the mixture's name (which checkpoints record).
struct shared_expert_names {
  std::string_view module = "shared_expert";
  std::string_view gate = {};
  std::string_view signature = {};
};
// Qwen2-MoE's (Qwen3-Next's): mlp.shared_expert behind mlp.shared_expert_gate.
inline constexpr shared_expert_names hf_gated_shared_expert_names{.gate = "shared_expert_gate.weight", .signature = ", shared"};
// DeepSeek-V3's (GLM-4.5's, ERNIE 4.5's): mlp.shared_experts, n_shared_experts of them as one MLP.
inline constexpr shared_expert_names hf_shared_experts_names{.module = "shared_experts", .signature = ", shared_experts"};

struct no_shared_expert {
  static constexpr std::string_view signature = "";
  static constexpr void details(const shape&, basic_text<256>&) {}
  static constexpr void hf_names(basic_text<256>&) {}
  static constexpr void lower(arch_builder&, const slot&) {}
};

constexpr void shared_expert_rows(arch_builder& b, const slot& mixture, const shared_expert_names& n, presence p) {
  const slot at = mixture.sub("shared_expert", n.module);
  b.param(at, {"gate_up.weight", &geo::gate_up<&geo::shared_ffn, false>, {"gate_proj.weight", "up_proj.weight"}, 2, p});
  b.param(at, {"down.weight", &geo::down<&geo::shared_ffn>, {"down_proj.weight"}, 1, p});
}

// + shared(x), ungated: always there, or with presence::shared_experts only where shared_expert_ffn
// > 0 (ERNIE 4.5's count may be 0).
template <const shared_expert_names& N, presence P = presence::always>
struct shared_expert {
  static_assert(N.gate.empty(), "megadsl: a shared expert with a gate is gated_shared_expert");
  static constexpr std::string_view signature = N.signature;
  static constexpr void details(const shape& s, basic_text<256>& t) {
    if (P == presence::always || !(s.shared_expert_ffn.is_static() && s.shared_expert_ffn.get() == 0)) t.add("; + shared gated_mlp");
  }
  static constexpr void hf_names(basic_text<256>& t) { t.add(", ", N.module); }
  static constexpr void lower(arch_builder& b, const slot& at) { shared_expert_rows(b, at, N, P); }
};

// + sigmoid(gate(x)) * shared(x) (Qwen2-MoE's). The gate (1, h) is applied to the whole (gathered)
// input on every tp rank: replicated, its gradient partial per tp rank (it scales the shared
// expert's partial sums).
template <const shared_expert_names& N = hf_gated_shared_expert_names>
struct gated_shared_expert {
  static_assert(!N.gate.empty(), "megadsl: a gated shared expert names its gate's tensor");
  static constexpr std::string_view signature = N.signature;
  static constexpr void details(const shape&, basic_text<256>& t) { t.add("; + sigmoid(gate(x)) * shared gated_mlp"); }
  static constexpr void hf_names(basic_text<256>& t) { t.add(", ", N.module, ", ", stem(N.gate)); }
  static constexpr void lower(arch_builder& b, const slot& at) {
    shared_expert_rows(b, at, N, presence::always);
    b.param(at, {"shared_expert_gate.weight", &geo::one_row, {N.gate}, 1, presence::always, false, true});
  }
};

template <class S>
concept shared_expert_slot = requires(arch_builder& b, const slot& at, const shape& s, basic_text<256>& t) {
  S::lower(b, at);
  { S::signature } -> std::convertible_to<std::string_view>;
  S::details(s, t);
  S::hf_names(t);
};

}  // namespace megadsl::blocks
