// The sliding-window attention a checkpoint applies, per layer (torch-free).
//
// HF masks key j for query i when j <= i - size (transformers' `sliding_window_overlay`), on the
// layers its config's `layer_types` marks "sliding_attention": every layer (Mistral), the layers
// from `max_window_layers` on (Qwen2/Qwen3 with use_sliding_window), or alternate layers starting
// with the first (Gemma2). megadsl applies the same mask in the padded and the remove-padding path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace megadsl {

struct sliding_window {
  std::int64_t size = 0;     // 0: no window
  std::vector<bool> layers;  // which layers slide; empty: every layer (when size > 0)

  [[nodiscard]] bool any() const {
    if (size == 0) return false;
    if (layers.empty()) return true;
    for (bool b : layers)
      if (b) return true;
    return false;
  }
  // The window of `layer`, 0 when it attends over the whole causal prefix.
  [[nodiscard]] std::int64_t of(std::int64_t layer) const {
    if (size == 0) return 0;
    if (layers.empty()) return size;
    return layer >= 0 && layer < static_cast<std::int64_t>(layers.size()) && layers[static_cast<std::size_t>(layer)] ? size : 0;
  }
  // Every layer slides (Mistral's form).
  [[nodiscard]] bool every_layer() const {
    if (size == 0) return false;
    for (bool b : layers)
      if (!b) return false;
    return true;
  }
  // The same window on the same layers (an empty list and all-true lists mean the same).
  friend bool operator==(const sliding_window& a, const sliding_window& b) {
    if (a.any() != b.any()) return false;
    if (!a.any()) return true;
    if (a.size != b.size) return false;
    const std::size_t n = std::max(a.layers.size(), b.layers.size());
    for (std::size_t i = 0; i < n; ++i)
      if ((a.of(static_cast<std::int64_t>(i)) != 0) != (b.of(static_cast<std::int64_t>(i)) != 0)) return false;
    return true;
  }
};

}  // namespace megadsl
