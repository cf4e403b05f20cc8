// Virtual pipeline chunks interleave over pipeline ranks, so they need pp > 1.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.tp = 8, .vpp = 2}>;

// expect: vpp_needs_pp: vpp = 2 virtual chunks need pp > 1 \(got pp = 1\); set pp >= 2 or vpp = 1
