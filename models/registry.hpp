// The families megadsl composes, by HF model_type (each one's config.json data lives in its own
// header, megadsl/family_config.hpp), and the run-time lookup of the presets by name (`megadsl plan
// llama3-8b`), built from the preset types: the shape of each entry is the struct's `::shape`, so
// there is one source of truth.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/models/presets.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// Every family, in the order messages list them. Where two families' compositions coincide
// (llama, mistral, qwen2) model_type_for prefers the first that can write the model.
inline constexpr auto families = std::to_array<const family_config*>(
    {&llama_config, &mistral_config, &qwen2_config, &qwen3_config, &gemma_config, &gemma2_config, &olmo2_config,
     &phi3_config, &starcoder2_config, &gpt_neox_config, &mixtral_config, &qwen2_moe_config, &qwen3_moe_config,
     &seed_oss_config, &smollm3_config, &olmoe_config, &glm4_moe_config,
     &deepseek_v3_config, &gemma3_config, &olmo3_config,
     &exaone4_config, &ernie4_5_config, &ernie4_5_moe_config, &glm4_config, &kimi_k2_config,
     &hunyuan_dense_config, &granite_config, &cohere2_config,
     &hunyuan_moe_config, &cohere_config, &apertus_config, &gpt_oss_config, &llama4_config, &qwen3_next_config,
     &qwen3_5_config, &qwen3_5_moe_config});

// The family whose config.json says `model_type`, or nullptr.
constexpr const family_config* find_family(std::string_view model_type) {
  for (const family_config* f : families)
    if (f->model_type == model_type) return f;
  return nullptr;
}

struct preset_entry {
  std::string_view name;          // "llama3-8b"
  std::string_view family;        // its composition: "llama", "qwen3", "gemma", ...
  shape s;                        // fully static
  std::int64_t published_params;  // parameter count of the published checkpoint (actor, HF)
  std::string_view source;        // HF repository whose config.json the shape copies
};

namespace detail {
template <class P>
constexpr preset_entry entry_of() {
  return {P::name, P::family, P::shape, P::published_params, P::hf_repo};
}
template <class... P>
constexpr std::array<preset_entry, sizeof...(P)> entries_of(preset_list<P...>) {
  return {entry_of<P>()...};
}
}  // namespace detail

inline constexpr auto presets = detail::entries_of(all_presets{});

// The entry named `name`, or nullptr. Names are those of the preset structs ("llama3-8b",
// "qwen2.5-0.5b", "tiny"); matching is exact. HF repository ids are not names: on the command line
// they may also be local directories, which must not be shadowed by a preset.
constexpr const preset_entry* find_preset(std::string_view name) {
  for (const preset_entry& e : presets)
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace megadsl
