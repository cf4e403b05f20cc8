// The library's blocks' run-time modules: one factory per block, each defined in the block's own
// source file under src/layers/ (compiled once). A user's block defines its own module class the
// same way, in its own files (layers/module.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "megadsl/layers/module.hpp"
#include "megadsl/shard_plan.hpp"

namespace megadsl {

// ---- norms (src/layers/norms.cpp): the weight (and bias) `<prefix>.weight` of the layer ----
using norm_factory = std::unique_ptr<norm_module> (*)(const module_params& p, std::string_view prefix, double eps);
std::unique_ptr<norm_module> make_rms_norm(const module_params& p, std::string_view prefix, double eps);       // Llama
std::unique_ptr<norm_module> make_rms_norm_1p(const module_params& p, std::string_view prefix, double eps);    // Gemma
std::unique_ptr<norm_module> make_rms_norm_wmul(const module_params& p, std::string_view prefix, double eps);  // OLMo2
std::unique_ptr<norm_module> make_layer_norm(const module_params& p, std::string_view prefix, double eps);     // + bias

// ---- activations (src/layers/activations.cpp) ----
at::Tensor silu_activation(const at::Tensor& x);
at::Tensor gelu_tanh_activation(const at::Tensor& x);
at::Tensor gelu_activation(const at::Tensor& x);  // exact (erf)
// act(gate) * up on a fused [gate ; up] projection output (T, 2f) -> (T, f).
at::Tensor gated(const at::Tensor& gate_up, activation_fn act);

// ---- q/k norms before RoPE (src/layers/qk_norms.cpp) ----
// Applied to q (T, G, Q, d) and k (T, G, d) of this rank's heads.
class qk_norm_module {
 public:
  virtual ~qk_norm_module() = default;
  virtual void apply(at::Tensor& q, at::Tensor& k, layer_context& c) const = 0;
};
// Qwen3: a norm over head_dim for q and one for k, each one weight for every head (q_norm,
// k_norm; replicated, their gradients partial over tp).
std::unique_ptr<qk_norm_module> make_per_head_qk_norm(std::unique_ptr<norm_module> q, std::unique_ptr<norm_module> k);
// OLMo2: over the whole projection width (heads * d for q, kv_heads * d for k), split over tp with
// the heads: the fp32 sum of squares summed over tp, then each norm's weight step.
std::unique_ptr<qk_norm_module> make_full_width_qk_norm(std::unique_ptr<norm_module> q, std::unique_ptr<norm_module> k,
                                                        double eps, std::int64_t q_width, std::int64_t k_width);

// ---- attention (src/layers/attention.cpp): qkv (+ bias), o_proj (+ bias) ----
struct attention_settings {
  qkv_rank_layout qkv;      // this rank's kv groups and query heads
  double scale = 0;         // the scores' scale; 0: 1 / sqrt(head_dim)
  double softcap = 0;       // Gemma2's tanh soft-cap of the scores; 0: none
  std::int64_t window = 0;  // this layer's sliding window; 0: none
  bool selective_recompute = false;
  std::unique_ptr<qk_norm_module> qk_norm;  // null: none
};
std::unique_ptr<layer_module> make_attention(const module_params& p, attention_settings s);

// ---- MLPs ----
// down(act(gate x) * up x) (src/layers/gated_mlp.cpp): gate_up, down.
std::unique_ptr<layer_module> make_gated_mlp(const module_params& p, activation_fn act);
// proj(act(fc x + b)) + b (src/layers/plain_mlp.cpp): fc (+ bias), down (+ bias).
std::unique_ptr<layer_module> make_plain_mlp(const module_params& p, activation_fn act);
// A mixture of gated experts behind a softmax top-k router (src/layers/moe_mlp.cpp): router,
// experts.{e}.gate_up / down for this rank's experts, an optional shared expert and its gate.
struct moe_settings {
  std::int64_t experts = 0, top_k = 0;
  bool norm_topk = false;
  std::int64_t first_expert = 0, experts_per_rank = 0;  // this ep rank's experts
};
std::unique_ptr<layer_module> make_moe_mlp(const module_params& p, activation_fn act, moe_settings s);

// ---- residual combinators (src/layers/residuals.cpp) ----
// x + inner(norm(x))
std::unique_ptr<layer_module> make_pre_norm(std::unique_ptr<norm_module> norm, std::unique_ptr<layer_module> inner);
// x + norm(inner(x))
std::unique_ptr<layer_module> make_post_norm(std::unique_ptr<norm_module> norm, std::unique_ptr<layer_module> inner);
// x + post(inner(pre(x)))
std::unique_ptr<layer_module> make_sandwich(std::unique_ptr<norm_module> pre, std::unique_ptr<layer_module> inner,
                                            std::unique_ptr<norm_module> post);
// x + attn(n1(x)) + mlp(n2(x)), summed as HF does: mlp + attn + x
std::unique_ptr<layer_module> make_parallel(std::unique_ptr<norm_module> attn_norm, std::unique_ptr<layer_module> attn,
                                            std::unique_ptr<norm_module> mlp_norm, std::unique_ptr<layer_module> mlp);
// first, then second on its output (a layer of two sublayers)
std::unique_ptr<layer_module> make_sequence(std::unique_ptr<layer_module> first, std::unique_ptr<layer_module> second);

// ---- the embedding (src/layers/embedding.cpp): vocab-parallel, token ids (T',) -> (T'/tp or T', h) ----
std::unique_ptr<layer_module> make_embedding(const at::Tensor& weight, bool scale_by_sqrt_hidden);

}  // namespace megadsl
