// The sum of squares of a gradient in fp64, as the gradient norm needs it, without an fp64 copy of
// the whole tensor: a large one is summed in chunks (an embedding's gradient in fp64 and its square
// would be four times its own bytes at the end of the step, above the memory `plan` predicts).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

namespace megadsl {

inline at::Tensor squared_sum(const at::Tensor& g) {
  constexpr std::int64_t chunk = std::int64_t{1} << 22;  // 4M elements: 32 MB in fp64
  const at::Tensor flat = g.reshape({-1});
  const std::int64_t n = flat.numel();
  if (n <= chunk) return flat.to(at::kDouble).pow(2).sum();
  at::Tensor total = at::zeros({}, flat.options().dtype(at::kDouble));
  for (std::int64_t at = 0; at < n; at += chunk) total += flat.narrow(0, at, std::min(chunk, n - at)).to(at::kDouble).pow(2).sum();
  return total;
}

}  // namespace megadsl
