// The shape of a Llama-family model: every field static (part of the type) or `dynamic`.
//
//   using tiny = megadsl::llama<megadsl::shape{.hidden = 256, .layers = 4, .heads = 8, ...}>;
//
// A field left out is `dynamic` for sizes (filled from config.json at run time) and the HF default
// for the rest. `head_dim = 0` means hidden / heads (HF's default when config.json has no head_dim).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "megadsl/static_value.hpp"

namespace megadsl {

enum class rope_type : std::int8_t { none, linear, dynamic_ntk, llama3 };

constexpr std::string_view name_of(rope_type t) {
  switch (t) {
    case rope_type::none: return "none";
    case rope_type::linear: return "linear";
    case rope_type::dynamic_ntk: return "dynamic";
    case rope_type::llama3: return "llama3";
  }
  return "?";
}

// The blocks' numeric knobs (DESIGN decision 16). A family's composition of blocks
// (layers/blocks.hpp) sets them; a user's shape leaves them alone. The layer plan
// (layers/layer_plan.hpp) picks each layer's block modules from them once, when a model is built,
// so a family adds no LibTorch instantiation.

// How a norm applies its weight: RMSNorm as Llama's `w * x.to(dtype)`, Gemma's `(1 + w) * x` in
// fp32, or OLMo2's `(w * x).to(dtype)` in fp32; or LayerNorm with a bias (StarCoder2, NeoX).
enum class norm_kind : std::int8_t { rms, rms_1p, rms_wmul, layer_norm };
// The MLP: gated (down(act(gate x) * up x)), plain (proj(act(fc x + b)) + b), or a mixture of
// gated experts behind a top-k router (Mixtral, Qwen2-MoE, Qwen3-MoE).
enum class mlp_kind : std::int8_t { gated, plain, moe };
// The HF names of a mixture of experts: Mixtral's (block_sparse_moe.gate, experts.E.{w1,w3,w2}) or
// Qwen's (mlp.gate, mlp.experts.E.{gate,up,down}_proj, mlp.shared_expert*).
enum class moe_names : std::int8_t { mixtral, qwen };
// Q/K RMSNorm before RoPE: none, per head over head_dim (Qwen3), or over the full projection width
// (OLMo2: heads * head_dim for q, kv_heads * head_dim for k; under tp a sum of squares over tp).
enum class qk_norm_kind : std::int8_t { none, per_head, full_width };
// Where a decoder layer's norms sit: before each sublayer (Llama), after each sublayer's output
// before the residual add (OLMo2), or both (Gemma2's sandwich: x + post(inner(pre(x)))); or the
// two sublayers side by side on the same input, x + attn(n1(x)) + mlp(n2(x)) (GPT-NeoX).
enum class residual_kind : std::int8_t { pre_norm, post_norm, sandwich, parallel };
// How HF stores the fused projections: q/k/v and gate/up as separate tensors (Llama), each as one
// tensor with the slots' rows concatenated (Phi-3's qkv_proj = [Q; K; V], gate_up_proj), or q/k/v
// as one tensor interleaved per head ([q_0; k_0; v_0; q_1; ...], NeoX's query_key_value).
enum class tensor_storage : std::int8_t { separate, concatenated, interleaved };
// The MLP's activation: SiLU (SwiGLU), GELU with the tanh approximation (GeGLU, StarCoder2), or
// the exact (erf) GELU (GPT-NeoX).
enum class activation : std::int8_t { silu, gelu_tanh, gelu };
// The HF tensor names a family's checkpoints use: Llama's (model.layers.N.self_attn.q_proj, ...)
// or GPT-NeoX's (gpt_neox.layers.N.attention.query_key_value, embed_out, ...).
enum class name_scheme : std::int8_t { llama, gpt_neox };
// The embedding's output scale: none, or sqrt(hidden) rounded to the activations' dtype (Gemma).
enum class embed_scale_kind : std::int8_t { none, sqrt_hidden };

constexpr std::string_view name_of(norm_kind k) {
  return k == norm_kind::rms ? "rms" : k == norm_kind::rms_1p ? "rms_1p" : k == norm_kind::rms_wmul ? "rms_wmul" : "layer_norm";
}
constexpr std::string_view name_of(mlp_kind k) {
  return k == mlp_kind::gated ? "gated" : k == mlp_kind::plain ? "plain" : "moe";
}
constexpr std::string_view name_of(moe_names n) { return n == moe_names::mixtral ? "mixtral" : "qwen"; }
constexpr std::string_view name_of(qk_norm_kind k) {
  return k == qk_norm_kind::none ? "none" : k == qk_norm_kind::per_head ? "per_head" : "full_width";
}
constexpr std::string_view name_of(tensor_storage t) {
  return t == tensor_storage::separate ? "separate" : t == tensor_storage::concatenated ? "concatenated" : "interleaved";
}
constexpr std::string_view name_of(residual_kind r) {
  return r == residual_kind::pre_norm ? "pre_norm" : r == residual_kind::post_norm ? "post_norm"
         : r == residual_kind::sandwich ? "sandwich" : "parallel";
}
constexpr std::string_view name_of(activation a) {
  return a == activation::silu ? "silu" : a == activation::gelu_tanh ? "gelu_tanh" : "gelu";
}
constexpr std::string_view name_of(name_scheme n) { return n == name_scheme::llama ? "llama" : "gpt_neox"; }
constexpr std::string_view name_of(embed_scale_kind e) {
  return e == embed_scale_kind::none ? "none" : "sqrt_hidden";
}

// Every value of an enum field of the shape, for parsing names back (metadata.json).
template <class E>
inline constexpr auto enum_values = std::array<E, 0>{};
template <>
inline constexpr auto enum_values<rope_type> = std::array{rope_type::none, rope_type::linear,
                                                          rope_type::dynamic_ntk, rope_type::llama3};
template <>
inline constexpr auto enum_values<norm_kind> =
    std::array{norm_kind::rms, norm_kind::rms_1p, norm_kind::rms_wmul, norm_kind::layer_norm};
template <>
inline constexpr auto enum_values<mlp_kind> = std::array{mlp_kind::gated, mlp_kind::plain, mlp_kind::moe};
template <>
inline constexpr auto enum_values<moe_names> = std::array{moe_names::mixtral, moe_names::qwen};
template <>
inline constexpr auto enum_values<qk_norm_kind> =
    std::array{qk_norm_kind::none, qk_norm_kind::per_head, qk_norm_kind::full_width};
template <>
inline constexpr auto enum_values<tensor_storage> =
    std::array{tensor_storage::separate, tensor_storage::concatenated, tensor_storage::interleaved};
template <>
inline constexpr auto enum_values<residual_kind> =
    std::array{residual_kind::pre_norm, residual_kind::post_norm, residual_kind::sandwich, residual_kind::parallel};
template <>
inline constexpr auto enum_values<activation> = std::array{activation::silu, activation::gelu_tanh, activation::gelu};
template <>
inline constexpr auto enum_values<name_scheme> = std::array{name_scheme::llama, name_scheme::gpt_neox};
template <>
inline constexpr auto enum_values<embed_scale_kind> =
    std::array{embed_scale_kind::none, embed_scale_kind::sqrt_hidden};

// HF `rope_scaling`; the llama3 variant uses all four parameters, linear and dynamic only `factor`.
struct rope_scaling {
  maybe<rope_type> type = rope_type::none;
  real factor = 1.0;
  real low_freq_factor = 1.0;
  real high_freq_factor = 4.0;
  dim original_max_positions = 8192;
};

struct shape {
  dim hidden = dynamic;
  dim layers = dynamic;
  dim heads = dynamic;
  dim kv_heads = dynamic;
  dim ffn = dynamic;  // intermediate_size
  dim vocab = dynamic;
  dim head_dim = 0;   // 0: hidden / heads
  dim max_positions = dynamic;
  real rms_eps = 1e-5;
  real rope_theta = 10000.0;
  rope_scaling rope = {};
  flag qkv_bias = false;        // Qwen2-style bias on q/k/v projections
  flag tie_embeddings = false;  // lm_head shares the embedding weight
  // Set by the family's composition of blocks (layers/blocks.hpp), not by hand:
  maybe<norm_kind> norm = norm_kind::rms;
  maybe<qk_norm_kind> qk_norm = qk_norm_kind::none;
  maybe<activation> mlp_activation = activation::silu;
  maybe<embed_scale_kind> embed_scale = embed_scale_kind::none;
  maybe<residual_kind> residual = residual_kind::pre_norm;
  maybe<tensor_storage> hf_storage = tensor_storage::separate;
  maybe<mlp_kind> mlp = mlp_kind::gated;
  flag out_bias = false;  // biases on o_proj and a plain MLP's projections (StarCoder2's use_bias, attention_bias)
  flag mlp_bias = false;  // biases on a gated MLP's gate, up and down projections (Llama's mlp_bias)
  // Attention and head numerics of Gemma2 (0 = off: the Llama behaviour).
  real query_pre_attn_scalar = 0.0;  // scores scaled by this^-0.5 instead of head_dim^-0.5
  real attn_softcap = 0.0;           // scores = cap * tanh(scores / cap) before the mask
  real final_softcap = 0.0;          // logits = cap * tanh(logits / cap) before log-softmax
  // The share of each head's dimensions RoPE rotates (the first head_dim * this, rounded down);
  // the rest pass through (GPT-NeoX's rotary_pct, HF's partial_rotary_factor).
  real rotary_fraction = 1.0;
  maybe<name_scheme> names = name_scheme::llama;  // set by the family's composition
  // A mixture of experts (mlp = moe; 0 and false for a dense MLP). Numbers from config.json:
  dim experts = 0;            // routed experts per layer (num_local_experts, num_experts)
  dim top_k = 0;              // experts per token (num_experts_per_tok)
  dim expert_ffn = 0;         // each expert's intermediate size (moe_intermediate_size; 0: ffn, Mixtral's)
  dim shared_expert_ffn = 0;  // the shared expert's (shared_expert_intermediate_size)
  flag norm_topk = false;     // the top-k weights renormalised to sum 1 (Mixtral always; norm_topk_prob)
  // Which layers have the mixture, as Qwen's configs say it: layer i does when (i + 1) % sparse_step
  // == 0 and bit i of dense_layers is clear (decoder_sparse_step, mlp_only_layers); the others have
  // a dense gated MLP of width ffn (intermediate_size).
  dim sparse_step = 1;
  dim dense_layers = 0;       // bit i: layer i (< 63) has the dense MLP
  // Set by the family's composition:
  maybe<moe_names> expert_naming = moe_names::qwen;
  flag shared_expert = false;  // a shared expert behind a sigmoid gate beside the routed ones (Qwen2-MoE)
};

// Every field dynamic: the form the command-line tool uses for any HF checkpoint.
inline constexpr shape dynamic_shape = {
    .hidden = dynamic, .layers = dynamic, .heads = dynamic, .kv_heads = dynamic,
    .ffn = dynamic, .vocab = dynamic, .head_dim = dynamic, .max_positions = dynamic,
    .rms_eps = dynamic, .rope_theta = dynamic,
    .rope = {.type = dynamic, .factor = dynamic, .low_freq_factor = dynamic,
             .high_freq_factor = dynamic, .original_max_positions = dynamic},
    .qkv_bias = dynamic, .tie_embeddings = dynamic, .norm = dynamic, .qk_norm = dynamic,
    .mlp_activation = dynamic, .embed_scale = dynamic, .residual = dynamic,
    .hf_storage = dynamic, .mlp = dynamic, .out_bias = dynamic, .mlp_bias = dynamic, .query_pre_attn_scalar = dynamic,
    .attn_softcap = dynamic, .final_softcap = dynamic, .rotary_fraction = dynamic, .names = dynamic,
    .experts = dynamic, .top_k = dynamic, .expert_ffn = dynamic, .shared_expert_ffn = dynamic,
    .norm_topk = dynamic, .sparse_step = dynamic, .dense_layers = dynamic, .expert_naming = dynamic,
    .shared_expert = dynamic};

// The dimensions of each head RoPE rotates: head_dim * rotary_fraction, rounded down as HF does.
constexpr std::int64_t rotary_dim(std::int64_t head_dim, double fraction) {
  return static_cast<std::int64_t>(static_cast<double>(head_dim) * fraction);
}

// head_dim as the model uses it; dynamic while it cannot be known yet.
constexpr dim effective_head_dim(const shape& s) {
  if (s.head_dim.is_dynamic()) return dynamic;
  if (s.head_dim.get() != 0) return s.head_dim;
  if (s.hidden.is_dynamic() || s.heads.is_dynamic() || s.heads.get() <= 0) return dynamic;
  return s.hidden.get() / s.heads.get();
}

// Whether layer `layer` has the mixture of experts (else its MLP is the dense gated one).
constexpr bool sparse_layer(const shape& s, std::int64_t layer) {
  if (s.mlp.get() != mlp_kind::moe) return false;
  const bool listed = layer < 63 && ((s.dense_layers.get() >> layer) & 1) != 0;
  return !listed && (layer + 1) % s.sparse_step.get() == 0;
}
// Whether every layer has it (the published Mixtral, Qwen-MoE and Qwen3-MoE checkpoints).
constexpr bool all_layers_sparse(const shape& s) {
  return s.mlp.get() == mlp_kind::moe && s.sparse_step.get() == 1 && s.dense_layers.get() == 0;
}

// Each expert's intermediate size: moe_intermediate_size, or intermediate_size (Mixtral's experts).
constexpr dim expert_ffn_of(const shape& s) {
  if (s.expert_ffn.is_dynamic()) return dynamic;
  return s.expert_ffn.get() != 0 ? s.expert_ffn : s.ffn;
}

}  // namespace megadsl
