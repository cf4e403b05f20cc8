// The block vocabulary a family is composed of (DESIGN decision 16), torch-free.
//
//   using qwen3_blocks = decoder<embedding<>,
//                                block<pre_norm<rms_norm<>, attention<attention_knobs{.qk_norm = qk_norm_kind::per_head}>>,
//                                      pre_norm<rms_norm<>, gated_mlp<activation::silu>>>,
//                                rms_norm<>>;
//   template <shape S> struct qwen3 : decoder_family<qwen3_blocks, S> { ... };
//
// A composition lowers onto the shape's block knobs (shape.hpp: norm, qk_norm, mlp_activation,
// embed_scale, residual, hf_storage, mlp, names). Numbers a checkpoint's config.json carries stay
// shape fields beside them (query_pre_attn_scalar, attn_softcap, final_softcap, rotary_fraction),
// and the sliding window with its layers is a run-time option (sliding_window.hpp). The knobs select the blocks' parameter rows (param_table.hpp: each block's
// parameters, shard kinds and HF names bound at its slot), the shard plan, the formulas, the HF
// mapping and config keys, and the modules each layer is built from (layers/layer_plan.hpp, each
// block's module in its own file under src/layers/): a new family is a type alias and compiles no
// new LibTorch code.
//
// Numerics of each block (the transformers modules they match):
//   rms_norm<rms>      LlamaRMSNorm: x.float() * rsqrt(mean(x^2) + eps), cast to x's dtype, * w
//   rms_norm<rms_1p>   GemmaRMSNorm: the same in fp32 * (1 + w.float()), then cast
//   rms_norm<rms_wmul> Olmo2RMSNorm: (w * x.float() * rsqrt(...)).to(dtype)
//   post_norm<N, X>    OLMo2: x + N(X(x)); pre_norm<N, X>: x + X(N(x))
//   sandwich<N, X>     Gemma2: x + N'(X(N(x))), each norm with its own weight
//   parallel<N, X>     GPT-NeoX: both sublayers on the block's input, x + attn(N1(x)) + mlp(N2(x))
//   attention_knobs{.storage = interleaved}  NeoX's query_key_value: [q_h; k_h; v_h] per head
//   attention<attention_knobs{.qk_norm = full_width}>  OLMo2: q and k RMSNorm over the whole projection, before RoPE
//   attention<attention_knobs{.qk_norm = per_head}>  Qwen3: q and k RMSNorm over head_dim, before RoPE
//   gated_mlp<silu | gelu_tanh>       down(act(gate(x)) * up(x)): SwiGLU (Llama), GeGLU (Gemma)
//   embedding<sqrt_hidden>            Gemma: embed(ids) * sqrt(hidden) rounded to the dtype
//   layer_norm                        nn.LayerNorm with its bias (StarCoder2)
//   plain_mlp<gelu_tanh | gelu>       c_proj(act(c_fc(x))), both with biases per out_bias (StarCoder2; NeoX exact gelu)
//   decoder<E, B, N, name_scheme::gpt_neox>  the HF names of GPT-NeoX checkpoints (gpt_neox.*, embed_out)
//   attention_knobs{.storage = concatenated}, gated_mlp<.., concatenated>: Phi-3's fused HF tensors
//   moe_mlp<silu, moe_knobs{...}>     HF's sparse MoE block: router softmax in fp32 over every expert,
//                                     top-k (renormalised per the shape's norm_topk), each expert a
//                                     gated MLP, weights in fp32 until they scale the experts' outputs;
//                                     .shared_expert: + sigmoid(gate(x)) * shared(x) (Qwen2-MoE)
#pragma once

#include <string_view>

#include "megadsl/shape.hpp"
#include "megadsl/text.hpp"

