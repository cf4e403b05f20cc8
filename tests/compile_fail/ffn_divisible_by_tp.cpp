// Heads and kv heads split over tp = 16, the MLP width 1000 does not.
#include "megadsl/models/llama.hpp"

struct odd_ffn : megadsl::llama<megadsl::shape{.hidden = 2048, .layers = 4, .heads = 32, .kv_heads = 8,
                                               .ffn = 1000, .vocab = 32000, .max_positions = 4096}> {};

using actor = megadsl::causal_lm<odd_ffn, megadsl::layout{.tp = 16}>;

// expect: ffn_divisible_by_tp: ffn = 1000 is not divisible by tp = 16; valid tp: 1, 2, 4, 8
