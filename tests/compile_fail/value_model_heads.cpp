// A critic is checked like an actor: Qwen2.5-0.5B's 14 query heads take tp 1, 2, 7, 14 only.
#include "megadsl/models/qwen.hpp"

using critic = megadsl::value_model<megadsl::qwen2_5_0_5b, megadsl::layout{.tp = 4, .sp = true},
                                    megadsl::value_head{.bias = false}>;

// expect: heads_divisible_by_tp: num_heads = 14 is not divisible by tp = 4; valid tp: 1, 2, 7, 14
// expect: checked<megadsl::qwen2_5_0_5b
