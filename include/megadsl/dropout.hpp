// Dropout as a checkpoint's config.json sets it: a rate per place, applied in training steps only
// (forward_backward), never in forward() (log-probs, values, inference). Torch-free.
//
//   attention  on each head's attention probabilities (HF's attention_dropout: every family's key)
//   residual   on each sublayer's output before it joins the residual stream (Seed-OSS's and
//              StarCoder2's residual_dropout, Phi-3's resid_pdrop, GPT-NeoX's hidden_dropout)
//   embedding  on the embedding's output (StarCoder2's embedding_dropout, GPT-NeoX's hidden_dropout)
//
// The masks are a function of the model's seed, the forward_backward call, the layer, the place,
// the row's tokens and each token's position in its row (and the global head, for attention):
// the same whatever the layout, the micro-batching, padding or packing (Megatron's tensor-parallel
// RNG tracker gives the same masks over tp; these also hold over dp, cp, pp and sp).
#pragma once

#include <string>
#include <string_view>

namespace megadsl {

struct dropout_rates {
  double attention = 0.0;
  double residual = 0.0;
  double embedding = 0.0;

  [[nodiscard]] constexpr bool any() const { return attention != 0.0 || residual != 0.0 || embedding != 0.0; }
  constexpr bool operator==(const dropout_rates&) const = default;
};

// A family's config.json key for a dropout rate: the places it sets and its config class's default.
struct dropout_key {
  std::string_view key;
  bool attention = false, residual = false, embedding = false;
  double class_default = 0.0;
};

// "attention dropout 0.1, residual dropout 0.1" / "no dropout" (messages).
std::string describe(const dropout_rates& r);

}  // namespace megadsl
