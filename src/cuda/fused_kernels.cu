// The fused CUDA kernels of the reduced-precision (bf16/fp16) path: one pass each where ATen would
// make several. Plain CUDA over raw pointers (no ATen here, so nvcc compiles this file in seconds);
// src/layers/fused_ops.cpp wraps them as tensors and autograd functions. Math in fp32 throughout.
//
//   logits_row_stats  per row of (rows, width) logits, over its first `valid` columns:
//                     m = max z, s = sum exp(z - m), a = sum exp(z - m) z, zy = z[label - start]
//   logits_row_grad   dz = -p (g_logp + g_h (z - a / s)) + g_logp [j = label - start], p = exp(z - m) / s;
//                     columns at or past `valid` (vocabulary padding) get 0
//   swiglu_forward    y = silu(g) u over [g | u] rows of width 2f
//   swiglu_backward   dg = dy u silu'(g), du = dy silu(g)
//   rope              o1 = x1 c - x2 s, o2 = x2 c + x1 s over each row's halves [x1 | x2] (s negated:
//                     the backward), rows of a strided (T, A, B, d) view, per-token tables (T, d/2)
#include "fused_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace megadsl::cuda_kernels {
namespace {

constexpr int threads = 512;
constexpr int vec = 8;  // elements of 2 bytes in one 16-byte load

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

union pack8 {
  uint4 raw;
  unsigned short bits[vec];
};
template <typename T>
__device__ __forceinline__ float element(const pack8& p, int i) {
  T v;
  static_assert(sizeof(T) == 2, "16-bit elements");
  memcpy(&v, &p.bits[i], 2);
  return to_float(v);
}
template <typename T>
__device__ __forceinline__ void set_element(pack8& p, int i, float x) {
  const T v = from_float<T>(x);
  memcpy(&p.bits[i], &v, 2);
}

void check_rows(std::int64_t rows, const char* what) {
  if (rows > 2147483647) throw std::runtime_error(std::string("megadsl: CUDA kernel ") + what + ": more than 2^31 - 1 rows");
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("megadsl: CUDA kernel ") + what + ": " + cudaGetErrorString(e));
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// ---- log-probs and entropy over the vocabulary ---------------------------------------------------

// The running (max, sum of exp, sum of exp * z) of a stretch of one row.
struct softmax_sums {
  float m, s, a;
};

// max that keeps a NaN (fmaxf drops it): a NaN logit makes its row's results NaN, as the composed
// ops' max and sums do, never a finite log-prob that hides it.
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? NAN : fmaxf(a, b); }

__device__ __forceinline__ softmax_sums combine(softmax_sums x, softmax_sums y) {
  const float m = nan_max(x.m, y.m);
  if (m != m) return {m, m, m};
  if (m == -INFINITY) return {m, 0.f, 0.f};
  const float fx = expf(x.m - m), fy = expf(y.m - m);
  return {m, x.s * fx + y.s * fy, x.a * fx + y.a * fy};
}

// Adds n values (their max `local`) to the running sums.
template <int N>
__device__ __forceinline__ void add_values(softmax_sums& r, const float (&z)[N], int n) {
  float local = -INFINITY;
  for (int i = 0; i < n; ++i) local = nan_max(local, z[i]);
  if (local != local || r.m != r.m) {  // NaN in, NaN out
    r = {NAN, NAN, NAN};
    return;
  }
  if (local > r.m) {
    const float f = expf(r.m - local);  // 0 while r is empty (r.m = -inf)
    r.s *= f;
    r.a *= f;
    r.m = local;
  }
  if (r.m == -INFINITY) return;
  for (int i = 0; i < n; ++i) {
    const float e = expf(z[i] - r.m);
    r.s += e;
    r.a += e * z[i];
  }
}

__device__ softmax_sums block_reduce(softmax_sums r) {
  __shared__ softmax_sums partial[threads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const softmax_sums y{__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o),
                         __shfl_xor_sync(0xffffffffu, r.a, o)};
    r = combine(r, y);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = r;
  __syncthreads();
  if (warp == 0) {
    r = lane < threads / 32 ? partial[lane] : softmax_sums{-INFINITY, 0.f, 0.f};
    for (int o = 16; o > 0; o /= 2) {
      const softmax_sums y{__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o),
                           __shfl_xor_sync(0xffffffffu, r.a, o)};
      r = combine(r, y);
    }
  }
  return r;  // thread 0's is the block's
}

