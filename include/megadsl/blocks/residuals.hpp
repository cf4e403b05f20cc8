// Residual combinators: pre_norm, post_norm, sandwich, parallel, parallel_shared_norm, and block.
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// ---- residual combinators -------------------------------------------------------------------------

// megadsl's and HF's names of a layer's norms: before (or after) the sublayer at `at`.
constexpr std::string_view norm_name(sublayer at, bool post) {
  if (at == sublayer::none) throw "megadsl: a residual combinator is one of block<...>'s two sublayers";
  return at == sublayer::attention ? (post ? "attn_post_norm" : "attn_norm") : (post ? "mlp_post_norm" : "mlp_norm");
}

// HF's names of a layer's norms: before and after attention, before and after the MLP.
struct norm_names {
  std::string_view attention_pre, attention_post, mlp_pre, mlp_post;
};
// transformers' usual ones (Llama's, OLMo2's; each form takes those it has): the norm before a
// pre-norm layer's MLP is post_attention_layernorm.
inline constexpr norm_names hf_norm_names{"input_layernorm", "post_attention_layernorm", "post_attention_layernorm",
                                          "post_feedforward_layernorm"};
// A sandwich's (Gemma 2's and its successors'): a norm of its own before the MLP.
inline constexpr norm_names sandwich_norm_names{"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                                "post_feedforward_layernorm"};

// A residual's knobs: the config key whose value multiplies the sublayer's output before it joins
// the stream (Granite's residual_multiplier); null: none.
struct residual_knobs {
  static constexpr std::string_view knobs_name = "residual_knobs";
  const config_setting* scale = nullptr;
};

template <residual_kind R, class Norm, class Inner, const norm_names& Names = hf_norm_names,
          const config_setting* Scale = nullptr>
struct residual {
  static constexpr residual_kind kind = R;
  using inner = Inner;
  static constexpr residual_knobs knobs{Scale};

  // HF's names of the norm(s) in its slot.
  static constexpr std::string_view hf_pre(sublayer at) {
    return at == sublayer::attention ? Names.attention_pre : Names.mlp_pre;
  }
  static constexpr std::string_view hf_post(sublayer at) {
    return at == sublayer::attention ? Names.attention_post : Names.mlp_post;
  }

  static constexpr int lower(arch_builder& b, const slot& at) {
    const bool post = R == residual_kind::post_norm;
    const std::string_view hf_norm = post ? hf_post(at.at) : hf_pre(at.at);
    const int n = lower_block<Norm>(b, at.sub(norm_name(at.at, post), hf_norm));
    basic_text<160> label(R == residual_kind::pre_norm ? "pre_norm  " : R == residual_kind::post_norm ? "post_norm  "
                          : R == residual_kind::sandwich ? "sandwich  " : "parallel  ");
    label.add(b.label(n), "  [", hf_norm);
    b.hide(n);
    const int inner_node = lower_block<Inner>(b, at);
    basic_text<64> name(R == residual_kind::pre_norm ? "pre_norm" : R == residual_kind::post_norm ? "post_norm"
                        : R == residual_kind::sandwich ? "sandwich" : "parallel");
    if constexpr (Scale != nullptr) {
      b.setting(*Scale);
      name.add("<x ", Scale->key, ">");
    }
    if constexpr (R == residual_kind::sandwich) {
      const int n2 = lower_block<Norm>(b, at.sub(norm_name(at.at, true), hf_post(at.at)));
      b.hide(n2);
      label.add(", ", hf_post(at.at), "]");
      return b.node(at, &modules::sandwich, {n, inner_node, n2}, name.view(), label.view(), nullptr, knobs_of(knobs));
    } else {
      label.append(Scale != nullptr ? "], output x " : "]");
      if constexpr (Scale != nullptr) label.append(Scale->key);
      return b.node(at, R == residual_kind::pre_norm ? &modules::pre_norm : R == residual_kind::post_norm ? &modules::post_norm
                                                                                                           : &modules::branch,
                    {n, inner_node}, name.view(), label.view(), nullptr, knobs_of(knobs));
    }
  }
};

// x + inner(norm(x)) (Llama; a family's own norm names: models/apertus.hpp); with `Scale`, x + inner(norm(x)) *
// that config key's value (Granite's residual_multiplier).
template <class Norm, class Inner, const norm_names& Names = hf_norm_names, const config_setting* Scale = nullptr>
struct pre_norm : residual<residual_kind::pre_norm, Norm, Inner, Names, Scale> {};
// x + norm(inner(x)): the norm on the sublayer's output, before the residual add (OLMo2).
template <class Norm, class Inner>
struct post_norm : residual<residual_kind::post_norm, Norm, Inner> {};
// x + norm(inner(norm(x))), two norms of their own (Gemma2: input_layernorm and
// post_attention_layernorm around attention, pre_/post_feedforward_layernorm around the MLP; GLM-4
// names them otherwise: models/glm4.hpp).
template <class Norm, class Inner, const norm_names& Names = sandwich_norm_names>
struct sandwich : residual<residual_kind::sandwich, Norm, Inner, Names> {};
// Both sublayers read the block's input, their outputs added to it together:
// x + attn(n1(x)) + mlp(n2(x)) (GPT-NeoX's use_parallel_residual). Wrap both sublayers in it.
template <class Norm, class Inner>
struct parallel : residual<residual_kind::parallel, Norm, Inner> {};

// The composition rules, one named type each, carrying the values they compare: GCC and clang
// both print `megadsl::blocks::residuals_agree<megadsl::residual_kind::pre_norm,
// megadsl::residual_kind::post_norm>` in the first lines of the diagnostic, then the rule's text.
template <residual_kind Attention, residual_kind Mlp>
struct residuals_agree {
  static constexpr bool holds = Attention == Mlp;
  static_assert(holds, "megadsl: residuals_agree: the attention and MLP sublayers (the values above) have different forms; "
                "wrap both in the same one (pre_norm, post_norm, sandwich or parallel)");
  static constexpr bool ok = true;
};

template <class T>
constexpr bool is_parallel() {
  if constexpr (requires { T::kind; }) return T::kind == residual_kind::parallel;
  else return false;
}

// One decoder layer: the attention sublayer, then the MLP sublayer (or both side by side, in
// parallel<...>: x + attn(n1(x)) + mlp(n2(x))).
template <class AttentionSublayer, class MlpSublayer>
struct block {
  static constexpr int lower(arch_builder& b, const slot& layer) {
    if constexpr (requires { AttentionSublayer::kind; MlpSublayer::kind; }) {
      static_assert(residuals_agree<AttentionSublayer::kind, MlpSublayer::kind>::ok);
    }
    slot attn = layer, mlp = layer;
    attn.at = sublayer::attention;
    mlp.at = sublayer::mlp;
    const int a = lower_block<AttentionSublayer>(b, attn);
    const int m = lower_block<MlpSublayer>(b, mlp);
    return b.node(layer, is_parallel<AttentionSublayer>() ? &modules::parallel_sum : &modules::sequence, {a, m}, "block");
  }
};

// One decoder layer whose attention and MLP both read one norm of its input, their outputs added
// to it: x + attn(n(x)) + mlp(n(x)) (Cohere's input_layernorm; its only norm in the layer).
template <class Norm, class Attention, class Mlp>
struct parallel_shared_norm {
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const int n = lower_block<Norm>(b, layer.sub("attn_norm", "input_layernorm"));
    basic_text<160> label("parallel_shared_norm  ");
    label.add(b.label(n), "  [input_layernorm, for both]");
    b.hide(n);
    slot attn = layer, mlp = layer;
    attn.at = sublayer::attention;
    mlp.at = sublayer::mlp;
    const int a = lower_block<Attention>(b, attn);
    const int m = lower_block<Mlp>(b, mlp);
    return b.node(layer, &modules::parallel_shared_norm, {n, a, m}, "parallel_shared_norm", label.view());
  }
};

}  // namespace megadsl::blocks
