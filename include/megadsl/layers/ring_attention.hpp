// Ring attention (issue 49): this cp rank's queries attend over every cp rank's keys, each rank's
// k/v block passed around the cp ring with point-to-point sends, the blocks' partial softmaxes
// merged by their log-sum-exp (online softmax); the backward recomputes each block's
// probabilities from the saved log-sum-exp and passes dk/dv around the ring with their block, so
// that each returns to its owner summed over every rank's queries. No rank holds more than two
// blocks' keys, and no collective carries the heads: a cp degree is bounded by the tokens, not the
// heads (Ulysses' cp_splits_heads does not apply).
//
// The tokens are a flat stream (any order: a load-balanced split puts each sequence's chunks i and
// 2 cp - 1 - i on rank i): each carries its position and its sequence's id; a query attends to a
// key of the same sequence at a position at most its own (and within the window and chunk of
// `ring_mask`).
// A token whose sequence id is negative (padding) attends to nothing and is attended by nothing:
// its output is 0.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace megadsl {

class comm_group;

struct ring_tokens {
  at::Tensor position;  // (T,) int64
  at::Tensor sequence;  // (T,) int64; < 0: padding
};

// What a query sees beyond causality, and the scores' soft-cap: a key at most `window` - 1
// positions back (0: no window), in the same chunk of `chunk` positions (0: none); scores
// softcap * tanh(s / softcap) (0: none).
struct ring_mask {
  std::int64_t window = 0, chunk = 0;
  double softcap = 0;
  std::int64_t tile = 0;  // query rows scored at once against a block; 0: about 2^25 scores (128 MiB fp32)
};

// q (Hq, T, d), k and v (Hkv, T, d) of this rank's T tokens (Hq a multiple of Hkv: grouped-query
// heads share their group's k/v); returns (Hq, T, d) in q's dtype (the softmax in fp32).
// Differentiable in q, k and v; every rank of `cp` calls it with the same shapes.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ring_tokens& tokens,
                          double scale, const ring_mask& mask, const comm_group& cp);

}  // namespace megadsl
