// The launchers of src/cuda/fused_kernels.cu: raw device pointers of contiguous rows, the CUDA
// stream as a void*, so that neither side includes the other's headers (ATen, cuda_runtime.h).
// Each launches on `stream` and returns at once; a launch error throws std::runtime_error.
#pragma once

#include <cstdint>

namespace megadsl::cuda_kernels {

enum class half_type { bf16, fp16 };

// logits (rows, width) 16-bit; labels (rows) int64 global ids; m, s, a, zy (rows) fp32 out.
void logits_row_stats(const void* logits, half_type t, std::int64_t rows, std::int64_t width, std::int64_t valid,
                      const std::int64_t* labels, std::int64_t start, float* m, float* s, float* a, float* zy,
                      void* stream);
// grad_out (rows, width) 16-bit, every column written.
void logits_row_grad(const void* logits, half_type t, std::int64_t rows, std::int64_t width, std::int64_t valid,
                     const std::int64_t* labels, std::int64_t start, const float* m, const float* s, const float* a,
                     const float* g_logp, const float* g_h, void* grad_out, void* stream);
// gate_up (rows, 2f) as [gate | up]; out (rows, f).
void swiglu_forward(const void* gate_up, half_type t, std::int64_t rows, std::int64_t f, void* out, void* stream);
// grad_out (rows, f); grad_gate_up (rows, 2f).
void swiglu_backward(const void* gate_up, const void* grad_out, half_type t, std::int64_t rows, std::int64_t f,
                     void* grad_gate_up, void* stream);

// x a (tokens, a, b, 2 half) view with element strides (st, sa, sb, 1); cos, sin (tokens, half)
// contiguous in x's type; out (tokens, a, b, 2 half) contiguous: o1 = x1 c - x2 s, o2 = x2 c + x1 s
// (s negated with `inverse`: the backward).
void rope(const void* x, half_type t, std::int64_t tokens, std::int64_t a, std::int64_t b, std::int64_t st,
          std::int64_t sa, std::int64_t sb, std::int64_t half, const void* cos, const void* sin, bool inverse,
          void* out, void* stream);

}  // namespace megadsl::cuda_kernels
