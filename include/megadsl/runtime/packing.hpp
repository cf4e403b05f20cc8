// From a padded batch (b, s) to the token stream the model runs on, and back (DESIGN §8).
//
// Padded path: all b*s positions, HF position ids clip(cumsum(mask) - 1, 0).
// Remove-padding: only the nnz real tokens, row after row, with cu_seqlens; positions restart at 0
// for each sequence. Either stream is then padded to a multiple of `multiple` (tp under SP); the
// pad rows never reach a result. `unpack` scatters per-token results back to (b, s), zeros at
// padding, differentiably.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {

struct packed_tokens {
  bool rmpad = false;
  std::int64_t batch = 0, seq = 0;
  std::int64_t tokens = 0;        // T: real stream length (b*s padded, nnz packed)
  at::Tensor ids;                 // (T',) int64, T' = T rounded up to `multiple`
  at::Tensor positions;           // (T',) int64
  at::Tensor labels;              // (T',) int64
  at::Tensor label_valid;         // (T',) float 0/1: a log-prob exists for this token
  at::Tensor attention_mask;      // (b, s) bool (padded path)
  bool no_padding = false;        // every position is a real token (the attention needs no key mask)
  at::Tensor token_valid;         // (T,) float 0/1
  at::Tensor index;               // (T,) int64 flat position in b*s of each stream token
  at::Tensor real_rows;           // (n,) int64 the padded stream's rows of real tokens (padded path with padding)
  std::vector<std::int64_t> cu_seqlens;  // (b+1) offsets into the packed stream (rmpad)
  std::int64_t max_position = 0;
  at::Tensor temperature;         // (T,) float: each token's row's temperature, when the batch gives them

  // (T, ...) -> (b, s, ...), zeros at padding.
  [[nodiscard]] at::Tensor unpack(const at::Tensor& per_token) const;
  // Moves the tensors to `device` (packing itself runs where the batch is, usually the CPU).
  void to(const at::Device& device);
};

packed_tokens pack_tokens(const batch& b, bool rmpad, std::int64_t multiple, std::int64_t vocab);

// Context parallelism: cp rank `rank`'s share of a stream packed to a multiple of cp (rows
// [rank T'/cp, (rank + 1) T'/cp)), what every block but the attention core runs on. Its `tokens`
// are the real tokens among those rows (a prefix: the padding is at the stream's end, so a rank
// may hold none); `index`, `token_valid` and `temperature` are theirs. The sequences' structure
// (cu_seqlens, attention_mask, batch, seq) stays the whole stream's: `unpack` belongs to it.
packed_tokens cp_share(const packed_tokens& whole, std::int64_t cp, std::int64_t rank);

// Ring context parallelism's load-balanced split (Megatron's): each sequence of the whole stream
// (a batch row's stretch of it) cut into 2 cp chunks of ceil(length / 2 cp) tokens, cp rank i
// holding chunks i and 2 cp - 1 - i, so that causal attention's work is even over the ranks; a
// sequence shorter than 2 cp chunks leaves some ranks without its tokens. Each rank's share is its
// real tokens (in stream order) then padding rows, `rows` in all (a multiple of `multiple`).
struct cp_ring_split {
  std::int64_t rows = 0;           // every rank's share
  at::Tensor order;                // (cp rows,) int64: the whole stream's row at each place of the shares, rank by rank
  at::Tensor places;               // (T,) int64: each real token's place in `order` (what a gather over cp reorders by)
  std::vector<std::int64_t> real;  // per rank: its real tokens (a prefix of its rows)
};
// The split of `whole` over `cp` ranks; `whole` is padded with stream rows up to cp rows first.
cp_ring_split ring_split(packed_tokens& whole, std::int64_t cp, std::int64_t multiple);
// Rank `rank`'s share under `split`, as cp_share's: `tokens` its real rows, `index`,
// `token_valid` and `temperature` theirs; the sequences' structure the whole stream's.
packed_tokens ring_share(const packed_tokens& whole, const cp_ring_split& split, std::int64_t rank);

}  // namespace megadsl
