// The two heads of an RLHF model. The head is a template argument; the model code switches on it
// with `if constexpr`, and both are explicitly instantiated.
#pragma once

#include <string_view>
#include <type_traits>

#include "megadsl/static_value.hpp"

namespace megadsl {

// Actor: vocab-parallel logits -> log-probs of given tokens, entropy; full logits only on request.
struct lm_head {};

// Critic: h -> 1, per-token values. Loaded from score.* / v_head.* / value_head.* / reward_head.*
// or lm_head.weight of shape (1, h); initialised (and reported) when none exists.
struct value_head {
  bool bias = true;
};

template <auto H>
inline constexpr bool is_value_head = std::is_same_v<std::remove_cv_t<decltype(H)>, value_head>;

template <auto H>
inline constexpr bool is_lm_head = std::is_same_v<std::remove_cv_t<decltype(H)>, lm_head>;

}  // namespace megadsl
