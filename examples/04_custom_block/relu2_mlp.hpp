// A block megadsl does not have, declared in this example's own files: the squared-ReLU MLP of
// NVIDIA's Nemotron (transformers' NemotronMLP), down(relu(up(x))^2), under its HF names
// mlp.up_proj / mlp.down_proj. Torch-free: the block type declares its parameters (rows of the
// shard plan, the loaders and the formulas) and names its module's factory (relu2_mlp.cpp).
#pragma once

#include <array>
#include <memory>

#include "megadsl/layers/blocks.hpp"

namespace example {

// Defined in relu2_mlp.cpp. Weak like megadsl's own factories (layers/block_factories.hpp), so a
// torch-free program may use the architecture without linking the module.
MEGADSL_FACTORY_LINKAGE std::unique_ptr<megadsl::block_module> make_relu2_mlp(const megadsl::block_build& b);

struct relu2_mlp {
  // up: column-parallel (ffn rows split over tp); down: row-parallel, reduced over tp (geometry.hpp).
  static constexpr std::array<megadsl::block_param, 2> params{{
      {"up.weight", &megadsl::geo::ffn_rows<false>, {"up_proj.weight"}, 1},
      {"down.weight", &megadsl::geo::down<&megadsl::geo::dense_ffn>, {"down_proj.weight"}, 1},
  }};
  static constexpr int lower(megadsl::blocks::arch_builder& b, const megadsl::blocks::slot& layer) {
    return b.leaf(layer.module("mlp"), params, &make_relu2_mlp, "relu2_mlp",
                  "relu2_mlp  down(relu(up(x))^2)  [mlp: up_proj, down_proj]");
  }
};

}  // namespace example
