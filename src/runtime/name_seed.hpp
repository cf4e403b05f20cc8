// The random stream of a tensor drawn from its HF name (internal to src/runtime/): 64-bit FNV-1a
// of the name over the model's seed, so a tensor's initial values are the same on every rank and
// under every layout (DESIGN §13): the parameters' init (decoder_stage.cpp) and fresh LoRA
// adapters (lora_io.cpp).
#pragma once

#include <cstdint>
#include <string_view>

namespace megadsl::detail {

inline std::uint64_t name_seed(std::string_view name, std::uint64_t seed) {
  std::uint64_t h = 1469598103934665603ULL ^ seed;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

}  // namespace megadsl::detail
