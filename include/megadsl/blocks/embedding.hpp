// The token embedding (scaled by sqrt(hidden) for Gemma).
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// ---- the embedding --------------------------------------------------------------------------------

// Vocab-parallel token embedding.
struct embedding_knobs {
  static constexpr std::string_view knobs_name = "embedding_knobs";
  embed_scale_kind scale = embed_scale_kind::none;
};

template <embed_scale_kind E = embed_scale_kind::none>
struct embedding {
  static constexpr embedding_knobs knobs{E};
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.leaf(at, std::array{block_param{"weight", &geo::vocab, {"weight"}, 1}}, &modules::embedding,
                  E == embed_scale_kind::sqrt_hidden ? "embedding<sqrt_hidden>" : "embedding",
                  E == embed_scale_kind::sqrt_hidden ? "embedding  (* sqrt(hidden))" : "embedding", nullptr,
                  knobs_of(knobs));
  }
};

}  // namespace megadsl::blocks
