// LoRA in the type is checked with the layout: Qwen3-30B-A3B's gate_proj names only its experts,
// which take adapters through target_parameters, not target_modules.
#include "megadsl/models/qwen_moe.hpp"

inline constexpr megadsl::lora adapters = megadsl::lora{.rank = 8}.target("gate_proj");
using actor = megadsl::causal_lm<megadsl::qwen3_30b_a3b, megadsl::layout{.tp = 2}, adapters>;

// expect: lora_target_supported: LoRA target ..?gate_proj..? names .*take adapters through target_parameters
// expect: checked<megadsl::qwen3_30b_a3b
