// Every preset of a real or test model, and a compile-time list of them.
//
//   megadsl::for_each_preset([](auto p) { using P = typename decltype(p)::type; ... });
#pragma once

#include <type_traits>

#include "megadsl/formulas.hpp"
#include "megadsl/rules.hpp"

#include "megadsl/models/apertus.hpp"
#include "megadsl/models/cohere.hpp"
#include "megadsl/models/cohere2.hpp"
#include "megadsl/models/deepseek_v3.hpp"
#include "megadsl/models/gemma.hpp"
#include "megadsl/models/gemma2.hpp"
#include "megadsl/models/exaone4.hpp"
#include "megadsl/models/ernie4_5.hpp"
#include "megadsl/models/ernie4_5_moe.hpp"
#include "megadsl/models/glm4.hpp"
#include "megadsl/models/hunyuan.hpp"
#include "megadsl/models/gemma3.hpp"
#include "megadsl/models/glm4_moe.hpp"
#include "megadsl/models/gpt_neox.hpp"
#include "megadsl/models/gpt_oss.hpp"
#include "megadsl/models/granite.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/models/llama4.hpp"
#include "megadsl/models/mistral.hpp"
#include "megadsl/models/mixtral.hpp"
#include "megadsl/models/olmo2.hpp"
#include "megadsl/models/olmo3.hpp"
#include "megadsl/models/olmoe.hpp"
#include "megadsl/models/phi3.hpp"
#include "megadsl/models/qwen.hpp"
#include "megadsl/models/qwen3.hpp"
#include "megadsl/models/qwen3_5.hpp"
#include "megadsl/models/qwen3_next.hpp"
#include "megadsl/models/qwen_moe.hpp"
#include "megadsl/models/seed_oss.hpp"
#include "megadsl/models/smollm3.hpp"
#include "megadsl/models/starcoder2.hpp"
#include "megadsl/models/tiny.hpp"

namespace megadsl {

template <class... P>
struct preset_list {
  static constexpr std::size_t size = sizeof...(P);
  // Calls f(std::type_identity<P>{}) for each preset, in order.
  template <class F>
  static constexpr void for_each(F&& f) {
    (f(std::type_identity<P>{}), ...);
  }
};

// The order is the order of `megadsl::presets` (registry.hpp) and of `megadsl plan --list`.
using all_presets =
    preset_list<llama2_7b, llama2_13b, llama2_70b, llama3_8b, llama3_70b, llama3_1_405b,
                llama3_2_1b, llama3_2_3b, tinyllama_1_1b, mistral_7b, qwen2_5_0_5b, qwen2_5_7b,
                qwen2_5_72b, qwen3_0_6b, qwen3_8b, gemma_2b, gemma_7b, gemma2_9b, olmo2_7b, phi3_mini, starcoder2_7b, pythia_1_4b, mixtral_8x7b,
                qwen1_5_moe_a2_7b, qwen3_30b_a3b, seed_oss_36b, smollm3_3b, olmoe_1b_7b, glm4_5_air, glm4_5, deepseek_v3_671b, kimi_k2,
                moonlight_16b_a3b, gemma3_27b, olmo3_7b, ernie4_5_0_3b, ernie4_5_21b_a3b, glm4_9b, granite3_3_8b, command_r_v01, command_r_plus, command_r7b, exaone4_1_2b, exaone4_32b, apertus_8b, hunyuan_a13b, gpt_oss_20b, gpt_oss_120b,
                llama4_scout, llama4_maverick, qwen3_next_80b_a3b, qwen3_5_9b, qwen3_5_27b, qwen3_5_35b_a3b,
                tiny_llama, tiny_qwen, tiny_llama3>;

template <class F>
constexpr void for_each_preset(F&& f) {
  all_presets::for_each(static_cast<F&&>(f));
}

}  // namespace megadsl
