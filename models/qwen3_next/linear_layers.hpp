// Which of Qwen3-Next's (and Qwen3.5's) layers are the gated DeltaNet's: the family's own reading
// of config.json (family_config::read_own), since the layer choice, not a block, holds it. The
// shape's linear_layers, bit i for layer i (< 63).
#pragma once

#include <cstdint>
#include <string>

#include "megadsl/config_hook.hpp"

namespace megadsl {

// layer_types ("linear_attention" / "full_attention", one per layer), else every layer but each
// full_attention_interval-th (Qwen3NextConfig's default 4), as the config class derives it.
inline void qwen3_next_linear_layers(const config_view& c, shape& s) {
  const std::int64_t layers = s.layers.get();
  std::int64_t bits = 0;
  const auto mark = [&](std::int64_t i, std::string_view key) {
    if (i >= 63)
      c.fail(key, "makes layer " + std::to_string(i) + " a linear-attention layer; megadsl marks them among the first 63 layers only",
             "this checkpoint is not supported yet");
    bits |= std::int64_t{1} << i;
  };
  if (const auto types = c.strings("layer_types")) {
    if (static_cast<std::int64_t>(types->size()) != layers)
      c.fail("layer_types", "expected one entry per layer (" + std::to_string(layers) + "), got " + std::to_string(types->size()),
             "write \"linear_attention\" or \"full_attention\" for each layer");
    for (std::int64_t i = 0; i < layers; ++i) {
      const std::string& t = (*types)[static_cast<std::size_t>(i)];
      if (t == "linear_attention") mark(i, "layer_types");
      else if (t != "full_attention")
        c.fail("layer_types", "holds \"" + t.substr(0, 40) + "\" at layer " + std::to_string(i) + ", a layer type this family does not have",
               "use \"linear_attention\" or \"full_attention\"");
    }
  } else {
    const std::int64_t every = c.integer("full_attention_interval", 1).value_or(4);
    for (std::int64_t i = 0; i < layers; ++i)
      if ((i + 1) % every != 0) mark(i, "full_attention_interval");
  }
  s.linear_layers = bits;
}

// Each layer's layer_types entry, which save_hf writes (and an explicit list must say).
constexpr std::string_view qwen3_next_layer_type(const shape& s, std::int64_t layer) {
  return linear_layer(s, layer) ? "linear_attention" : "full_attention";
}

}  // namespace megadsl
