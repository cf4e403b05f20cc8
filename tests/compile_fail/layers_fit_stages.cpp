// 32 layers do not split evenly over pp = 3 pipeline stages.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.tp = 8, .pp = 3}>;

// expect: layers_fit_stages: num_layers = 32 is not divisible by pp \* vpp = 3 \* 1 = 3; valid pp: 1, 2, 4, 8, 16, 32; or give first_stage_layers / last_stage_layers
