// Every violated rule is reported at once, joined by " | ", in the rule table's order.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.tp = 3, .pp = 3}>;

// expect: heads_divisible_by_tp: [^|]* \| kv_heads_fit_tp: [^|]* \| ffn_divisible_by_tp: [^|]* \| layers_fit_stages: num_layers = 32
