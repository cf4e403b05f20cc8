// Per-rank math the blocks share (RoPE, the attention kernels): each function sees local tensors
// and issues no collective. The blocks (src/layers/) compose them with parallel/mappings.hpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "megadsl/shape.hpp"

namespace megadsl {

// RoPE inverse frequencies (d/2,) with the shape's scaling (none, linear, dynamic NTK, llama3, YaRN;
// YaRN's attention factor scales the tables, rope_for_positions).
// `seq_len` (longest position + 1 in the batch) matters only for dynamic NTK.
at::Tensor rope_inv_freq(const shape& s, std::int64_t seq_len);

struct rope_tables {
  at::Tensor cos, sin;  // (T, d), HF's cat(freqs, freqs) convention
};
rope_tables rope_for_positions(const at::Tensor& inv_freq, const at::Tensor& positions, const shape& s);

// x: (T, ..., d); rotate-half RoPE with per-token tables (T, r): the first r of the d dimensions
// rotate, the rest pass through (r < d: partial rotary). `interleaved`: the rotated dims' pairs
// (x0, x1), (x2, x3), ... rotate (ERNIE 4.5, GLM-4, DeepSeek's rope_interleave), returned as halves
// [x0', x2', ... | x1', x3', ...]: q k^T is unchanged when q and k are rotated alike, and each
// element is HF's in the same roundings.
at::Tensor apply_rope(const at::Tensor& x, const rope_tables& t, bool interleaved = false);

// Dropout on the attention probabilities (a training step with attention dropout; p 0: none).
// The kernel then takes the explicit scores' path; each probability's mask comes from its query's
// key, its key's position, the global head and the layer's salt (layers/dropout.hpp).
struct attention_dropout {
  double p = 0;
  std::uint64_t salt = 0;        // the step's, the layer's and the place's
  std::int64_t first_head = 0;   // the global query head of the kernel's first head
  at::Tensor keys, positions;    // (T,) int64: each of the kernel's token rows' key and position
};

// What a layer's attention computes beyond causal softmax(q k^T / sqrt(d)) v (run-time knobs).
struct attention_math {
  double scale = 0;         // the scores' scale; 0: 1 / sqrt(head_dim)
  double softcap = 0;       // scores = cap * tanh(scores / cap) before the mask (Gemma2); 0: none
  std::int64_t window = 0;  // key j is visible to query i only when i - j < window; 0: no window
  // Llama 4's chunked attention: key j is visible to query i only when their positions in the
  // sequence fall in one chunk of this many (p / chunk equal); 0: no chunks.
  std::int64_t chunk = 0;
  // gpt-oss's learned sinks (one logit per local query head, in q's head order): each row's
  // softmax has that one more logit, without a value. Undefined: none.
  at::Tensor sinks;
  attention_dropout dropout;
};

// Grouped-query attention over local heads.
//   q: (T, G, Q, d), k, v: (T, G, d); G local kv groups, Q query heads per group. Output (T, G*Q*d).
// Padded path: T = b*s, causal within each row and keys masked by `key_mask` (b, s); an undefined
// `key_mask` means no padding (every key real).
at::Tensor attention_padded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_mask, std::int64_t batch, std::int64_t seq,
                            const attention_math& m = {});
// Remove-padding path: T = nnz packed tokens, sequences delimited by `cu_seqlens` (n+1 offsets);
// causal inside each sequence, never across; cost sum(s_i^2), no nnz x nnz mask.
at::Tensor attention_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<std::int64_t>& cu_seqlens, const attention_math& m = {});

struct packed_tokens;
// One of the two kernels over a batch's packing, as the attention blocks' cores call it: varlen
// over its sequences (remove-padding) or padded over its rows, keys masked where the batch pads.
// It holds what it needs of the packing (copied), so a core may capture it for a rerun.
struct attention_kernel {
  attention_math math;
  bool rmpad = false;
  std::vector<std::int64_t> cu_seqlens;  // (rmpad)
  at::Tensor key_mask;                   // (b, s) (padded; undefined: no padding)
  std::int64_t batch = 0, seq = 0;
  static attention_kernel over(const packed_tokens& pk, const attention_math& m);
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
    return rmpad ? attention_varlen(q, k, v, cu_seqlens, math) : attention_padded(q, k, v, key_mask, batch, seq, math);
  }
};

}  // namespace megadsl