namespace megadsl::blocks {

template <norm_kind K = norm_kind::rms>
struct rms_norm {
  static_assert(K != norm_kind::layer_norm, "megadsl: LayerNorm is blocks::layer_norm, not rms_norm<norm_kind::layer_norm>");
  static constexpr norm_kind kind = K;
};

// LayerNorm with a weight and a bias (StarCoder2, GPT-NeoX).
struct layer_norm {
  static constexpr norm_kind kind = norm_kind::layer_norm;
};

struct attention_knobs {
  qk_norm_kind qk_norm = qk_norm_kind::none;
  tensor_storage storage = tensor_storage::separate;  // HF's q/k/v: q_proj, k_proj, v_proj or qkv_proj
};
// Grouped-query self-attention with RoPE: q/k/v/o projections (q/k/v bias per the shape).
template <attention_knobs K = attention_knobs{}>
struct attention {
  static constexpr attention_knobs knobs = K;
};

// down(act(gate(x)) * up(x)), gate and up column-parallel (fused per rank), down row-parallel.
// HF stores gate and up separately (gate_proj, up_proj) or concatenated (gate_up_proj).
template <activation A = activation::silu, tensor_storage S = tensor_storage::separate>
struct gated_mlp {
  static constexpr activation act = A;
  static constexpr tensor_storage storage = S;
};

// proj(act(fc(x) + b_fc)) + b_proj: fc column-parallel with its bias split, proj row-parallel with
// its bias added after the reduction (StarCoder2's c_fc / c_proj; biases per the shape's out_bias).
template <activation A = activation::gelu_tanh>
struct plain_mlp {
  static constexpr activation act = A;
};

struct moe_knobs {
  moe_names names = moe_names::qwen;  // Mixtral's or Qwen's HF tensor names
  bool shared_expert = false;         // Qwen2-MoE's shared expert and its sigmoid gate
};
// A mixture of gated experts behind a top-k router: the shape gives experts, top_k, expert_ffn,
// norm_topk (and shared_expert_ffn). Experts split over ep (whole experts) and each expert over
// etp = tp like a gated MLP; tokens travel to their experts by all-to-all (layers/moe.hpp).
template <activation A = activation::silu, moe_knobs K = moe_knobs{}>
struct moe_mlp {
  static constexpr activation act = A;
  static constexpr moe_knobs knobs = K;
};

// Vocab-parallel token embedding.
template <embed_scale_kind E = embed_scale_kind::none>
struct embedding {
  static constexpr embed_scale_kind scale = E;
};

// x + inner(norm(x)) (Llama).
template <class Norm, class Inner>
struct pre_norm {};

// x + norm(inner(x)): the norm on the sublayer's output, before the residual add (OLMo2).
template <class Norm, class Inner>
struct post_norm {};

// x + norm(inner(norm(x))), two norms of their own (Gemma2: input_layernorm and
// post_attention_layernorm around attention, pre_/post_feedforward_layernorm around the MLP).
template <class Norm, class Inner>
struct sandwich {};

// Both sublayers read the block's input, their outputs added to it together:
// x + attn(n1(x)) + mlp(n2(x)) (GPT-NeoX's use_parallel_residual). Wrap both sublayers in it.
template <class Norm, class Inner>
struct parallel {};

// One decoder layer: the attention sublayer, then the MLP sublayer.
template <class AttentionSublayer, class MlpSublayer>
struct block {};

// Embedding, `layers` copies of the block (looped at run time, one type), the final norm; the
// head (LM or value) comes from the model type (causal_lm / value_model). `Names`: the HF tensor
// names its checkpoints use.
template <class Embedding, class Block, class FinalNorm, name_scheme Names = name_scheme::llama>
struct decoder {};

// ---- lowering: a composition onto the shape's knobs --------------------------------------------

template <class Composition>
struct lowering {
  static_assert(sizeof(Composition) == 0,
                "megadsl: not a composition of the block vocabulary; write decoder<embedding<...>, "
                "block<pre_norm<rms_norm<...>, attention<...>>, pre_norm<rms_norm<...>, "
                "gated_mlp<...>>>, rms_norm<...>> (or post_norm; layers/blocks.hpp)");
};

// The composition rules, one named type each, carrying the values they compare: GCC and clang
// both print `megadsl::blocks::residuals_agree<megadsl::residual_kind::pre_norm,
// megadsl::residual_kind::post_norm>` in the first lines of the diagnostic, then the rule's text.
template <norm_kind Attention, norm_kind Mlp, norm_kind Final>
struct norms_agree {
  static constexpr bool holds = Attention == Mlp && Mlp == Final;
  static_assert(holds, "megadsl: norms_agree: the attention, MLP and final norms (the values above) differ; the layer "
                "plan takes one norm kind per model: use the same rms_norm<...> or layer_norm in every slot");
  static constexpr bool ok = true;
};
template <residual_kind Attention, residual_kind Mlp>
struct residuals_agree {
  static constexpr bool holds = Attention == Mlp;
  static_assert(holds, "megadsl: residuals_agree: the attention and MLP sublayers (the values above) have different forms; "
                "wrap both in the same one (pre_norm, post_norm, sandwich or parallel)");
  static constexpr bool ok = true;
};
template <norm_kind Norm, residual_kind Residual>
struct layer_norm_is_pre_norm {
  static constexpr bool holds = Norm != norm_kind::layer_norm || Residual == residual_kind::pre_norm || Residual == residual_kind::parallel;
  static_assert(holds, "megadsl: layer_norm_is_pre_norm: LayerNorm's biases are bound at the pre-norm slots only; use "
                "rms_norm<...>, or pre_norm / parallel sublayers");
  static constexpr bool ok = true;
};
template <tensor_storage Storage, name_scheme Names>
struct interleaved_qkv_is_neox {
  static constexpr bool holds = (Storage == tensor_storage::interleaved) == (Names == name_scheme::gpt_neox);
  static_assert(holds, "megadsl: interleaved_qkv_is_neox: q/k/v interleaved per head is stored by GPT-NeoX checkpoints only "
                "(and they store nothing else); give attention that storage exactly when the decoder has "
                "name_scheme::gpt_neox");
  static constexpr bool ok = true;
};
template <tensor_storage Attention, tensor_storage Mlp, mlp_kind Kind>
struct storage_agrees {
  static constexpr bool holds = Kind == mlp_kind::plain || Attention == Mlp;
  static_assert(holds, "megadsl: storage_agrees: q/k/v and gate/up are stored differently (the values above); HF "
                "checkpoints fuse both or neither: give attention and gated_mlp the same storage (a gated MLP "
                "has no interleaved form)");
  static constexpr bool ok = true;
};

// A sublayer's residual form, norm kind and inner block.
template <class Sublayer>
struct sublayer_traits {
  static_assert(sizeof(Sublayer) == 0, "megadsl: a block's sublayers are pre_norm<Norm, Inner>, post_norm<Norm, Inner>, sandwich<Norm, Inner> or parallel<Norm, Inner>");
};
template <class Norm, class Inner>
struct sublayer_traits<pre_norm<Norm, Inner>> {
  static constexpr residual_kind residual = residual_kind::pre_norm;
  static constexpr norm_kind norm = Norm::kind;
  using inner = Inner;
};
template <class Norm, class Inner>
struct sublayer_traits<post_norm<Norm, Inner>> {
  static constexpr residual_kind residual = residual_kind::post_norm;
  static constexpr norm_kind norm = Norm::kind;
  using inner = Inner;
};
template <class Norm, class Inner>
struct sublayer_traits<sandwich<Norm, Inner>> {
  static constexpr residual_kind residual = residual_kind::sandwich;
  static constexpr norm_kind norm = Norm::kind;
  using inner = Inner;
};
template <class Norm, class Inner>
struct sublayer_traits<parallel<Norm, Inner>> {
  static constexpr residual_kind residual = residual_kind::parallel;
  static constexpr norm_kind norm = Norm::kind;
  using inner = Inner;
};

template <class T>
struct attention_traits {
  static_assert(sizeof(T) == 0, "megadsl: a block's first sublayer wraps attention<...>");
};
template <attention_knobs K>
struct attention_traits<attention<K>> {
  static constexpr attention_knobs knobs = K;
};
template <class T>
struct mlp_traits {
  static_assert(sizeof(T) == 0, "megadsl: a block's second sublayer wraps gated_mlp<...>, plain_mlp<...> or moe_mlp<...>");
};
template <activation A, tensor_storage S>
struct mlp_traits<gated_mlp<A, S>> {
  static constexpr activation act = A;
  static constexpr tensor_storage storage = S;
  static constexpr mlp_kind kind = mlp_kind::gated;
  static constexpr moe_knobs moe{};
};
template <activation A>
struct mlp_traits<plain_mlp<A>> {
  static constexpr activation act = A;
  static constexpr tensor_storage storage = tensor_storage::separate;
  static constexpr mlp_kind kind = mlp_kind::plain;
  static constexpr moe_knobs moe{};
};
template <activation A, moe_knobs K>
struct mlp_traits<moe_mlp<A, K>> {
  static constexpr activation act = A;
  static constexpr tensor_storage storage = tensor_storage::separate;
  static constexpr mlp_kind kind = mlp_kind::moe;
  static constexpr moe_knobs moe = K;
};

template <embed_scale_kind E, class AttentionSublayer, class MlpSublayer, class FinalNorm, name_scheme Names>
struct lowering<decoder<embedding<E>, block<AttentionSublayer, MlpSublayer>, FinalNorm, Names>> {
  static constexpr norm_kind NFinal = FinalNorm::kind;
  using attn = sublayer_traits<AttentionSublayer>;
  using mlp = sublayer_traits<MlpSublayer>;
  static constexpr attention_knobs knobs = attention_traits<typename attn::inner>::knobs;
  static constexpr activation act = mlp_traits<typename mlp::inner>::act;

