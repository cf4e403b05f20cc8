// Invariant arithmetic (layout::invariant): every sum a sequence's outputs go through is taken in an
// order fixed by the model's sizes alone, never by the batch, the padding, the layout's degrees or
// the threads, so a sequence's log-probs, entropy, values and routing are the same bits wherever
// it runs.
//
//   GEMMs        rows in tiles of invariant_row_tile by output columns in tiles of
//                invariant_col_tile (the last ones padded), each tile one GEMM call of that fixed
//                shape on one thread: the BLAS's path never depends on the row count, a rank's
//                output width or the thread count (MKL takes another summation order for few rows
//                or few output columns, and splits the inner dimension over threads for some shapes).
//   row-parallel the input dimension in invariant_k_chunks fixed chunks (tp ranks hold whole
//   linears    chunks), each chunk's partial product apart, summed in a fixed pairwise tree on
//                every rank after an all-gather (or, under sp, an all-to-all of row blocks) instead
//                of an all-reduce whose order depends on tp.
//   long sums    over the vocabulary (log-softmax, entropy): blocks of invariant_sum_block, then a
//                fixed pairwise tree over the blocks of the whole vocabulary (ATen would split a
//                long single-row sum over threads).
//   attention    one kernel call per sequence (padded batches are packed; layout::rmpad does not
//                change the numbers).
//   on CUDA     the same tiles, each chunk's product one cuBLAS call of one shape from contiguous,
//                aligned copies; element-wise kernels as they are (one code path per element); the
//                token stream padded to whole invariant_cuda_rows. Attention is the flash kernel
//                over the packed sequences (each sequence's rows its own blocks).
//   element-wise ATen's vectorised loops compute a SIMD body and a scalar tail, and the two round
//   functions     silu, sigmoid, GELU and softplus differently: where an element falls (a row's width
//                at tp 2, the batch's size) would choose its bits. `pointwise` runs them on the
//                flattened tensor in blocks of invariant_pointwise_block, so every element takes
//                the SIMD body.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace megadsl {

class comm_group;

inline constexpr std::int64_t invariant_row_tile = 128;
inline constexpr std::int64_t invariant_col_tile = 256;
inline constexpr std::int64_t invariant_k_chunks = 8;
inline constexpr std::int64_t invariant_sum_block = 128;
// On CUDA ATen's reductions (a norm's mean, a vocabulary block's sum) lay out their threads by the
// number of rows as well, up to 16: the stream is padded to a multiple of this many rows there.
inline constexpr std::int64_t invariant_cuda_rows = 16;
inline constexpr std::int64_t invariant_pointwise_block = 32768;  // a multiple of any SIMD loop's step (<= 128), at most ATen's grain

// Invariant arithmetic for the element-wise functions this thread runs while it lives (the stage
// opens one around its layers and heads when layout::invariant is on).
class invariant_scope {
 public:
  explicit invariant_scope(bool on);
  ~invariant_scope();
  invariant_scope(const invariant_scope&) = delete;
  invariant_scope& operator=(const invariant_scope&) = delete;

 private:
  bool saved_;
};

// fn(x) for an element-wise fn; inside an invariant_scope every element through the SIMD body
// (the forward's bits; the backward is fn's own).
at::Tensor pointwise(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& fn);

// x.exp_() (contiguous x, no autograd), inside an invariant_scope by whole SIMD blocks.
void exp_in_place(at::Tensor& x);

// x (T, K) @ w (N, K)^T [+ b]: the rows in fixed tiles, each tile's GEMM on one thread; the
// backward is the plain one. Any leading dimensions of x are flattened.
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

// invariant_linear when `invariant`, else at::linear.
at::Tensor linear_in(bool invariant, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

// The sum over dim 0 of `parts` (n, ...) in a fixed pairwise tree: ((p0 + p1) + (p2 + p3)) + ...
at::Tensor tree_sum(const at::Tensor& parts);

// A row-parallel linear's output, the same bits at any tp: x (T, K/tp) this rank's share of the
// input dimension (whole chunks), w (N, K/tp); returns the sum over all of K, (T, N) on every tp
// rank, or (T/tp, N) this rank's rows under sp. `tp` null at tp = 1. Bias not included.
at::Tensor invariant_row_linear(const at::Tensor& x, const at::Tensor& w, const comm_group* tp, bool sp);

// A row-parallel block's partial sums (local, T, N): this rank's adjacent chunks in order, or its
// subtree of them (local = 1), summed over all ranks' chunks in the fixed tree as
// invariant_row_linear does: (T, N) on every rank, or (T/tp, N) this rank's rows under sp. Each
// part's gradient is the output's (gathered under sp).
at::Tensor invariant_chunk_sum(const at::Tensor& parts, const comm_group* tp, bool sp);

// x (T, K/tp) @ w (N, K/tp)^T as this rank's subtree of the fixed tree: its invariant_k_chunks / tp
// chunks of K multiplied apart and summed pairwise, (T, N); `bias` added to the first chunk's
// product (give rank 0's, zeros elsewhere). invariant_chunk_sum(y.unsqueeze(0), tp, sp) then
// completes the tree over the ranks.
at::Tensor invariant_subtree_linear(const at::Tensor& x, const at::Tensor& w, std::int64_t chunks, const at::Tensor& bias = {});

}  // namespace megadsl
