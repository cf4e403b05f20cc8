// Fused kernels of the reduced-precision CUDA path (src/cuda/fused_kernels.cu): one pass each
// where the composed ATen ops take several, for the largest elementwise work of a step. They run
// only on CUDA tensors in bf16 or fp16 in a build with CUDA; fp32 and the CPU keep the composed ops,
// whose numbers the layouts are checked against. Each rounds its output once where HF's bf16 ops
// round twice (RMSNorm's normed value before the weight, silu(g) before the product): within a
// bf16 ulp of HF's, not bit-equal to it or to the composed ops. MEGADSL_FUSED_KERNELS=0 (or
// set_fused_kernels) turns them off, to measure what they save.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace megadsl {

// Whether the fused kernels take tensors like `t` (CUDA, bf16/fp16, a CUDA build, switched on).
[[nodiscard]] bool fused_kernels_take(const at::Tensor& t);
// Switches them on or off for the process; returns whether they were on.
bool set_fused_kernels(bool on);

// silu(gate) * up of [gate | up] (T, 2f) -> (T, f), differentiable (one kernel each way; the
// backward keeps gate_up alone).
at::Tensor fused_swiglu(const at::Tensor& gate_up);

// Rotate-half RoPE of x (T, ..., 2h; at most 4 dims, its last one contiguous: a view of the
// projections will do) by per-token tables cos, sin (T, h) in x's dtype, differentiable in x (one
// kernel each way, out contiguous): o1 = x1 c - x2 s, o2 = x2 c + x1 s, rounded once.
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Per row of 16-bit logits (T, width), over the first `valid` columns: (m, s, a, zy) fp32 (T) with
// m = max z, s = sum exp(z - m), a = sum exp(z - m) z, zy = z[label - start] (0 when out of range).
std::array<at::Tensor, 4> logits_row_stats(const at::Tensor& logits, const at::Tensor& labels, std::int64_t start,
                                           std::int64_t valid);
// d(g_logp . logp + g_h . H)/dz of the same rows, (T, width) in the logits' dtype, padding 0:
// -p (g_logp + g_h (z - mean_z)) + g_logp onehot, p = exp(z - m) / s, mean_z = a / s.
at::Tensor logits_row_grad(const at::Tensor& logits, const at::Tensor& labels, std::int64_t start, std::int64_t valid,
                           const at::Tensor& m, const at::Tensor& s, const at::Tensor& a, const at::Tensor& g_logp,
                           const at::Tensor& g_h);

}  // namespace megadsl
