// Where a checkpoint stores its text model's tensors. A text checkpoint stores them under their
// own names ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"); a multimodal one
// (hf_config::wrapper: Qwen3.5's, Gemma 3's and Llama 4's as published) under a prefix of its own,
// beside its vision tower:
//
//   transformers 5 (Qwen3.5)   model.language_model.layers.0...   lm_head.weight
//   the older form (Gemma 3,   language_model.model.layers.0...   language_model.lm_head.weight
//   Llama 4)
//
// Load (hf_checkpoint::as_text_model), save_hf and the weight export map names through it, so a
// checkpoint written back or streamed to a rollout engine has the names its source had.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megadsl {

struct hf_name_map {
  // (the text model's prefix, the prefix it is stored under); none: every name as it is.
  std::vector<std::pair<std::string, std::string>> prefixes;

  bool identity() const { return prefixes.empty(); }

  // "model.layers.0..." -> where it is stored; a name no prefix covers is stored as it is.
  std::string stored(std::string_view name) const {
    for (const auto& [ours, theirs] : prefixes)
      if (name.substr(0, ours.size()) == ours) return theirs + std::string(name.substr(ours.size()));
    return std::string(name);
  }
  // The text model's name of a stored tensor; nullopt for a tensor outside the text model (the
  // vision tower's, a multi-token-prediction module's).
  std::optional<std::string> text_name(std::string_view stored_name) const {
    if (identity()) return std::string(stored_name);
    for (const auto& [ours, theirs] : prefixes)
      if (stored_name.substr(0, theirs.size()) == theirs) return ours + std::string(stored_name.substr(theirs.size()));
    return std::nullopt;
  }
};

// transformers 5's form and the older one (see above).
inline hf_name_map multimodal_names_v5() { return {{{"model.", "model.language_model."}, {"lm_head.", "lm_head."}}}; }
inline hf_name_map multimodal_names_legacy() {
  return {{{"model.", "language_model.model."}, {"lm_head.", "language_model.lm_head."}}};
}

}  // namespace megadsl
