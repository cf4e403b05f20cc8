// Qwen2.5-7B: tp = 14 splits its 28 query heads, but 4 kv heads are neither a multiple nor a
// divisor of 14.
#include "megadsl/models/qwen.hpp"

using actor = megadsl::causal_lm<megadsl::qwen2_5_7b, megadsl::layout{.tp = 14}>;

// expect: kv_heads_fit_tp: num_key_value_heads = 4 is neither a multiple nor a divisor of tp = 14; valid tp: 1, 2, 4, 28