  static_assert(norms_agree<attn::norm, mlp::norm, NFinal>::ok &&
                residuals_agree<attn::residual, mlp::residual>::ok &&
                layer_norm_is_pre_norm<NFinal, attn::residual>::ok &&
                interleaved_qkv_is_neox<knobs.storage, Names>::ok &&
                storage_agrees<knobs.storage, mlp_traits<typename mlp::inner>::storage, mlp_traits<typename mlp::inner>::kind>::ok);

  static constexpr shape apply(shape s) {
    s.norm = NFinal;
    s.qk_norm = knobs.qk_norm;
    s.mlp_activation = act;
    s.embed_scale = E;
    s.residual = attn::residual;
    s.hf_storage = knobs.storage;
    s.mlp = mlp_traits<typename mlp::inner>::kind;
    s.names = Names;
    s.expert_naming = mlp_traits<typename mlp::inner>::moe.names;
    s.shared_expert = mlp_traits<typename mlp::inner>::moe.shared_expert;
    return s;
  }
};

// The shape's block knobs, the fields a composition sets (`lowering::apply` above), in one list:
// `holds(name, s.knob...)` for each knob of the shapes given, true when it holds for all. Every
// comparison, copy or listing of knobs goes through here.
template <class F, class... Shapes>
constexpr bool every_knob(F&& holds, Shapes&&... s) {
  return holds("norm", s.norm...) && holds("qk_norm", s.qk_norm...) &&
         holds("mlp_activation", s.mlp_activation...) && holds("embed_scale", s.embed_scale...) &&
         holds("residual", s.residual...) && holds("hf_storage", s.hf_storage...) && holds("mlp", s.mlp...) &&
         holds("names", s.names...) && holds("expert_naming", s.expert_naming...) &&
         holds("shared_expert", s.shared_expert...);
}

// Equal knobs (both static): the same composition.
constexpr bool same_knobs(const shape& a, const shape& b) {
  return every_knob([](std::string_view, const auto& x, const auto& y) { return x.get() == y.get(); }, a, b);
}

// `to` with `from`'s knobs (a family's composition applied to a shape read from config.json).
constexpr void copy_knobs(shape& to, const shape& from) {
  every_knob([](std::string_view, auto& t, const auto& f) { t = f; return true; }, to, from);
}

// True when each of `s`'s knobs is left alone (its default or dynamic) or is the composition's:
// the family sets them.
template <class Composition>
constexpr bool knobs_compatible(const shape& s) {
  const shape composed = lowering<Composition>::apply(s), untouched{};
  return every_knob([](std::string_view, const auto& declared, const auto& c, const auto& fallback) {
    return declared.is_dynamic() || declared.get() == c.get() || declared.get() == fallback.get();
  }, s, composed, untouched);
}

// The composition a shape's knobs stand for, as an indented tree (`megadsl describe`). Dynamic
// knobs print as `?`.
constexpr basic_text<1024> composition_tree(const shape& s) {
  auto knob = [](const auto& v) -> std::string_view { return v.is_static() ? name_of(v.get()) : "?"; };
  auto is = [](const auto& v, auto value) { return v.is_static() && v.get() == value; };
  const bool post = is(s.residual, residual_kind::post_norm);
  const bool sandwiched = is(s.residual, residual_kind::sandwich);
  const bool neox = is(s.names, name_scheme::gpt_neox);
  basic_text<1024> t;
  t.add("decoder\n", "  embedding", is(s.embed_scale, embed_scale_kind::sqrt_hidden) ? "  (* sqrt(hidden))" : "", "\n");
  t.add("  block x ", s.layers.is_static() ? s.layers.get() : std::int64_t{-1}, "\n");
  basic_text<64> norm;
  if (is(s.norm, norm_kind::layer_norm)) norm.add("layer_norm (+ bias)");
  else norm.add("rms_norm<", knob(s.norm), ">");
  t.add("    ", knob(s.residual), "  ", norm.view(), "  [",
        post ? "post_attention_layernorm" : sandwiched ? "input_layernorm, post_attention_layernorm" : "input_layernorm", "]\n");
  t.add("      attention  q/k/v", is(s.qkv_bias, true) ? " + bias" : "", is(s.out_bias, true) ? ", o + bias" : "", ", rope");
  if (is(s.qk_norm, qk_norm_kind::per_head)) t.add(", q/k rms_norm per head");
  if (is(s.qk_norm, qk_norm_kind::full_width)) t.add(", q/k rms_norm over the full width");
  if (s.query_pre_attn_scalar.is_static() && s.query_pre_attn_scalar.get() != 0) t.add(", scale query_pre_attn_scalar^-1/2");
  if (s.attn_softcap.is_static() && s.attn_softcap.get() != 0) t.add(", tanh soft-cap");
  if (s.rotary_fraction.is_static() && s.rotary_fraction.get() != 1.0) t.add(" on part of each head");
  t.add(is(s.hf_storage, tensor_storage::concatenated)  ? "  [self_attn: qkv_proj]\n"
        : is(s.hf_storage, tensor_storage::interleaved) ? "  [attention: query_key_value, per head]\n"
                                                        : "  [self_attn]\n");
  t.add("    ", knob(s.residual), "  ", norm.view(), "  [",
        post ? "post_feedforward_layernorm" : sandwiched ? "pre_feedforward_layernorm, post_feedforward_layernorm" : "post_attention_layernorm", "]\n");
  if (is(s.mlp, mlp_kind::plain))
    t.add("      plain_mlp<", knob(s.mlp_activation), ">", is(s.out_bias, true) ? " + biases" : "",
          neox ? "  [mlp: dense_h_to_4h, dense_4h_to_h]\n" : "  [mlp: c_fc, c_proj]\n");
  else if (is(s.mlp, mlp_kind::moe)) {
    const bool mixtral = is(s.expert_naming, moe_names::mixtral);
    t.add("      moe_mlp<", knob(s.mlp_activation), ">  router softmax -> top ", s.top_k.is_static() ? s.top_k.get() : std::int64_t{-1},
          " of ", s.experts.is_static() ? s.experts.get() : std::int64_t{-1}, is(s.norm_topk, true) ? ", renormalised" : "",
          mixtral ? "  [block_sparse_moe: gate, experts.E.w1/w3/w2]\n" : "  [mlp: gate, experts.E.gate/up/down_proj]\n");
    if (is(s.shared_expert, true)) t.add("        + sigmoid(gate(x)) * shared gated_mlp  [mlp: shared_expert, shared_expert_gate]\n");
    if (s.sparse_step.is_static() && s.dense_layers.is_static() && s.layers.is_static() && !all_layers_sparse(s)) {
      t.add("      gated_mlp<", knob(s.mlp_activation), "> instead on layers");
      int shown = 0;
      for (std::int64_t i = 0; i < s.layers.get() && shown < 12; ++i)
        if (!sparse_layer(s, i)) t.add(shown++ == 0 ? " " : ", ", i);
      t.add("  [mlp: gate_proj, up_proj, down_proj]\n");
    }
  }
  else
    t.add("      gated_mlp<", knob(s.mlp_activation), ">", is(s.mlp_bias, true) ? " + biases" : "", "  [mlp",
          is(s.hf_storage, tensor_storage::concatenated) ? ": gate_up_proj" : "", "]\n");
  t.add("  ", norm.view(), "  [norm]\n");
  if (s.final_softcap.is_static() && s.final_softcap.get() != 0) t.add("  lm head: tanh soft-cap of the logits\n");
  return t;
}

}  // namespace megadsl::blocks

namespace megadsl {

// A family: a composition of blocks applied to a shape. Derive a struct from it (the struct's name
// is what diagnostics print) and give it `family` and `name`.
template <class Composition, shape S>
struct decoder_family {
  static_assert(blocks::knobs_compatible<Composition>(S),
                "megadsl: the shape sets a block knob (norm, qk_norm, mlp_activation, embed_scale) "
                "that differs from its family's composition; leave the knobs out of the shape");
  using composition = Composition;
  static constexpr megadsl::shape shape = blocks::lowering<Composition>::apply(S);
};

// The families' compositions live with their presets, one header each (models/<family>.hpp).

}  // namespace megadsl
