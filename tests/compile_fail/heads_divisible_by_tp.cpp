// Llama-3-8B's 32 query heads do not split over tp = 3; the diagnostic names the preset type.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.tp = 3}>;

// expect: heads_divisible_by_tp: num_heads = 32 is not divisible by tp = 3; valid tp: 1, 2, 4, 8, 16, 32
// expect: checked<megadsl::llama3_8b
// Both compilers name the rule and its values in a type: clang's first lines carry this one.
// expect: violated_rule<megadsl::rule_id::heads_divisible_by_tp, 32, 3>
// expect-clang: static_assert failed due to requirement .holds. "megadsl: invalid layout: the rule named above
// expect-clang: violated_rule<megadsl::rule_id::heads_divisible_by_tp, 32, 3>
