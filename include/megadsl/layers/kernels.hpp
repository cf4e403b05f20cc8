// Per-rank math of the Llama family: each function sees local tensors and issues no collective.
// The model (runtime/parallel_model.hpp) composes them with the mappings of parallel/mappings.hpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "megadsl/shape.hpp"

namespace megadsl {

// RMSNorm over the last dimension, math in fp32 (HF's order of casts):
//   rms     y = w * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)            (Llama, Qwen, Mistral)
//   rms_1p  y = ((x * rsqrt(mean(x^2) + eps)) * (1 + w.float())).to(x.dtype)   (Gemma)
//   rms_wmul y = (w * (x * rsqrt(mean(x^2) + eps))).to(x.dtype)          (OLMo2)
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, norm_kind kind = norm_kind::rms);
// The weight step of `rms_norm` on fp32 normalised values, cast to `dtype`.
at::Tensor apply_norm_weight(const at::Tensor& normed, const at::Tensor& weight, norm_kind kind, at::ScalarType dtype);

// RoPE inverse frequencies (d/2,) with the shape's scaling (none, linear, dynamic NTK, llama3).
// `seq_len` (longest position + 1 in the batch) matters only for dynamic NTK.
at::Tensor rope_inv_freq(const shape& s, std::int64_t seq_len);

struct rope_tables {
  at::Tensor cos, sin;  // (T, d), HF's cat(freqs, freqs) convention
};
rope_tables rope_for_positions(const at::Tensor& inv_freq, const at::Tensor& positions, const shape& s);

// x: (T, ..., d); rotate-half RoPE with per-token tables (T, r): the first r of the d dimensions
// rotate, the rest pass through (r < d: partial rotary).
at::Tensor apply_rope(const at::Tensor& x, const rope_tables& t);

// What a layer's attention computes beyond causal softmax(q k^T / sqrt(d)) v (run-time knobs).
struct attention_math {
  double scale = 0;         // the scores' scale; 0: 1 / sqrt(head_dim)
  double softcap = 0;       // scores = cap * tanh(scores / cap) before the mask (Gemma2); 0: none
  std::int64_t window = 0;  // key j is visible to query i only when i - j < window; 0: no window
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

// The MLP's activation: SiLU, GELU-tanh or the exact GELU.
at::Tensor activate(const at::Tensor& x, activation act);

// The gated MLP's middle on a fused [gate ; up] projection output (T, 2f) -> (T, f):
// silu(gate) * up (SwiGLU) or gelu_tanh(gate) * up (GeGLU).
at::Tensor gated_activation(const at::Tensor& gate_up, activation act);

}  // namespace megadsl
