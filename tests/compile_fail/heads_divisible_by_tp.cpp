// Llama-3-8B's 32 query heads do not split over tp = 3; the diagnostic names the preset type.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.tp = 3}>;

// expect: heads_divisible_by_tp: num_heads = 32 is not divisible by tp = 3; valid tp: 1, 2, 4, 8, 16, 32
// expect: checked<megadsl::llama3_8b
