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
// positions back (0: no window), in the same chunk of `chunk` positions (0: none, Llama 4's
// chunked layers: positions count from each sequence's first token); scores
// softcap * tanh(s / softcap) (0: none); each query head's learned sink (Hq), one more logit in
// every row's softmax without a value (gpt-oss; undefined: none), differentiable.
struct ring_mask {
  std::int64_t window = 0, chunk = 0;
  double softcap = 0;
  std::int64_t tile = 0;  // query rows scored at once against a block; 0: about ring_tile_scores (formulas.hpp)
  // Each block is this many equal stretches of rows (a2a+ring: the all-to-all group's shares, each
  // load-balanced chunks of its own), a query tile scored against the keys each stretch lets it see.
  std::int64_t parts = 1;
  at::Tensor sinks;
};

struct packed_tokens;

// The ring's view of this cp rank's share (runtime/packing.hpp ring_split): each of its `rows`
// rows' position and sequence (its batch row; -1 for padding rows past the real tokens).
ring_tokens ring_tokens_of(const packed_tokens& share, std::int64_t rows);

// q (Hq, T, d), k (Hkv, T, d) and v (Hkv, T, dv) of this rank's T tokens (Hq a multiple of Hkv:
// grouped-query heads share their group's k/v; MLA's v is narrower than its q and k); returns
// (Hq, T, dv) in q's dtype (the softmax in fp32). Differentiable in q, k, v and the sinks; every
// rank of `cp` calls it with the same shapes.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ring_tokens& tokens,
                          double scale, const ring_mask& mask, const comm_group& cp);

}  // namespace megadsl
