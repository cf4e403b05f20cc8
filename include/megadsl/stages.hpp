// Pipeline stages: which layers each (pipeline rank, virtual chunk) holds.
//
// Megatron VPP: chunk j of pipeline rank r is global stage j*pp + r; stages hold consecutive layers
// in global-stage order. Even split: layers/(pp*vpp) each. With explicit first/last stage counts,
// a pipeline rank's count is divided evenly over its vpp chunks.
#pragma once

#include <cstdint>

#include "megadsl/layout.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

struct stage_range {
  std::int64_t first_layer = 0;  // global index of the chunk's first layer
  std::int64_t count = 0;        // layers in the chunk
};

struct layer_place {
  std::int64_t pp_rank = 0;
  std::int64_t chunk = 0;        // virtual chunk on that pipeline rank
  std::int64_t local_index = 0;  // index inside the chunk
};

// Layers held by one pipeline rank over all its chunks (rules must hold).
constexpr std::int64_t layers_on_pp_rank(const shape& s, const layout& l, std::int64_t pp_rank) {
  const auto split = detail::split_layers(s.layers, l.pp, l.first_stage_layers, l.last_stage_layers);
  if (pp_rank == 0) return split.first;
  if (pp_rank == l.pp.get() - 1) return split.last;
  return split.middle;
}

constexpr stage_range chunk_layers(const shape& s, const layout& l, std::int64_t pp_rank,
                                   std::int64_t chunk) {
  const std::int64_t pp = l.pp, vpp = l.vpp;
  std::int64_t offset = 0;
  for (std::int64_t stage = 0; stage < chunk * pp + pp_rank; ++stage)
    offset += layers_on_pp_rank(s, l, stage % pp) / vpp;
  return {offset, layers_on_pp_rank(s, l, pp_rank) / vpp};
}

constexpr layer_place place_of_layer(const shape& s, const layout& l, std::int64_t layer) {
  const std::int64_t pp = l.pp, vpp = l.vpp;
  for (std::int64_t chunk = 0; chunk < vpp; ++chunk)
    for (std::int64_t r = 0; r < pp; ++r) {
      const stage_range c = chunk_layers(s, l, r, chunk);
      if (layer >= c.first_layer && layer < c.first_layer + c.count)
        return {r, chunk, layer - c.first_layer};
    }
  return {-1, -1, -1};
}

// Megatron's padded vocab: ceil(V / (multiple * tp)) * multiple * tp.
constexpr std::int64_t padded_vocab(const shape& s, const layout& l) {
  const std::int64_t unit = l.vocab_pad_multiple.get() * l.tp.get();
  return (s.vocab.get() + unit - 1) / unit * unit;
}

}  // namespace megadsl
