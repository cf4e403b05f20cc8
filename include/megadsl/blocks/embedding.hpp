// The token embedding (scaled by sqrt(hidden) for Gemma).
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// ---- the embedding --------------------------------------------------------------------------------

// Vocab-parallel token embedding.
template <embed_scale_kind E = embed_scale_kind::none>
struct embedding {
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.leaf(at, std::array{block_param{"weight", shard_kind::vocab, {"weight"}, 1}}, &modules::embedding,
                  E == embed_scale_kind::sqrt_hidden ? "embedding<sqrt_hidden>" : "embedding",
                  E == embed_scale_kind::sqrt_hidden ? "embedding  (* sqrt(hidden))" : "embedding", nullptr,
                  E == embed_scale_kind::sqrt_hidden ? 1 : 0);
  }
};

}  // namespace megadsl::blocks
