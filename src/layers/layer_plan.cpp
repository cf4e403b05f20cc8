// The composition's blocks, chosen per layer: the one place the shape's block knobs meet the
// blocks' modules (each defined in its own file here).
#include <ATen/ATen.h>

#include <cmath>

#include "megadsl/layers/block_modules.hpp"
#include "megadsl/layers/layer_plan.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace {

norm_factory norm_of(const shape& s) {
  switch (s.norm.get()) {
    case norm_kind::rms_1p: return make_rms_norm_1p;
    case norm_kind::rms_wmul: return make_rms_norm_wmul;
    case norm_kind::layer_norm: return make_layer_norm;
    case norm_kind::rms: break;
  }
  return make_rms_norm;
}

activation_fn activation_of(const shape& s) {
  switch (s.mlp_activation.get()) {
    case activation::gelu_tanh: return gelu_tanh_activation;
    case activation::gelu: return gelu_activation;
    case activation::silu: break;
  }
  return silu_activation;
}

std::unique_ptr<layer_module> attention_of(const module_params& p, const layer_plan_args& a) {
  const shape& s = a.s;
  attention_settings st;
  st.qkv = qkv_layout(s, a.l, a.tp_rank);
  // Gemma2 scales the scores by query_pre_attn_scalar^-1/2 (0: the kernels' 1 / sqrt(head_dim)).
  if (const double q = s.query_pre_attn_scalar.get(); q != 0) st.scale = std::pow(q, -0.5);  // as Python computes it
  st.softcap = s.attn_softcap.get();
  st.window = a.options.attention_window.of(p.layer);
  st.selective_recompute = a.l.recompute.get() == recompute_kind::selective;
  const norm_factory norm = norm_of(s);
  const double eps = s.rms_eps.get();
  const std::int64_t d = effective_head_dim(s).get();
  if (s.qk_norm.get() == qk_norm_kind::per_head)
    st.qk_norm = make_per_head_qk_norm(norm(p, "q_norm", eps), norm(p, "k_norm", eps));
  else if (s.qk_norm.get() == qk_norm_kind::full_width)
    st.qk_norm = make_full_width_qk_norm(norm(p, "q_norm", eps), norm(p, "k_norm", eps), eps, s.heads.get() * d,
                                         s.kv_heads.get() * d);
  return make_attention(p, std::move(st));
}

std::unique_ptr<layer_module> mlp_of(const module_params& p, const layer_plan_args& a) {
  const shape& s = a.s;
  if (s.mlp.get() == mlp_kind::plain) return make_plain_mlp(p, activation_of(s));
  if (sparse_layer(s, p.layer))  // a mixture's dense layers have the gated MLP
    return make_moe_mlp(p, activation_of(s),
                        {s.experts.get(), s.top_k.get(), s.norm_topk.get(), a.first_expert, a.experts_per_rank});
  return make_gated_mlp(p, activation_of(s));
}

}  // namespace

std::unique_ptr<layer_module> build_layer(const module_params& p, const layer_plan_args& a) {
  const shape& s = a.s;
  const norm_factory norm = norm_of(s);
  const double eps = s.rms_eps.get();
  switch (s.residual.get()) {
    case residual_kind::post_norm:
      return make_sequence(make_post_norm(norm(p, "attn_post_norm", eps), attention_of(p, a)),
                           make_post_norm(norm(p, "mlp_post_norm", eps), mlp_of(p, a)));
    case residual_kind::sandwich:
      return make_sequence(
          make_sandwich(norm(p, "attn_norm", eps), attention_of(p, a), norm(p, "attn_post_norm", eps)),
          make_sandwich(norm(p, "mlp_norm", eps), mlp_of(p, a), norm(p, "mlp_post_norm", eps)));
    case residual_kind::parallel:
      return make_parallel(norm(p, "attn_norm", eps), attention_of(p, a), norm(p, "mlp_norm", eps), mlp_of(p, a));
    case residual_kind::pre_norm: break;
  }
  return make_sequence(make_pre_norm(norm(p, "attn_norm", eps), attention_of(p, a)),
                       make_pre_norm(norm(p, "mlp_norm", eps), mlp_of(p, a)));
}

std::unique_ptr<layer_module> build_final_norm(const module_params& p, const shape& s) {
  return norm_of(s)(p, "final_norm", s.rms_eps.get());
}

std::unique_ptr<layer_module> build_embedding(const at::Tensor& weight, const shape& s) {
  return make_embedding(weight, s.embed_scale.get() == embed_scale_kind::sqrt_hidden);
}

bool zero_centred_norms(const shape& s) { return s.norm.get() == norm_kind::rms_1p; }

std::int64_t routing_slots(const shape& s) { return s.mlp.get() == mlp_kind::moe ? s.top_k.get() : 0; }

}  // namespace megadsl
