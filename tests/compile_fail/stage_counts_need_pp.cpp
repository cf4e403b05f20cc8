// Explicit first/last stage layer counts describe a pipeline; without one they are a mistake.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.first_stage_layers = 6}>;

// expect: stage_counts_need_pp: first_stage_layers = 6 and last_stage_layers = 0 need pp > 1 \(got pp = 1\); set pp >= 2 or leave them at 0
