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
//   cp_whole_stream_heads   q, k, v: the two above, or an all-gather of k and v
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
// An attention's q (L, G, Q, d), k and v (L, G, d) on this cp rank's L rows of its tp rank's G kv
// groups -> the whole stream's first `tokens` tokens of this cp rank's share of the query heads
// (rule cp_splits_heads). Whole groups travel in one all-to-all of [q | k | v] (`grouped`, the
// (L, G, Q + 2, d) tensor they are views of, when it still holds them; else concatenated); a share
// of one group's query heads travels alone, and that group's k and v are gathered whole over cp
// (their gradients summed back by the gather's reduce-scatter): q (tokens, 1, Q / cp, d).
void cp_whole_stream_heads(const at::Tensor& grouped, at::Tensor& q, at::Tensor& k, at::Tensor& v,
                           std::int64_t tokens, const comm_group& cp);
// Per-token values of a cp rank's real tokens (its first mine.size(0) <= `rows` rows) -> the whole
// stream's first `tokens` rows, on every cp rank; the backward keeps this rank's rows (every cp
// rank computes the same loss from the whole). `places` (tokens,): where each whole-stream token
// sits among the ranks' shares laid end to end (ring cp's load-balanced split); undefined: the
// shares are the stream's consecutive stretches.
at::Tensor gather_from_cp(const at::Tensor& mine, std::int64_t rows, std::int64_t tokens, const comm_group& cp,
                          const at::Tensor& places = {});

}  // namespace megadsl