template <typename T, bool Vec>
__global__ void __launch_bounds__(threads) row_stats_kernel(const T* __restrict__ logits, std::int64_t width,
                                                            std::int64_t valid, const std::int64_t* __restrict__ labels,
                                                            std::int64_t start, float* __restrict__ m_out,
                                                            float* __restrict__ s_out, float* __restrict__ a_out,
                                                            float* __restrict__ zy_out) {
  const std::int64_t row = blockIdx.x;
  const T* z = logits + row * width;
  softmax_sums r{-INFINITY, 0.f, 0.f};
  std::int64_t done = 0;
  if constexpr (Vec) {
    const std::int64_t packs = valid / vec;
    const uint4* p = reinterpret_cast<const uint4*>(z);
    for (std::int64_t i = threadIdx.x; i < packs; i += threads) {
      pack8 v;
      v.raw = __ldg(p + i);
      float x[vec];
      for (int k = 0; k < vec; ++k) x[k] = element<T>(v, k);
      add_values(r, x, vec);
    }
    done = packs * vec;
  }
  for (std::int64_t j = done + threadIdx.x; j < valid; j += threads) {
    const float x[1] = {to_float(z[j])};
    add_values(r, x, 1);
  }
  r = block_reduce(r);
  if (threadIdx.x == 0) {
    m_out[row] = r.m;
    s_out[row] = r.s;
    a_out[row] = r.a;
    const std::int64_t y = labels[row] - start;
    zy_out[row] = (y >= 0 && y < valid) ? to_float(z[y]) : 0.f;
  }
}

__device__ __forceinline__ float logit_grad(float z, float m, float inv_s, float mean_z, float g_logp, float g_h) {
  const float p = expf(z - m) * inv_s;
  return -p * (g_logp + g_h * (z - mean_z));
}

template <typename T, bool Vec>
__global__ void __launch_bounds__(threads) row_grad_kernel(const T* __restrict__ logits, std::int64_t width,
                                                           std::int64_t valid, const std::int64_t* __restrict__ labels,
                                                           std::int64_t start, const float* __restrict__ m_in,
                                                           const float* __restrict__ s_in, const float* __restrict__ a_in,
                                                           const float* __restrict__ g_logp_in,
                                                           const float* __restrict__ g_h_in, T* __restrict__ grad) {
  const std::int64_t row = blockIdx.x;
  const T* z = logits + row * width;
  T* d = grad + row * width;
  const float m = m_in[row], s = s_in[row], inv_s = 1.f / s, mean_z = a_in[row] / s;
  const float g_logp = g_logp_in[row], g_h = g_h_in[row];
  const std::int64_t label = labels[row] - start;
  const std::int64_t y = (label >= 0 && label < valid) ? label : -1;  // a label on another shard or in padding: none
  std::int64_t done = 0;
  if constexpr (Vec) {
    const std::int64_t packs = width / vec;  // whole packs of the row; padding columns set to 0 below
    const uint4* p = reinterpret_cast<const uint4*>(z);
    uint4* q = reinterpret_cast<uint4*>(d);
    for (std::int64_t i = threadIdx.x; i < packs; i += threads) {
      pack8 v, out;
      v.raw = __ldg(p + i);
      for (int k = 0; k < vec; ++k) {
        const std::int64_t j = i * vec + k;
        float g = j < valid ? logit_grad(element<T>(v, k), m, inv_s, mean_z, g_logp, g_h) : 0.f;
        if (j == y) g += g_logp;
        set_element<T>(out, k, g);
      }
      q[i] = out.raw;
    }
    done = packs * vec;
  }
  for (std::int64_t j = done + threadIdx.x; j < width; j += threads) {
    float g = j < valid ? logit_grad(to_float(z[j]), m, inv_s, mean_z, g_logp, g_h) : 0.f;
    if (j == y) g += g_logp;
    d[j] = from_float<T>(g);
  }
}

// ---- SwiGLU --------------------------------------------------------------------------------------

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

// One thread per pack of 8 columns (or per column): [g | u] rows of width 2f -> rows of width f.
template <typename T, int N>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, std::int64_t rows, std::int64_t f,
                                      T* __restrict__ out) {
  const std::int64_t per_row = f / N, total = rows * per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / per_row, col = (i % per_row) * N;
    const T* g = gate_up + row * 2 * f + col;
    const T* u = g + f;
    T* y = out + row * f + col;
    if constexpr (N == vec) {
      pack8 pg, pu, py;
      pg.raw = __ldg(reinterpret_cast<const uint4*>(g));
      pu.raw = __ldg(reinterpret_cast<const uint4*>(u));
      for (int k = 0; k < N; ++k) {
        const float x = element<T>(pg, k);
        set_element<T>(py, k, x * sigmoid(x) * element<T>(pu, k));
      }
      *reinterpret_cast<uint4*>(y) = py.raw;
    } else {
      const float x = to_float(*g);
      *y = from_float<T>(x * sigmoid(x) * to_float(*u));
    }
  }
}

