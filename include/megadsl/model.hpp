// Model types: a family shape, then a layout and a head make an actor or a critic.
//
//   #include "megadsl/models/llama.hpp"   // a family: its composition, alias and presets
//   struct my_model : megadsl::llama<megadsl::shape{...}> { static constexpr auto name = "my-model"; };
//   using actor  = megadsl::causal_lm<my_model, megadsl::layout{.tp = 4, .pp = 2, .sp = true}>;
//   using critic = megadsl::value_model<my_model, megadsl::layout{.tp = 4, .pp = 2, .sp = true}>;
//
// LoRA adapters are part of an actor's type too (lora.hpp): its rules are checked with the
// layout's, and parallel_model attaches fresh adapters (PEFT's init) and trains them, base frozen:
//   inline constexpr megadsl::lora adapters = megadsl::lora{.rank = 32, .alpha = 64.0}.target("all-linear");
//   using lora_actor = megadsl::causal_lm<my_model, megadsl::layout{.tp = 4}, adapters>;
//
// Naming an invalid combination fails to compile at that line. The diagnostic names the first
// violated rule with its values, `megadsl::violated_rule<megadsl::rule_id::heads_divisible_by_tp, 32, 3>`
// (on GCC and clang), then `megadsl::invalid_layout<{"<rule>: <values>; valid ...: ..."}>` with
// every violated rule's message (readable text on GCC).
// `valid_layout<M, L>` asks the same question without failing (for negative tests and dispatch).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

#include "megadsl/heads.hpp"
#include "megadsl/layers/blocks.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/lora.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

using message = basic_text<1024>;

// Any decoder of the vocabulary: every knob dynamic, filled from a config.json's model_type (the
// command-line tool and the Python module use it with `dynamic_shape`).
template <shape S>
struct any_decoder {
  static constexpr megadsl::shape shape = S;
  static constexpr std::string_view family = "any";
  static constexpr std::string_view name = "any";
};

template <class M>
concept Model = requires {
  { M::shape } -> std::convertible_to<shape>;
  { M::family } -> std::convertible_to<std::string_view>;
};

// A model, a layout, a head and the LoRA adapters it trains (rank 0: none): what every per-rank
// fact is derived from.
template <Model M, layout L, auto H, lora A = lora{}>
struct model_spec {
  using model = M;
  static constexpr megadsl::shape shape = M::shape;
  static constexpr megadsl::layout layout = L;
  static constexpr auto head = H;
  static constexpr lora adapters = A;
  static constexpr bool is_actor = is_lm_head<H>;
  static constexpr bool is_critic = is_value_head<H>;
  static_assert(is_actor || is_critic, "megadsl: the head is lm_head{} (actor) or value_head{...} (critic)");
};

// Carries the violated rules in its template argument, so the compiler prints them.
template <message Rules>
struct invalid_layout {
  static_assert(Rules.size == 0,
                "megadsl: invalid layout; the violated rules, their values and the valid "
                "alternatives are in the 'invalid_layout<...>' line above");
  using type = void;
};

// The first violated rule by name, with the values it compares: what clang prints readably in its
// first lines (it prints invalid_layout's text as character codes; GCC prints both readably).
template <rule_id Rule, std::int64_t... Values>
struct violated_rule {
  static constexpr bool holds = Rule == rule_id::none;
  static_assert(holds, "megadsl: invalid layout: the rule named above (rule_id::<name>, then the values it "
                       "compares) is violated; its message with the valid alternatives follows");
  using type = void;
};

// The rules a static model and layout violate, evaluated once per pair however often they are
// asked about (a model's declaration, valid_layout, violates and the tests share it).
template <Model M, layout L>
inline constexpr violations violations_of = check(M::shape, L);

namespace detail {
template <rule_id Rule, std::array<std::int64_t, 4> Values, std::size_t... I>
violated_rule<Rule, Values[I]...> name_rule(std::index_sequence<I...>);

// The layout's rules, then the adapters' (lora_rules; none without adapters).
template <Model M, layout L, lora A>
inline constexpr violations violations_with = [] {
  if (!A.enabled()) return violations_of<M, L>;
  violations out = violations_of<M, L>;
  const violations more = lora_rules(M::shape, A);
  for (int i = 0; i < more.count && out.count < violations::capacity; ++i)
    out.items[static_cast<std::size_t>(out.count++)] = more.items[static_cast<std::size_t>(i)];
  if (L.invariant.is_static() && L.invariant.get())
    out.add("lora_invariant").add("LoRA adapters with invariant arithmetic are not supported yet; drop invariant or the adapters");
  return out;
}();

template <Model M, layout L, auto H, lora A = lora{}>
struct checked {
  static constexpr const violations& found = violations_with<M, L, A>;
  static constexpr violation first = found.ok() ? violation{} : found.items[0];
  using names_the_first_rule = typename decltype(name_rule<first.id, first.values>(
      std::make_index_sequence<static_cast<std::size_t>(first.value_count)>{}))::type;
  using fails_here_if_invalid = typename invalid_layout<found.ok() ? message{} : found.joined()>::type;
  using type = model_spec<M, L, H, A>;
};
}  // namespace detail

// An actor; with `A`, its LoRA adapters (a critic takes none: its value head would stay frozen).
template <Model M, layout L = layout{}, lora A = lora{}>
using causal_lm = typename detail::checked<M, L, lm_head{}, A>::type;

template <Model M, layout L = layout{}, value_head H = value_head{}>
using value_model = typename detail::checked<M, L, H>::type;

// True when every rule whose inputs are static holds.
template <class M, layout L>
concept valid_layout = Model<M> && violations_of<M, L>.ok();

// True when `rule` is among the violated ones (precise negative tests).
template <Model M, layout L>
constexpr bool violates(std::string_view rule) {
  return violations_of<M, L>.has(rule);
}

// True when the adapters' rules hold for the model (lora_targets_match, lora_target_supported, ...).
template <class M, lora A>
concept valid_lora = Model<M> && lora_rules(M::shape, A).ok();

// A spec's adapters (a spec written without them: none).
template <class S>
constexpr lora adapters_of() {
  if constexpr (requires { S::adapters; }) return S::adapters;
  else return lora{};
}

template <class T>
concept ModelSpec = requires {
  typename T::model;
  { T::shape } -> std::convertible_to<shape>;
  { T::layout } -> std::convertible_to<layout>;
};

}  // namespace megadsl
