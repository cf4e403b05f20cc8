// Collectives as autograd functions: Megatron's forward/backward pairs (reference §3).
//
// Activations are token-major `(T, h)`; sequence parallelism splits dim 0 (tokens) across the
// tensor-parallel group. Every mapping is the identity for a group of one.
//
//   mapping                 forward                     backward
//   copy_to_tp              identity                    all-reduce
//   reduce_from_tp          all-reduce                  identity
//   gather_from_tp_last     all-gather last dim         split last dim
//   scatter_to_sp           split dim 0                 all-gather dim 0
//   gather_from_sp          all-gather dim 0            reduce-scatter dim 0 (split if !tp_grad)
//   reduce_scatter_to_sp    reduce-scatter dim 0        all-gather dim 0
//   all_to_all_rows         rows to each rank (uneven)  the same with the counts swapped
//   cp_tokens_to_heads      all-to-all (Ulysses)        the inverse all-to-all
//   cp_heads_to_tokens      all-to-all (Ulysses)        the inverse all-to-all
//   gather_from_cp          all-gather dim 0            this rank's rows
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "megadsl/parallel/comm.hpp"

namespace megadsl {

at::Tensor copy_to_tp(const at::Tensor& x, const comm_group& tp);
at::Tensor reduce_from_tp(const at::Tensor& x, const comm_group& tp);
at::Tensor gather_from_tp_last(const at::Tensor& x, const comm_group& tp);
at::Tensor scatter_to_sp(const at::Tensor& x, const comm_group& tp);
at::Tensor gather_from_sp(const at::Tensor& x, const comm_group& tp, bool tensor_parallel_output_grad = true);
at::Tensor reduce_scatter_to_sp(const at::Tensor& x, const comm_group& tp);
// Expert-parallel token dispatch: send_rows[i] rows of x to rank i of `g`, recv_rows[i] from it.
at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<std::int64_t>& send_rows,
                           const std::vector<std::int64_t>& recv_rows, const comm_group& g);

// Context parallelism (Ulysses): a cp rank's L consecutive tokens of all its G head groups become
// all cp L tokens of its G / cp groups: (L, G, ...) -> (cp L, G / cp, ...), tokens in stream order.
at::Tensor cp_tokens_to_heads(const at::Tensor& x, const comm_group& cp);
// The inverse: (cp L, n) of this rank's groups -> (L, cp n), groups in rank order.
at::Tensor cp_heads_to_tokens(const at::Tensor& y, const comm_group& cp);
// Per-token values of a cp rank's real tokens (its first mine.size(0) <= `rows` rows) -> the whole
// stream's first `tokens` rows, on every cp rank; the backward keeps this rank's rows (every cp
// rank computes the same loss from the whole).
at::Tensor gather_from_cp(const at::Tensor& mine, std::int64_t rows, std::int64_t tokens, const comm_group& cp);

}  // namespace megadsl