template <typename T, int N>
__global__ void swiglu_backward_kernel(const T* __restrict__ gate_up, const T* __restrict__ grad_out,
                                       std::int64_t rows, std::int64_t f, T* __restrict__ grad_gate_up) {
  const std::int64_t per_row = f / N, total = rows * per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / per_row, col = (i % per_row) * N;
    const T* g = gate_up + row * 2 * f + col;
    const T* u = g + f;
    const T* dy = grad_out + row * f + col;
    T* dg = grad_gate_up + row * 2 * f + col;
    T* du = dg + f;
    if constexpr (N == vec) {
      pack8 pg, pu, pdy, pdg, pdu;
      pg.raw = __ldg(reinterpret_cast<const uint4*>(g));
      pu.raw = __ldg(reinterpret_cast<const uint4*>(u));
      pdy.raw = __ldg(reinterpret_cast<const uint4*>(dy));
      for (int k = 0; k < N; ++k) {
        const float x = element<T>(pg, k), up = element<T>(pu, k), gy = element<T>(pdy, k), sg = sigmoid(x);
        set_element<T>(pdg, k, gy * up * sg * (1.f + x * (1.f - sg)));
        set_element<T>(pdu, k, gy * x * sg);
      }
      *reinterpret_cast<uint4*>(dg) = pdg.raw;
      *reinterpret_cast<uint4*>(du) = pdu.raw;
    } else {
      const float x = to_float(*g), up = to_float(*u), gy = to_float(*dy), sg = sigmoid(x);
      *dg = from_float<T>(gy * up * sg * (1.f + x * (1.f - sg)));
      *du = from_float<T>(gy * x * sg);
    }
  }
}

// ---- RoPE ----------------------------------------------------------------------------------------

// One thread per rotated pair: x a (T, A, B, 2 half) view with element strides (st, sa, sb, 1),
// out contiguous, the tables (T, half) contiguous in x's type (HF's rounding of cos and sin).
template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, std::int64_t a_size, std::int64_t b_size, std::int64_t st,
                            std::int64_t sa, std::int64_t sb, std::int64_t half, const T* __restrict__ cos,
                            const T* __restrict__ sin, float sign, std::int64_t total, T* __restrict__ out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i % half, row = i / half;
    const std::int64_t b = row % b_size, a = (row / b_size) % a_size, t = row / (b_size * a_size);
    const T* xr = x + t * st + a * sa + b * sb;
    T* o = out + row * 2 * half;
    const float x1 = to_float(xr[j]), x2 = to_float(xr[j + half]);
    const float c = to_float(cos[t * half + j]), s = sign * to_float(sin[t * half + j]);
    o[j] = from_float<T>(x1 * c - x2 * s);
    o[j + half] = from_float<T>(x2 * c + x1 * s);
  }
}

