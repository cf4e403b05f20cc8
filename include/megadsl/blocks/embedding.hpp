// The token embedding (scaled by sqrt(hidden) for Gemma).
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// ---- the embedding --------------------------------------------------------------------------------

// Vocab-parallel token embedding; Gemma's output scaled by sqrt(hidden), and where `Multiplier`
// names a config key of the family's, its output times that key's value (Granite's
// embedding_multiplier).
struct embedding_knobs {
  static constexpr std::string_view knobs_name = "embedding_knobs";
  embed_scale_kind scale = embed_scale_kind::none;
  const config_setting* multiplier = nullptr;
};

template <embed_scale_kind E = embed_scale_kind::none, const config_setting* Multiplier = nullptr>
struct embedding {
  static constexpr embedding_knobs knobs{E, Multiplier};
  static constexpr int lower(arch_builder& b, const slot& at) {
    basic_text<64> name("embedding"), label("embedding");
    if constexpr (E == embed_scale_kind::sqrt_hidden) {
      name.append("<sqrt_hidden>");
      label.append("  (* sqrt(hidden))");
    }
    if constexpr (Multiplier != nullptr) {
      b.setting(*Multiplier);
      name.add("<x ", Multiplier->key, ">");
      label.add("  (* ", Multiplier->key, ")");
    }
    return b.leaf(at, std::array{block_param{"weight", &geo::vocab, {"weight"}, 1}}, &modules::embedding, name.view(),
                  label.view(), nullptr, knobs_of(knobs));
  }
};

}  // namespace megadsl::blocks
