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

// The LM head's element-wise transforms of its logits, in this order: Gemma2's soft-cap
// (cap * tanh(l / cap)), the head's config key (blocks::lm_head: l * scale, or l / scale with
// `divides`), the sampler's temperature, one for all rows or one per row.
struct head_transform {
  double softcap = 0;          // 0: none
  double scale = 1;
  bool divides = false;
  double temperature = 1;
  at::Tensor row_temperature;  // (T,) or undefined
};
// The logits of rows [first, first + n) of h (T, hd) by the head's shard w (V'/tp, hd), transformed:
// (n, V'/tp) in the compute dtype. `invariant`: the GEMM's invariant path (layers/invariant.hpp).
at::Tensor head_logits(const at::Tensor& h, const at::Tensor& w, const head_transform& t, std::int64_t first,
                       std::int64_t n, bool invariant);

// The log-probs and entropy of head_logits(h, w, t) over every row of h, computed `chunk_rows` rows
// at a time in the forward and again in the backward (the GEMM recomputed), so that the (T, V'/tp)
// logits are never whole (issue 49): the same numbers as head_logits then
// vocab_parallel_logprob_entropy, but each chunk's extra memory instead of the whole's. Gradients
// reach h and w (the backward's collectives are the callers': h's copy to tp).
logprob_entropy chunked_head_logprob_entropy(const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels,
                                             const head_transform& t, const vocab_shard& shard, const comm_group* tp,
                                             bool with_entropy, bool invariant, std::int64_t chunk_rows);

// Vocab-parallel cross entropy (Megatron's): -log_probs.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                        const vocab_shard& shard, const comm_group* tp);

}  // namespace megadsl
