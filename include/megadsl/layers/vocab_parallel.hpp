// Vocab-parallel log-probs and entropy in fp32 (DESIGN §11, verl §4.1):
//
//   m = max_all(z)   S = sum_all(exp(z - m))   logp = z_y - m - log S
//   A = sum_all(p z) H = m + log S - A         dz = g_logp (onehot - p) - g_H p (z - A)
//
// Each rank holds the columns [start, start + width) of the padded vocab; columns at or past the
// true vocab are padding and never reach a result. The logits are never modified; the backward is
// local (its incoming gradients are the same on every tp rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "megadsl/parallel/comm.hpp"

namespace megadsl {

struct vocab_shard {
  std::int64_t start = 0;       // first padded-vocab column of this rank
  std::int64_t true_vocab = 0;  // columns at or past this index are padding
};

struct logprob_entropy {
  at::Tensor log_probs;  // (T,) fp32
  at::Tensor entropy;    // (T,) fp32; undefined when not asked for
};

// logits: (T, V'/tp) this rank's columns, any float dtype; labels: (T,) int64 global ids.
// `tp` may be null (single process: no collective at all). `invariant`: S and A are summed over
// blocks of the vocabulary in a fixed order, the same bits at any tp (layers/invariant.hpp).
logprob_entropy vocab_parallel_logprob_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                               const vocab_shard& shard, const comm_group* tp,
                                               bool with_entropy = true, bool invariant = false);

// Vocab-parallel cross entropy (Megatron's): -log_probs.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                        const vocab_shard& shard, const comm_group* tp);

}  // namespace megadsl
