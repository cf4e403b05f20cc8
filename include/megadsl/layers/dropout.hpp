// Dropout in training steps (megadsl/dropout.hpp) as the layers apply it: every mask is computed,
// not drawn from a generator's state, from a key per token (a hash of its row's real tokens and
// its position in the row), the place (layer, sublayer or head) and the step's salt (the model's
// seed and its forward_backward call). A token has the same mask whichever rank holds it, in a
// padded or packed stream, in any micro-batch: training with dropout gives the same numbers in
// every layout. Two identical rows of one step draw the same masks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string_view>

#include "megadsl/dropout.hpp"
#include "megadsl/layers/kernels.hpp"

namespace megadsl {

struct packed_tokens;
struct layer_context;

// One micro-batch's dropout in a training step: the rates, the step's salt and each stream row's key.
struct dropout_draw {
  dropout_rates rates;
  std::uint64_t salt = 0;
  at::Tensor keys;        // (T'/cp,) int64 in [0, 2^32): this rank's stream rows (layer_context::pk)
  at::Tensor whole_keys;  // (T',): the whole stream's at cp > 1 (undefined: `keys`)
  [[nodiscard]] const at::Tensor& sequence_keys() const { return whole_keys.defined() ? whole_keys : keys; }
};

// The step's salt: the model's seed and its forward_backward call.
std::uint64_t dropout_step_salt(std::uint64_t seed, std::uint64_t call);

// (T',) int64: each stream row's key, from its row's real tokens and its position in the row
// (rows past the real tokens: 0; they reach no result).
at::Tensor dropout_token_keys(const packed_tokens& pk);

// (n, width) in `dtype`: 1 / (1 - p) where element (i, j) is kept, 0 where dropped, from keys[i],
// column first_column + j and the salt; an element is kept with probability 1 - p.
at::Tensor dropout_keep(const at::Tensor& keys, std::int64_t width, double p, std::uint64_t salt, at::ScalarType dtype,
                        std::int64_t first_column = 0);

// (b, H, s, s) fp32: the attention probabilities' mask, scaled as dropout_keep's, of queries with
// keys `query_keys` (b, s) over keys at positions `key_positions` (b, s), global heads from d.first_head.
at::Tensor attention_keep(const at::Tensor& query_keys, const at::Tensor& key_positions, std::int64_t heads,
                          const attention_dropout& d);

// A sublayer's output as it joins the residual stream, this rank's rows of it ((T'/cp/tp or
// T'/cp, h)), with the residual dropout of place `place` of its layer; the identity outside a
// training step or at rate 0.
at::Tensor residual_dropout(const at::Tensor& y, const layer_context& c, std::int64_t place);

// A LoRA adapter's input in a training step (PEFT's lora_dropout on x before A): x (rows of this
// rank's stream, its real tokens alone, or its SP shard; `width` columns from the module's input
// column first_column),
// each element kept by the row's key, its column and the module's own salt (`module`: its HF
// name), so the same in every layout; x as is outside a training step or at p = 0.
at::Tensor lora_input_dropout(const at::Tensor& x, const layer_context& c, std::string_view module, double p,
                              std::int64_t first_column);

// The embedding's output ((T'/cp/tp or T'/cp, h)) with the embedding dropout.
at::Tensor embedding_dropout(const at::Tensor& x, const layer_context& c);

// The attention dropout of the layer's attention core whose heads start at global query head
// `first_head`, over the stream its kernel sees (c.sequences()); p 0 outside a training step.
attention_dropout attention_dropout_of(const layer_context& c, std::int64_t first_head);

}  // namespace megadsl
