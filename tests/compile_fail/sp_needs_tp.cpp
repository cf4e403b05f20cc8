// Sequence parallelism splits activations over the tp group, so it needs one.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.pp = 2, .sp = true}>;

// expect: sp_needs_tp: sequence parallelism needs tp > 1 \(got tp = 1\); set tp >= 2 or sp = false
