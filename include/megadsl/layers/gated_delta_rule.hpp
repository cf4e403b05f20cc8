// The gated delta rule (Yang, Kautz, Hatamizadeh 2024; Qwen3-Next's linear attention) and the
// causal depthwise conv before it: local math on one rank's heads, no collective.
//
// Per value head, with state S (dk, dv) starting at zero in each row:
//   S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - (exp(g_t) S_{t-1})^T k_t))^T,   o_t = S_t^T q_t
// with q and k L2-normed per head in fp32 (eps 1e-6) and q scaled by dk^-1/2, as transformers'
// torch_chunk_gated_delta_rule with use_qk_l2norm_in_kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace megadsl {

// q, k: (B, L, Hk, dk); v: (B, L, Hv, dv), Hv a multiple of Hk (value head j reads key head
// j / (Hv / Hk)); g (the log decay, <= 0) and beta: (B, L, Hv). Returns (B, L, Hv, dv) in v's
// dtype, computed in fp32. The chunked form: within each chunk of `chunk` tokens the updates are
// one triangular solve (the UT transform) and matmuls; across chunks a scan of the state. Built of
// differentiable ATen ops, so its backward is autograd's exact gradient of this form.
at::Tensor chunk_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const at::Tensor& beta, std::int64_t chunk = 64);

// The same, token by token (transformers' torch_recurrent_gated_delta_rule): the oracle the tests
// hold the chunked form to.
at::Tensor recurrent_gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                      const at::Tensor& beta);

// SiLU of a causal depthwise conv: x (B, L, C), w (C, K); out[t, c] = silu(sum_j w[c, j] x[t - K + 1 + j, c]),
// zeros before each row's start (transformers' causal_conv1d_fn with activation "silu").
at::Tensor causal_conv1d_silu(const at::Tensor& x, const at::Tensor& w);

}  // namespace megadsl