int elementwise_blocks(std::int64_t work) {
  const std::int64_t b = (work + 255) / 256;
  return static_cast<int>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

template <typename T>
void stats(const void* logits, std::int64_t rows, std::int64_t width, std::int64_t valid, const std::int64_t* labels,
           std::int64_t start, float* m, float* s, float* a, float* zy, cudaStream_t st) {
  if (rows == 0) return;
  check_rows(rows, "logits_row_stats");
  const T* z = static_cast<const T*>(logits);
  if (width % vec == 0 && aligned16(z))
    row_stats_kernel<T, true><<<static_cast<unsigned>(rows), threads, 0, st>>>(z, width, valid, labels, start, m, s, a, zy);
  else
    row_stats_kernel<T, false><<<static_cast<unsigned>(rows), threads, 0, st>>>(z, width, valid, labels, start, m, s, a, zy);
  check(cudaGetLastError(), "logits_row_stats");
}

template <typename T>
void grad(const void* logits, std::int64_t rows, std::int64_t width, std::int64_t valid, const std::int64_t* labels,
          std::int64_t start, const float* m, const float* s, const float* a, const float* g_logp, const float* g_h,
          void* out, cudaStream_t st) {
  if (rows == 0) return;
  check_rows(rows, "logits_row_grad");
  const T* z = static_cast<const T*>(logits);
  T* d = static_cast<T*>(out);
  if (width % vec == 0 && aligned16(z) && aligned16(d))
    row_grad_kernel<T, true><<<static_cast<unsigned>(rows), threads, 0, st>>>(z, width, valid, labels, start, m, s, a,
                                                                               g_logp, g_h, d);
  else
    row_grad_kernel<T, false><<<static_cast<unsigned>(rows), threads, 0, st>>>(z, width, valid, labels, start, m, s, a,
                                                                                g_logp, g_h, d);
  check(cudaGetLastError(), "logits_row_grad");
}

template <typename T>
void swiglu_fwd(const void* gate_up, std::int64_t rows, std::int64_t f, void* out, cudaStream_t st) {
  const T* gu = static_cast<const T*>(gate_up);
  T* y = static_cast<T*>(out);
  if (f % vec == 0 && aligned16(gu) && aligned16(y))
    swiglu_forward_kernel<T, vec><<<elementwise_blocks(rows * f / vec), 256, 0, st>>>(gu, rows, f, y);
  else
    swiglu_forward_kernel<T, 1><<<elementwise_blocks(rows * f), 256, 0, st>>>(gu, rows, f, y);
  check(cudaGetLastError(), "swiglu_forward");
}

template <typename T>
void swiglu_bwd(const void* gate_up, const void* grad_out, std::int64_t rows, std::int64_t f, void* grad_gate_up,
                cudaStream_t st) {
  const T* gu = static_cast<const T*>(gate_up);
  const T* dy = static_cast<const T*>(grad_out);
  T* d = static_cast<T*>(grad_gate_up);
  if (f % vec == 0 && aligned16(gu) && aligned16(dy) && aligned16(d))
    swiglu_backward_kernel<T, vec><<<elementwise_blocks(rows * f / vec), 256, 0, st>>>(gu, dy, rows, f, d);
  else
    swiglu_backward_kernel<T, 1><<<elementwise_blocks(rows * f), 256, 0, st>>>(gu, dy, rows, f, d);
  check(cudaGetLastError(), "swiglu_backward");
}

template <typename T>
void rope_rows(const void* x, std::int64_t tokens, std::int64_t a, std::int64_t b, std::int64_t st, std::int64_t sa,
               std::int64_t sb, std::int64_t half, const void* cos, const void* sin, bool inverse, void* out,
               cudaStream_t stream) {
  const std::int64_t total = tokens * a * b * half;
  rope_kernel<T><<<elementwise_blocks(total), 256, 0, stream>>>(
      static_cast<const T*>(x), a, b, st, sa, sb, half, static_cast<const T*>(cos), static_cast<const T*>(sin),
      inverse ? -1.f : 1.f, total, static_cast<T*>(out));
  check(cudaGetLastError(), "rope");
}

}  // namespace

void rope(const void* x, half_type t, std::int64_t tokens, std::int64_t a, std::int64_t b, std::int64_t st,
          std::int64_t sa, std::int64_t sb, std::int64_t half, const void* cos, const void* sin, bool inverse,
          void* out, void* stream) {
  if (tokens * a * b * half == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (t == half_type::bf16) rope_rows<__nv_bfloat16>(x, tokens, a, b, st, sa, sb, half, cos, sin, inverse, out, s);
  else rope_rows<__half>(x, tokens, a, b, st, sa, sb, half, cos, sin, inverse, out, s);
}

void logits_row_stats(const void* logits, half_type t, std::int64_t rows, std::int64_t width, std::int64_t valid,
                      const std::int64_t* labels, std::int64_t start, float* m, float* s, float* a, float* zy,
                      void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (t == half_type::bf16) stats<__nv_bfloat16>(logits, rows, width, valid, labels, start, m, s, a, zy, st);
  else stats<__half>(logits, rows, width, valid, labels, start, m, s, a, zy, st);
}

void logits_row_grad(const void* logits, half_type t, std::int64_t rows, std::int64_t width, std::int64_t valid,
                     const std::int64_t* labels, std::int64_t start, const float* m, const float* s, const float* a,
                     const float* g_logp, const float* g_h, void* grad_out, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (t == half_type::bf16) grad<__nv_bfloat16>(logits, rows, width, valid, labels, start, m, s, a, g_logp, g_h, grad_out, st);
  else grad<__half>(logits, rows, width, valid, labels, start, m, s, a, g_logp, g_h, grad_out, st);
}

void swiglu_forward(const void* gate_up, half_type t, std::int64_t rows, std::int64_t f, void* out, void* stream) {
  if (rows * f == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  if (t == half_type::bf16) swiglu_fwd<__nv_bfloat16>(gate_up, rows, f, out, st);
  else swiglu_fwd<__half>(gate_up, rows, f, out, st);
}

void swiglu_backward(const void* gate_up, const void* grad_out, half_type t, std::int64_t rows, std::int64_t f,
                     void* grad_gate_up, void* stream) {
  if (rows * f == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  if (t == half_type::bf16) swiglu_bwd<__nv_bfloat16>(gate_up, grad_out, rows, f, grad_gate_up, st);
  else swiglu_bwd<__half>(gate_up, grad_out, rows, f, grad_gate_up, st);
}

}  // namespace megadsl::cuda_kernels
