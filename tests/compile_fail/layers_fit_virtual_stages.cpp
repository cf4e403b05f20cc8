// TinyLlama's 22 layers over pp = 2 x vpp = 2 chunks: only pp = 11 gives whole chunks of 1 layer.
#include "megadsl/models/llama.hpp"

using actor = megadsl::causal_lm<megadsl::tinyllama_1_1b, megadsl::layout{.pp = 2, .vpp = 2}>;

// expect: layers_fit_stages: num_layers = 22 is not divisible by pp \* vpp = 2 \* 2 = 4; valid pp \(with this vpp\): 11;
