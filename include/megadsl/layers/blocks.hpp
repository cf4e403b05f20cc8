// The block vocabulary a family is composed of (DESIGN decision 16), torch-free.
//
//   using qwen3_blocks = decoder<embedding<>,
//                                block<pre_norm<rms_norm<>, attention<attention_knobs{}, per_head_qk_norm<rms_norm<>>>>,
//                                      pre_norm<rms_norm<>, gated_mlp<activation::silu>>>,
//                                rms_norm<>>;
//   template <shape S> struct qwen3 : decoder_family<qwen3_blocks, S> { ... };
//
// A block is a type with `static constexpr int lower(arch_builder&, const slot&)`: it declares its
// parameters (names relative to the slot it is given, HF names relative to its HF module, shard
// kind, extent, init, the config switch that adds them), the layout rules it adds, its FLOPs beyond
// its matrices' (an attention's scores: `score_units`), and its run-time module (a factory compiled
// once in its own source file, layers/block_factories.hpp), and lowers the blocks it wraps. A composition lowers to one `architecture` (architecture.hpp), which the
// shard plan, the formulas, the loaders and savers and the stage read; nothing else in megadsl
// knows a block kind, so a new block is its own files (examples/04_custom_block).
//
// A decoder's layers are one block, or several kinds of layer (`pattern`, `first_k`, `select`):
// the architecture says which layer has which (its `pick`), so the layers of a model may differ.
//
// Numerics of each block (the transformers modules they match):
//   rms_norm<rms>      LlamaRMSNorm: x.float() * rsqrt(mean(x^2) + eps), cast to x's dtype, * w
//   rms_norm<rms_1p>   GemmaRMSNorm: the same in fp32 * (1 + w.float()), then cast
//   rms_norm<rms_wmul> Olmo2RMSNorm: (w * x.float() * rsqrt(...)).to(dtype)
//   layer_norm         nn.LayerNorm with its bias (StarCoder2, GPT-NeoX)
//   layer_norm_no_bias CohereLayerNorm: (x - mean) * rsqrt(var + eps) * w, all in fp32, then cast
//   post_norm<N, X>    OLMo2: x + N(X(x)); pre_norm<N, X>: x + X(N(x))
//   sandwich<N, X>     Gemma2: x + N'(X(N(x))), each norm with its own weight
//   parallel<N, X>     GPT-NeoX: both sublayers on the block's input, x + attn(N1(x)) + mlp(N2(x))
//   parallel_shared_norm<N, A, M>  Cohere: one norm for both, x + attn(N(x)) + mlp(N(x)) (the whole layer)
//   attention<attention_knobs{.storage = interleaved}>  NeoX's query_key_value: [q_h; k_h; v_h] per head
//   attention<attention_knobs{.rope = false}>  a NoPE layer: q and k are not rotated (SmolLM3)
//   attention<{}, full_width_qk_norm<N>>  OLMo2: q and k normed over the whole projection, before RoPE
//   attention<{}, per_head_qk_norm<N>>    Qwen3: q and k normed over head_dim, before RoPE
//   attention<{}, headwise_qk_norm<N>>    Command R+: the same with a weight for every head
//   gated_mlp<silu | gelu_tanh>       down(act(gate(x)) * up(x)): SwiGLU (Llama), GeGLU (Gemma)
//   embedding<sqrt_hidden>            Gemma: embed(ids) * sqrt(hidden) rounded to the dtype
//   plain_mlp<gelu_tanh | gelu>       c_proj(act(c_fc(x))), both with biases per out_bias (StarCoder2; NeoX exact gelu)
//   decoder<E, B, N, name_scheme::gpt_neox>  the HF names of GPT-NeoX checkpoints (gpt_neox.*, embed_out)
//   attention_knobs{.storage = concatenated}, gated_mlp<.., concatenated>: Phi-3's fused HF tensors
//   moe_mlp<silu, moe_knobs{...}>     HF's sparse MoE block: router softmax in fp32 over every expert,
//                                     top-k (renormalised per the shape's norm_topk), each expert a
//                                     gated MLP, weights in fp32 until they scale the experts' outputs;
//                                     .shared_expert: + sigmoid(gate(x)) * shared(x) (Qwen2-MoE)
//   attention<attention_knobs{.sinks = true}>  gpt-oss: one learned logit per query head in each row's
//                                     softmax, without a value (eager_attention_forward's sink column)
//   moe_mlp<silu, moe_knobs{.names = moe_names::gpt_oss}>  GptOssMLP: the router with a bias, top-k of
//                                     its logits weighed by a softmax over the k; experts with biases
//                                     and the clamped SwiGLU; HF's tensors stacked per layer (hf_stacking)
//   attention<attention_knobs{.chunked = true}, l2_qk_norm>  Llama 4's RoPE layers: attention within
//                                     chunks of the shape's attention_chunk tokens, q/k rms-normed
//                                     per head without a weight; {.rope = false, .temperature = true}:
//                                     its NoPE layers, q scaled by ln(position) (attn_floor_scale)
//   gated_mlp<silu, separate, feed_forward_module>  the same MLP under HF's feed_forward (Llama 4)
//   moe_mlp<silu, moe_knobs{.names = moe_names::llama4, .router = moe_router::sigmoid_on_input}>
//                                     Llama4TextMoe: top-k of the router's logits, each chosen
//                                     expert fed x * sigmoid(logit), + the ungated shared expert on x;
//                                     experts stacked per layer ([gate | up] columns)
//   gated_delta_net<grouped | split>  Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet: linear attention by
//                                     the gated delta rule (chunked, exact backward), causal conv, gated
//                                     output norm; HF's in_proj_qkvz + in_proj_ba, or in_proj_qkv/z/b/a
//   gated_attention<per_head_qk_norm<rms_norm<rms_1p>>>  Qwen3NextAttention: q_proj = [q | gate] per
//                                     head, the output times sigmoid(gate)
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "megadsl/architecture.hpp"
#include "megadsl/layers/block_factories.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/text.hpp"

namespace megadsl {

// The settings the library's blocks take as template arguments.
// How a norm applies its weight: RMSNorm as Llama's `w * x.to(dtype)`, Gemma's `(1 + w) * x` in
// fp32, or OLMo2's `(w * x).to(dtype)` in fp32 (LayerNorm is its own block, blocks::layer_norm).
enum class norm_kind : std::int8_t { rms, rms_1p, rms_wmul };
// How HF stores the fused projections: q/k/v and gate/up as separate tensors (Llama), each as one
// tensor with the slots' rows concatenated (Phi-3's qkv_proj = [Q; K; V], gate_up_proj), or q/k/v
// as one tensor interleaved per head ([q_0; k_0; v_0; q_1; ...], NeoX's query_key_value).
enum class tensor_storage : std::int8_t { separate, concatenated, interleaved };
// The HF names of a mixture of experts: Mixtral's (block_sparse_moe.gate, experts.E.{w1,w3,w2}) or
// Qwen's (mlp.gate, mlp.experts.E.{gate,up,down}_proj, mlp.shared_expert*).
// HunYuan's are Qwen's with the router at mlp.gate.wg and its ungated shared MLP at mlp.shared_mlp.
// gpt-oss's: mlp.router (with a bias) and mlp.experts.{gate_up_proj, down_proj}(_bias), every expert
// of a layer in one tensor (hf_stacking), with biases and the clamped SwiGLU. Llama 4's:
// feed_forward.router, feed_forward.experts.{gate_up_proj, down_proj} stacked (gate_up's columns
// [gate | up]) and the ungated feed_forward.shared_expert. ERNIE 4.5's: Qwen's, the expert bias
// stored as one row (1, E) at mlp.moe_statics.e_score_correction_bias.
enum class moe_names : std::int8_t { mixtral, qwen, hunyuan, gpt_oss, llama4, ernie };
// How a mixture's router picks and weighs the experts: HF's softmax over every expert then top-k
// (Mixtral, Qwen), or DeepSeek-V3's sigmoid scores with an expert bias that only selects, the
// experts chosen within the best groups, the weights scaled (DeepSeek-V3, GLM-4.5, Kimi K2), or
// Llama 4's: the top-k of the raw logits, each chosen expert fed the token times sigmoid(logit)
// (the weight scales the expert's input, not its output); or ERNIE 4.5's: softmax scores in fp32,
// the experts chosen by scores + an expert bias (selecting only, balanced by load like DeepSeek's),
// their unbiased scores renormalised (divided by max(sum, topk_sum_floor)).
enum class moe_router : std::int8_t { softmax, sigmoid_grouped, sigmoid_on_input, softmax_biased };
// The HF tensor names of a family's checkpoints outside its blocks: Llama's (model.embed_tokens,
// model.layers.N., model.norm, lm_head, score) or GPT-NeoX's (gpt_neox.embed_in, embed_out, ...).
enum class name_scheme : std::int8_t { llama, gpt_neox };
// The embedding's output scale: none, or sqrt(hidden) rounded to the activations' dtype (Gemma).
enum class embed_scale_kind : std::int8_t { none, sqrt_hidden };
// The library's residual combinators (for the composition rule residuals_agree).
enum class residual_kind : std::int8_t { pre_norm, post_norm, sandwich, parallel };

constexpr std::string_view name_of(norm_kind k) {
  return k == norm_kind::rms ? "rms" : k == norm_kind::rms_1p ? "rms_1p" : "rms_wmul";
}
constexpr std::string_view name_of(tensor_storage t) {
  return t == tensor_storage::separate ? "separate" : t == tensor_storage::concatenated ? "concatenated" : "interleaved";
}

}  // namespace megadsl

namespace megadsl::blocks {

inline constexpr int max_nodes = 48, max_rules = 8;  // (max_rows, max_kinds: architecture.hpp)

// Which sublayer of a layer a block sits in (the HF names of the norms around it follow from it).
enum class sublayer : std::int8_t { none, attention, mlp };

template <std::size_t N>
constexpr basic_text<N> joined(std::string_view a, std::string_view b) {
  if (a.size() + b.size() + 2 > N) throw "megadsl: a parameter or module name is longer than blocks.hpp's name capacity";
  basic_text<N> t(a);
  if (!a.empty() && !b.empty()) t.append(".");
  t.append(b);
  return t;
}

// Where a block sits: the prefix of its parameters' megadsl names (within `scope`: a layer's
// `layers.{layer}.` or the model's ""), its HF module, its placement and the layer kinds having it.
struct slot {
  std::string_view scope;
  basic_text<48> name;
  basic_text<96> hf;
  placement where = placement::layer;
  std::uint32_t kinds = 0;
  sublayer at = sublayer::none;
  name_scheme names = name_scheme::llama;

  // A part of the block: `n` under its megadsl prefix, `h` under its HF module.
  [[nodiscard]] constexpr slot sub(std::string_view n, std::string_view h) const {
    slot s = *this;
    s.name = joined<48>(name.view(), n);
    s.hf = joined<96>(hf.view(), h);
    return s;
  }
  // The block's HF module, its megadsl prefix unchanged ("self_attn", "mlp").
  [[nodiscard]] constexpr slot module(std::string_view h) const { return sub("", h); }
};

using details_fn = void (*)(const shape&, basic_text<256>&);

// What a composition is lowered into; `architecture_of` binds it into an `architecture`.
class arch_builder {
 public:
  struct row_text {
    basic_text<80> name;
    std::array<basic_text<112>, 3> hf;
  };
  std::array<row_text, max_rows> texts{};
  std::array<param_row, max_rows> rows{};
  int row_count = 0;
  std::array<basic_text<48>, max_nodes> prefixes{};
  std::array<basic_text<160>, max_nodes> labels{};
  std::array<basic_text<384>, max_nodes> signatures{};
  std::array<module_node, max_nodes> nodes{};
  int node_count = 0;
  std::array<layer_kind, max_kinds> kinds{};
  int kind_count = 0;
  int (*pick)(const shape&, std::int64_t) = nullptr;
  std::array<block_rule, max_rules> rules{};
  int rule_count = 0;
  int embedding = -1, final_norm = -1;
  basic_text<48> hf_layers;
  basic_text<512> name;
  activation act = activation::silu;
  bool has_act = false;
  bool routes = false;  // a block of the kind being lowered routes tokens to experts

  // A parameter of the block at `at`. The same parameter in several kinds of layer is one row.
  constexpr void param(const slot& at, const block_param& p) {
    row_text t;
    t.name = basic_text<80>(at.scope);  // "layers.{layer}." or ""
    t.name.append(joined<80>(at.name.view(), p.name).view());
    for (int i = 0; i < p.hf_count; ++i) t.hf[static_cast<std::size_t>(i)] = joined<112>(at.hf.view(), p.hf[static_cast<std::size_t>(i)]);
    for (int i = 0; i < row_count; ++i) {
      const auto u = static_cast<std::size_t>(i);
      if (texts[u].name.view() != t.name.view()) continue;
      if (texts[u].hf[0].view() != t.hf[0].view() || rows[u].kind != p.kind || rows[u].size != p.size)
        throw "megadsl: two blocks declare one megadsl parameter name with different HF names or shapes";
      rows[u].layer_kinds |= at.kinds;
      return;
    }
    for (int i = 0; i < row_count; ++i)
      for (int k = 0; k < rows[static_cast<std::size_t>(i)].hf_count; ++k)
        for (int j = 0; j < p.hf_count; ++j)
          if (texts[static_cast<std::size_t>(i)].hf[static_cast<std::size_t>(k)].view() == t.hf[static_cast<std::size_t>(j)].view())
            throw "megadsl: two parameters of the composition bind one HF name";
    if (row_count == max_rows) throw "megadsl: the composition declares more parameters than max_rows (architecture.hpp)";
    const auto u = static_cast<std::size_t>(row_count++);
    texts[u] = t;
    rows[u] = param_row{{}, p.kind, p.per_expert ? placement::expert : at.where, p.when, {}, p.hf_count, p.size,
                        p.concatenated, p.grad_partial_over_tp, p.init, at.kinds, p.dims_of, p.init_value, p.form,
                        p.stacking, p.slots_of};
  }

  // The block's module: its factory, the blocks it wraps, its `describe` line (label + details) and
  // its short name in the architecture's signature.
  constexpr int node(const slot& at, module_factory make, std::initializer_list<int> children, std::string_view name,
                     std::string_view label = {}, details_fn details = nullptr, std::int64_t setting = 0) {
    if (node_count == max_nodes) throw "megadsl: the composition has more blocks than blocks::max_nodes";
    if (children.size() > 4) throw "megadsl: a block wraps at most four blocks";
    const auto u = static_cast<std::size_t>(node_count);
    module_node& n = nodes[u];
    n.make = make;
    n.setting = setting;
    n.details = details;
    prefixes[u] = at.name;
    labels[u] = basic_text<160>(label);
    basic_text<384>& sig = signatures[u];
    sig.append(name);
    int i = 0;
    for (int c : children) {
      if (c < 0) continue;
      sig.add(i == 0 ? "(" : ", ", signatures[static_cast<std::size_t>(c)].view());
      n.children[static_cast<std::size_t>(i++)] = static_cast<std::int16_t>(c);
    }
    n.child_count = i;
    if (i > 0) sig.append(")");
    return node_count++;
  }
  // What the block costs beyond its matrices' FLOPs (which its rows give): the activations it keeps
  // for the backward, and its token-mixing scores (architecture.hpp).
  constexpr int costs(int node, activation_terms keeps, std::int64_t (*score_units)(const shape&) = nullptr) {
    nodes[static_cast<std::size_t>(node)].keeps = keeps;
    nodes[static_cast<std::size_t>(node)].score_units = score_units;
    return node;
  }
  // The activations it keeps, as its sizes decide (architecture.hpp's module_node::keeps_of).
  constexpr int costs(int node, activation_terms (*keeps_of)(const shape&)) {
    nodes[static_cast<std::size_t>(node)].keeps_of = keeps_of;
    return node;
  }
  // Its per-token FLOPs beyond its matrices and scores, and the weights verl counts for it
  // (architecture.hpp's token_flops).
  constexpr int per_token(int node, token_flops (*f)(const shape&)) {
    nodes[static_cast<std::size_t>(node)].per_token = f;
    return node;
  }
  // What it sends over cp per token of its own in a forward (architecture.hpp's module_node::cp_sent).
  constexpr int cp_traffic(int node, double (*f)(const shape&, std::int64_t tp, std::int64_t cp)) {
    nodes[static_cast<std::size_t>(node)].cp_sent = f;
    return node;
  }
  // Not a line of its own in `describe` (a norm its residual's line names).
  constexpr void hide(int node) { labels[static_cast<std::size_t>(node)] = {}; }
  [[nodiscard]] constexpr std::string_view label(int node) const { return labels[static_cast<std::size_t>(node)].view(); }
  [[nodiscard]] constexpr std::string_view signature(int node) const { return signatures[static_cast<std::size_t>(node)].view(); }

  // A layout rule the block adds (once, however many layers have the block).
  constexpr void rule(block_rule r) {
    for (int i = 0; i < rule_count; ++i)
      if (rules[static_cast<std::size_t>(i)] == r) return;
    if (rule_count == max_rules) throw "megadsl: the composition adds more rules than blocks::max_rules";
    rules[static_cast<std::size_t>(rule_count++)] = r;
  }
  // The MLPs' activation (config.json's one hidden_act).
  constexpr void uses(activation a) {
    if (has_act && act != a) throw "megadsl: the composition's MLPs use different activations; config.json names one";
    act = a;
    has_act = true;
  }
  // A leaf block: its parameters and module.
  template <std::size_t N>
  constexpr int leaf(const slot& at, const std::array<block_param, N>& params, module_factory make, std::string_view name,
                     std::string_view label = {}, details_fn details = nullptr, std::int64_t setting = 0) {
    for (const block_param& p : params) param(at, p);
    return node(at, make, {}, name, label.empty() ? name : label, details, setting);
  }
};

// A block: a type that lowers itself at a slot and returns its node.
template <class B>
concept block_type = requires(arch_builder& b, const slot& at) {
  { B::lower(b, at) } -> std::same_as<int>;
};
template <class B>
constexpr int lower_block(arch_builder& b, const slot& at) {
  static_assert(block_type<B>, "megadsl: not a block: a block type declares `static constexpr int lower(blocks::arch_builder&, const blocks::slot&)` (layers/blocks.hpp)");
  return B::lower(b, at);
}
// A norm: a block that also names its module, its label and how its weight starts (what a q/k norm
// block needs to place it at its own rows).
template <class N>
concept norm_block = block_type<N> && requires {
  { N::module } -> std::convertible_to<module_factory>;
  { N::label } -> std::convertible_to<std::string_view>;
  { N::init } -> std::convertible_to<param_init>;
};

// ---- norms ----------------------------------------------------------------------------------------

template <norm_kind K = norm_kind::rms>
struct rms_norm {
  static constexpr std::string_view label = K == norm_kind::rms ? "rms_norm<rms>" : K == norm_kind::rms_1p ? "rms_norm<rms_1p>" : "rms_norm<rms_wmul>";
  static constexpr module_factory module = K == norm_kind::rms      ? &modules::rms_norm
                                           : K == norm_kind::rms_1p ? &modules::rms_norm_1p
                                                                    : &modules::rms_norm_wmul;
  static constexpr param_init init = K == norm_kind::rms_1p ? param_init::zeros : param_init::ones;  // (1 + w): zero-centred
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.costs(b.leaf(at, std::array{block_param{"weight", shard_kind::replicated, {"weight"}, 1, extent::hidden,
                                                     presence::always, false, false, init}},
                          module, label),
                   {.whole = 2});  // its input
  }
};

// LayerNorm with a weight and a bias (StarCoder2, GPT-NeoX).
struct layer_norm {
  static constexpr std::string_view label = "layer_norm (+ bias)";
  static constexpr module_factory module = &modules::layer_norm;
  static constexpr param_init init = param_init::ones;
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.costs(b.leaf(at, std::array{block_param{"weight", shard_kind::replicated, {"weight"}, 1, extent::hidden,
                                                     presence::always, false, false, param_init::ones},
                                         block_param{"bias", shard_kind::replicated, {"bias"}, 1, extent::hidden,
                                                     presence::always, false, false, param_init::zeros}},
                          module, "layer_norm", label),
                   {.whole = 2});  // its input
  }
};

// LayerNorm without a bias, in fp32 with its weight (CohereLayerNorm).
struct layer_norm_no_bias {
  static constexpr std::string_view label = "layer_norm_no_bias (fp32)";
  static constexpr module_factory module = &modules::layer_norm_no_bias;
  static constexpr param_init init = param_init::ones;
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.costs(b.leaf(at, std::array{block_param{"weight", shard_kind::replicated, {"weight"}, 1, extent::hidden,
                                                     presence::always, false, false, param_init::ones}},
                          module, "layer_norm_no_bias", label),
                   {.whole = 2});  // its input
  }
};

// ---- attention and its q/k norms ------------------------------------------------------------------

// HF's names of a per-head q/k norm's two weights.
struct qk_norm_names {
  std::string_view q, k;
};
inline constexpr qk_norm_names qwen3_qk_norm_names{"q_norm", "k_norm"};
inline constexpr qk_norm_names hunyuan_qk_norm_names{"query_layernorm", "key_layernorm"};

constexpr void qk_norm_after_rope_rule(const shape& s, const layout& l, violations& out);

// Qwen3: q and k normed over head_dim before RoPE, one weight each for every head (q_norm,
// k_norm; replicated, their gradients partial over tp: each rank norms its own heads). HunYuan
// norms them after RoPE (AfterRope) and names them query_layernorm / key_layernorm.
template <norm_block N, const qk_norm_names& Names = qwen3_qk_norm_names, bool AfterRope = false>
struct per_head_qk_norm {
  static constexpr std::string_view label = AfterRope ? ", q/k rms_norm per head after rope" : ", q/k rms_norm per head";
  static constexpr int lower(arch_builder& b, const slot& at) {
    int nodes[2]{};
    const std::string_view ours[2] = {"q_norm", "k_norm"}, hf[2] = {Names.q, Names.k};
    for (int i = 0; i < 2; ++i) {
      b.param(at.sub(ours[i], hf[i]), {"weight", shard_kind::replicated, {"weight"}, 1, extent::head_dim, presence::always,
                                       false, true, N::init});
      nodes[i] = b.node(at.sub(ours[i], hf[i]), N::module, {}, N::label);
    }
    if constexpr (AfterRope) b.rule(&qk_norm_after_rope_rule);
    return b.node(at, &modules::per_head_qk_norm, {nodes[0], nodes[1]}, "per_head_qk_norm", {}, nullptr,
                  AfterRope ? modules::qk_norm_after_rope_bit : 0);
  }
};

// Cohere (Command R+): q and k each normed over head_dim as per_head_qk_norm's, with a weight for
// every head: q_norm.weight (heads, d), k_norm.weight (kv_heads, d), split over tp with the heads,
// so each rank holds and steps its own heads' weights (with kv_heads < tp, its kv group's k weight,
// replicated like its k rows, the replicas' gradients summed).
template <norm_block N>
struct headwise_qk_norm {
  static constexpr std::string_view label = ", q/k norm per head, a weight per head";
  static constexpr int lower(arch_builder& b, const slot& at) {
    int nodes[2]{};
    const std::string_view names[2] = {"q_norm", "k_norm"};
    const extent sizes[2] = {extent::q_head_weights, extent::kv_head_weights};
    for (int i = 0; i < 2; ++i) {
      b.param(at.sub(names[i], names[i]), {.name = "weight", .kind = shard_kind::column, .hf = {"weight"}, .hf_count = 1,
                                           .size = sizes[i], .init = N::init});
      nodes[i] = b.node(at.sub(names[i], names[i]), N::module, {}, N::label);
    }
    return b.node(at, &modules::per_head_qk_norm, {nodes[0], nodes[1]}, "headwise_qk_norm", {}, nullptr,
                  modules::qk_norm_weight_per_head_bit);
  }
};

constexpr void full_width_qk_norm_rule(const shape& s, const layout& l, violations& out);

// OLMo2: over the whole projection width (heads * d for q, kv_heads * d for k), split over tp with
// the heads: the fp32 sum of squares summed over tp, then each norm's weight step.
template <norm_block N>
struct full_width_qk_norm {
  static constexpr std::string_view label = ", q/k rms_norm over the full width";
  static constexpr int lower(arch_builder& b, const slot& at) {
    b.param(at.sub("q_norm", "q_norm"), {"weight", shard_kind::column, {"weight"}, 1, extent::q_width, presence::always,
                                         false, false, N::init});
    b.param(at.sub("k_norm", "k_norm"), {"weight", shard_kind::column, {"weight"}, 1, extent::k_width, presence::always,
                                         false, false, N::init});
    b.rule(&full_width_qk_norm_rule);
    const int q = b.node(at.sub("q_norm", "q_norm"), N::module, {}, N::label);
    const int k = b.node(at.sub("k_norm", "k_norm"), N::module, {}, N::label);
    return b.node(at, &modules::full_width_qk_norm, {q, k}, "full_width_qk_norm");
  }
};

struct no_qk_norm {
  static constexpr std::string_view label = "";
};

// Llama 4 (Llama4TextL2Norm): q and k normed per head over head_dim without a weight, eps the
// shape's rms_eps, in fp32. HF norms them after RoPE; the RMS of a head is the same before and
// after the rotation, so megadsl norms them before it, as Megatron's qk_l2_norm does.
struct l2_qk_norm {
  static constexpr std::string_view label = ", q/k rms-normed per head (no weight)";
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.node(at, &modules::l2_qk_norm, {}, "l2_qk_norm");
  }
};

struct attention_knobs {
  tensor_storage storage = tensor_storage::separate;  // HF's q/k/v: q_proj, k_proj, v_proj or qkv_proj
  bool rope = true;  // false: a NoPE layer, q and k unrotated (SmolLM3's no_rope_layers zeros)
  bool sinks = false;  // gpt-oss's learned sink logit per query head (self_attn.sinks), split with the heads
  bool chunked = false;  // Llama 4's RoPE layers: attention within the shape's attention_chunk tokens
  bool temperature = false;  // Llama 4's NoPE layers: q scaled per position (the shape's attn_floor_scale, attn_scale)
};

constexpr void concatenated_qkv_rule(const shape& s, const layout& l, violations& out);

// Ulysses' traffic per token of a rank's own (elements, one forward): an all-to-all keeps 1/cp of
// what it moves and sends the rest; an all-gather sends the rank's rows to each of the cp - 1 others.
constexpr double all_to_all_share(std::int64_t cp) { return static_cast<double>(cp - 1) / static_cast<double>(cp); }
// Grouped-query attention's (cp_whole_stream_heads): the tp rank's [q | k | v] of whole kv groups
// there and the output back; where its kv groups do not split over cp, q alone there and k and v
// gathered whole. Fewer kv heads than tp ranks: each rank holds one.
constexpr double gqa_cp_sent(const shape& s, std::int64_t tp, std::int64_t cp) {
  const std::int64_t d = effective_head_dim(s).get(), n = s.heads.get() / tp;
  const std::int64_t g = s.kv_heads.get() >= tp ? s.kv_heads.get() / tp : 1;
  if (g % cp == 0) return static_cast<double>((2 * n + 2 * g) * d) * all_to_all_share(cp);
  return static_cast<double>(2 * n * d) * all_to_all_share(cp) + static_cast<double>(2 * g * d * (cp - 1));
}
constexpr void interleaved_qkv_rule(const shape& s, const layout& l, violations& out);

// Grouped-query self-attention with RoPE: q/k/v (fused per rank, column-parallel; bias per the
// shape's qkv_bias) and o (row-parallel; bias per out_bias, added after the reduction), with an
// optional q/k norm before RoPE. The shape's numbers set the score scale, soft-cap and rotated share.
template <attention_knobs K = attention_knobs{}, class QkNorm = no_qk_norm>
struct attention {
  static constexpr tensor_storage hf_storage = K.storage;
  static constexpr bool interleaved = K.storage == tensor_storage::interleaved;

  // Its scores over every key of the sequence: heads x head_dim (the formulas' L n d, per layer).
  static constexpr std::int64_t score_units(const shape& s) { return s.heads.get() * effective_head_dim(s).get(); }
  static constexpr row_dims sink_dims(const shape& s) { return {s.heads.get(), 0}; }

  static constexpr void details(const shape& s, basic_text<256>& t) {
    auto on = [](const auto& v) { return v.is_static() && v.get(); };
    t.add("  q/k/v", on(s.qkv_bias) ? " + bias" : "", on(s.out_bias) ? ", o + bias" : "", K.rope ? (on(s.rope_interleave) ? ", rope on pairs" : ", rope") : ", no rope",
          QkNorm::label);
    if (K.sinks) t.add(", learned sinks");
    if (K.chunked && s.attention_chunk.is_static() && s.attention_chunk.get() != 0) t.add(", chunks of ", s.attention_chunk.get());
    if (K.temperature && s.attn_floor_scale.is_static() && s.attn_floor_scale.get() != 0) t.add(", q temperature-tuned");
    if (s.query_pre_attn_scalar.is_static() && s.query_pre_attn_scalar.get() != 0) t.add(", scale query_pre_attn_scalar^-1/2");
    if (s.attn_softcap.is_static() && s.attn_softcap.get() != 0) t.add(", tanh soft-cap");
    if (s.rotary_fraction.is_static() && s.rotary_fraction.get() != 1.0) t.add(" on part of each head");
    t.add(K.storage == tensor_storage::concatenated ? "  [self_attn: qkv_proj]"
          : interleaved                              ? "  [attention: query_key_value, per head]"
                                                     : "  [self_attn]");
  }

  static constexpr int lower(arch_builder& b, const slot& layer) {
    if (interleaved != (layer.names == name_scheme::gpt_neox))
      throw "megadsl: interleaved_qkv_is_neox: q/k/v interleaved per head is stored by GPT-NeoX checkpoints only "
            "(and they store nothing else); give attention that storage exactly when the decoder has name_scheme::gpt_neox";
    const slot at = layer.module(interleaved ? "attention" : "self_attn");
    if constexpr (K.storage == tensor_storage::separate) {
      b.param(at, {"qkv.weight", shard_kind::fused_qkv, {"q_proj.weight", "k_proj.weight", "v_proj.weight"}, 3});
      b.param(at, {"qkv.bias", shard_kind::fused_qkv, {"q_proj.bias", "k_proj.bias", "v_proj.bias"}, 3, extent::none,
                   presence::qkv_bias});
    } else if constexpr (K.storage == tensor_storage::concatenated) {
      b.param(at, {"qkv.weight", shard_kind::fused_qkv, {"qkv_proj.weight"}, 1, extent::none, presence::always, true});
      b.rule(&concatenated_qkv_rule);
    } else {
      // query_key_value holds [q_h; k_h; v_h] per head (kv_heads == heads), so each tp rank's heads
      // are one contiguous block of its rows: a column split of the HF tensor.
      b.param(at, {"qkv.weight", shard_kind::column, {"query_key_value.weight"}, 1, extent::qkv_rows});
      b.param(at, {"qkv.bias", shard_kind::column, {"query_key_value.bias"}, 1, extent::qkv_rows, presence::qkv_bias});
      b.rule(&interleaved_qkv_rule);
    }
    // One logit per query head, in the softmax of each of its rows (gpt-oss): split over tp with the
    // heads (each rank's are contiguous), and over cp with the heads the core sees.
    if constexpr (K.sinks)
      b.param(at, {"sinks", shard_kind::column, {"sinks"}, 1, extent::none, presence::always, false, false,
                   param_init::normal, false, &sink_dims});
    int qk = -1;
    if constexpr (!std::is_same_v<QkNorm, no_qk_norm>) qk = lower_block<QkNorm>(b, at);
    const std::string_view o = interleaved ? "dense" : "o_proj";
    b.param(at.sub("o_proj", o), {"weight", shard_kind::row, {"weight"}, 1, extent::attn_width});
    b.param(at.sub("o_proj", o), {"bias", shard_kind::replicated, {"bias"}, 1, extent::hidden, presence::out_bias});
    basic_text<64> name("attention<");
    name.add(name_of(K.storage), K.rope ? "" : ", nope", K.sinks ? ", sinks" : "", K.chunked ? ", chunked" : "",
             K.temperature ? ", temperature>" : ">");
    // Keeps its input (2, whole without SP) and the dropout mask (1), q and k (4), v (2), the
    // output projection's input (2) split over tp, and the softmax with its mask (5 a s b s).
    return b.cp_traffic(b.costs(b.node(at, &modules::attention, {qk}, name.view(), K.rope ? "attention" : "attention (no RoPE)", &details,
                                       (K.rope ? 0 : modules::attention_nope_bit) | (K.chunked ? modules::attention_chunked_bit : 0) |
                                           (K.temperature ? modules::attention_temperature_bit : 0)),
                                {.whole = 3, .split = 8, .scores = 5}, &score_units),
                        &gqa_cp_sent);
  }
};

constexpr void mla_rule(const shape& s, const layout& l, violations& out);

// DeepSeek-V3's multi-head latent attention (DeepseekV3Attention; Kimi K2, Moonlight): the query
// through a low rank (q_a_proj, its RMSNorm q_a_layernorm, q_b_proj) or directly (q_proj, where
// q_lora_rank is 0); the kv compressed to kv_lora_rank plus one RoPE key shared by every head
// (kv_a_proj_with_mqa), the compressed part normed (kv_a_layernorm) and projected up to each head's
// [k_nope | v] (kv_b_proj); each head's q and k are [nope (qk_nope_dim) | rope (head_dim)], its v
// v_head_dim wide; o_proj. The down projections and their norms (eps 1e-6, Llama's cast order)
// are replicated, applied to the whole stream on every tp rank (their gradients partial over tp);
// the up projections split the heads over tp (column), o_proj is row-parallel.
struct mla {
  static constexpr std::int64_t qk_dim(const shape& s) { return s.qk_nope_dim.get() + effective_head_dim(s).get(); }
  static constexpr row_dims q_down(const shape& s) { return {s.q_lora_rank.get(), s.hidden.get()}; }
  static constexpr row_dims q_norm(const shape& s) { return {s.q_lora_rank.get(), 0}; }
  static constexpr row_dims q_up(const shape& s) { return {s.heads.get() * qk_dim(s), s.q_lora_rank.get()}; }
  static constexpr row_dims q_full(const shape& s) { return {s.heads.get() * qk_dim(s), s.hidden.get()}; }
  static constexpr row_dims kv_down(const shape& s) {
    return {s.kv_lora_rank.get() + effective_head_dim(s).get(), s.hidden.get()};
  }
  static constexpr row_dims kv_norm(const shape& s) { return {s.kv_lora_rank.get(), 0}; }
  static constexpr row_dims kv_up(const shape& s) {
    return {s.heads.get() * (s.qk_nope_dim.get() + s.v_head_dim.get()), s.kv_lora_rank.get()};
  }
  static constexpr row_dims out(const shape& s) { return {s.hidden.get(), s.heads.get() * s.v_head_dim.get()}; }
  // Its scores: q k^T over qk_dim and p v over v_head_dim per head, the mean of the two widths in
  // the formulas' unit (heads x head_dim).
  static constexpr std::int64_t score_units(const shape& s) { return s.heads.get() * (qk_dim(s) + s.v_head_dim.get()) / 2; }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    const auto known = [](const dim& v) { return v.is_static() ? v.get() : std::int64_t{-1}; };
    t.add("  q ", s.q_lora_rank.is_static() && s.q_lora_rank.get() == 0 ? "direct" : "via rank ", known(s.q_lora_rank),
          ", kv via rank ", known(s.kv_lora_rank), ", heads [nope ", known(s.qk_nope_dim), " | rope ", known(s.head_dim),
          "], v ", known(s.v_head_dim), s.rope_interleave.is_static() && s.rope_interleave.get() ? ", rope on pairs" : "",
          "  [self_attn: q_a_proj/q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("self_attn");
    const auto param = [&](std::string_view name, std::string_view hf, shard_kind k, presence when, row_dims_fn dims,
                           bool partial, param_init init = param_init::normal) {
      b.param(at.sub(name, hf), {"weight", k, {"weight"}, 1, extent::none, when, false, partial, init, false, dims});
    };
    param("q_down", "q_a_proj", shard_kind::replicated, presence::q_lora, &q_down, true);
    param("q_latent_norm", "q_a_layernorm", shard_kind::replicated, presence::q_lora, &q_norm, true, param_init::ones);
    param("q_up", "q_b_proj", shard_kind::column, presence::q_lora, &q_up, false);
    param("q_proj", "q_proj", shard_kind::column, presence::q_direct, &q_full, false);
    param("kv_down", "kv_a_proj_with_mqa", shard_kind::replicated, presence::always, &kv_down, true);
    param("kv_latent_norm", "kv_a_layernorm", shard_kind::replicated, presence::always, &kv_norm, true, param_init::ones);
    param("kv_up", "kv_b_proj", shard_kind::column, presence::always, &kv_up, false);
    param("o_proj", "o_proj", shard_kind::row, presence::always, &out, false);
    b.rule(&mla_rule);
    return b.cp_traffic(b.costs(b.node(at, &modules::mla, {}, "mla", "mla (multi-head latent attention)", &details),
                                {.whole = 3, .split = 8, .scores = 5}, &score_units),
                        &cp_sent);
  }
  // Under cp: each tp rank's heads' [q | k_nope | v] there and the output back by all-to-all, the
  // shared rotary key (head_dim wide) gathered whole.
  static constexpr double cp_sent(const shape& s, std::int64_t tp, std::int64_t cp) {
    const std::int64_t n = s.heads.get() / tp, nope = s.qk_nope_dim.get(), v = s.v_head_dim.get();
    return static_cast<double>(n * (qk_dim(s) + nope + 2 * v)) * all_to_all_share(cp) +
           static_cast<double>(effective_head_dim(s).get() * (cp - 1));
  }
};

constexpr void gated_delta_net_rule(const shape& s, const layout& l, violations& out);

// How HF stores a gated DeltaNet's input projections: Qwen3-Next's in_proj_qkvz (per key head
// [q | k | v of its value heads | z of them]) and in_proj_ba (per key head [b | a] of its value
// heads), or Qwen3.5's in_proj_qkv ([all q | all k | all v]), in_proj_z, in_proj_b and in_proj_a.
enum class delta_net_storage : std::int8_t { grouped, split };

// The gated DeltaNet (Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet), a linear-attention layer: the
// input projections (column-parallel by whole key heads with their value heads: grouped per key
// head, HF's rows are contiguous per rank; split, each of q, k and v is its own slot of in_proj_qkv,
// shard_kind::column_slots); a causal depthwise conv (conv1d, linear_conv_kernel taps) and SiLU over
// the channels [q | k | v]; q and k L2-normed per head, q scaled by linear_key_dim^-1/2; the gated
// delta rule with decay g = -exp(A_log) softplus(a + dt_bias) and rate beta = sigmoid(b), each value
// head reading its key head; the output RMS-normed per head (weight per dim) times SiLU(z), then
// out_proj (row-parallel). The conv's channels split as in_proj_qkv's slots (each rank its heads' q,
// k and v taps); the norm's weight is replicated (its gradient partial over tp). The state starts
// at zero in each sequence: padded rows as transformers masks them, packed sequences each from its
// own start. Under context parallelism (Ulysses) an all-to-all gives each cp rank whole sequences
// of a share of its tp rank's key heads for the conv and the rule, and one brings the output back.
template <delta_net_storage S = delta_net_storage::grouped>
struct gated_delta_net {
  static constexpr std::int64_t key_width(const shape& s) { return s.linear_key_heads.get() * s.linear_key_dim.get(); }
  static constexpr std::int64_t value_width(const shape& s) { return s.linear_value_heads.get() * s.linear_value_dim.get(); }
  static constexpr row_dims qkvz(const shape& s) { return {2 * key_width(s) + 2 * value_width(s), s.hidden.get()}; }
  static constexpr row_dims ba(const shape& s) { return {2 * s.linear_value_heads.get(), s.hidden.get()}; }
  static constexpr row_dims qkv(const shape& s) { return {2 * key_width(s) + value_width(s), s.hidden.get()}; }
  static constexpr std::array<std::int64_t, 3> qkv_slots(const shape& s) { return {key_width(s), key_width(s), value_width(s)}; }
  static constexpr row_dims z(const shape& s) { return {value_width(s), s.hidden.get()}; }
  static constexpr row_dims gate(const shape& s) { return {s.linear_value_heads.get(), s.hidden.get()}; }
  static constexpr row_dims conv(const shape& s) { return {2 * key_width(s) + value_width(s), s.linear_conv_kernel.get()}; }
  static constexpr row_dims per_value_head(const shape& s) { return {s.linear_value_heads.get(), 0}; }
  static constexpr row_dims norm(const shape& s) { return {s.linear_value_dim.get(), 0}; }
  static constexpr row_dims out(const shape& s) { return {s.hidden.get(), value_width(s)}; }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    const auto known = [](const dim& v) { return v.is_static() ? v.get() : std::int64_t{-1}; };
    t.add("  q/k ", known(s.linear_key_heads), " heads of ", known(s.linear_key_dim), ", v ", known(s.linear_value_heads),
          " heads of ", known(s.linear_value_dim), ", conv ", known(s.linear_conv_kernel),
          S == delta_net_storage::grouped ? "  [linear_attn: in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj]"
                                          : "  [linear_attn: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log, norm, out_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("linear_attn");
    const auto matrix = [&](std::string_view name, shard_kind k, row_dims_fn dims) {
      b.param(at, {name, k, {name}, 1, extent::none, presence::always, false, false, param_init::normal, false, dims});
    };
    if constexpr (S == delta_net_storage::grouped) {
      matrix("in_proj_qkvz.weight", shard_kind::column, &qkvz);
      matrix("in_proj_ba.weight", shard_kind::column, &ba);
    } else {
      b.param(at, {"in_proj_qkv.weight", shard_kind::column_slots, {"in_proj_qkv.weight"}, 1, extent::none, presence::always,
                   false, false, param_init::normal, false, &qkv, 0, hf_form::as_held, hf_stacking::none, &qkv_slots});
      matrix("in_proj_z.weight", shard_kind::column, &z);
      matrix("in_proj_b.weight", shard_kind::column, &gate);
      matrix("in_proj_a.weight", shard_kind::column, &gate);
    }
    // The conv's channels are in_proj_qkv's three slots: each rank holds its heads' q, k and v taps.
    b.param(at, {"conv1d.weight", shard_kind::column_slots, {"conv1d.weight"}, 1, extent::none, presence::always, false, false,
                 param_init::normal, false, &conv, 0, hf_form::conv, hf_stacking::none, &qkv_slots});
    b.param(at, {"dt_bias", shard_kind::column, {"dt_bias"}, 1, extent::none, presence::always, false, false,
                 param_init::ones, false, &per_value_head});
    // A = exp(A_log); HF draws A uniformly from [0.01, 16] where no checkpoint gives it: e^2 here.
    b.param(at, {"A_log", shard_kind::column, {"A_log"}, 1, extent::none, presence::always, false, false,
                 param_init::constant, false, &per_value_head, 2.0});
    b.param(at, {"linear_norm.weight", shard_kind::replicated, {"norm.weight"}, 1, extent::none, presence::always, false, true,
                 param_init::ones, false, &norm});
    matrix("out_proj.weight", shard_kind::row, &out);
    b.rule(&gated_delta_net_rule);
    const int node = b.node(at, &modules::gated_delta_net, {}, S == delta_net_storage::grouped ? "gated_delta_net" : "gated_delta_net<split>",
                            "gated_delta_net (linear attention)", &details, S == delta_net_storage::split ? 1 : 0);
    return b.cp_traffic(b.per_token(b.costs(node, &keeps), &rule_flops), &cp_sent);
  }
  // What it keeps for the backward, per token in bytes over h (16-bit activations), as measured:
  // torch's saved-tensor hooks over a training step of models of DeltaNet layers only, 3 layers
  // less 1, 12 shapes, bf16 (bench/delta_net_activations.py prints the figures beside these).
  //   whole  its input (2).
  //   split  the conv's input and output, the rule's inputs q, k, v and the gated norm's fp32
  //          tensors and out_proj's input: 10.5 per key channel, 26.5 per value channel.
  //   core   the chunked rule's intermediates (chunks of 64; fp32 decay, k k^T, q k^T, the UT
  //          solve's system and solution, each chunk's state and outputs): per value head
  //          1040 + 16 dk + 9.5 dv + 3.5 dk dv / 64, per key head 522.4 + 28 dk. Within 3% of
  //          the measurement on every shape; selective recompute keeps none of it.
  static constexpr activation_terms keeps(const shape& s) {
    const double h = static_cast<double>(s.hidden.get()), nk = static_cast<double>(s.linear_key_heads.get());
    const double nv = static_cast<double>(s.linear_value_heads.get()), dk = static_cast<double>(s.linear_key_dim.get());
    const double dv = static_cast<double>(s.linear_value_dim.get());
    return {.whole = 2,
            .split = (10.5 * nk * dk + 26.5 * nv * dv) / h,
            .core = (nv * (1040 + 16 * dk + 9.5 * dv + 3.5 * dk * dv / 64) + nk * (522.4 + 28 * dk)) / h};
  }
  // Under cp: each of the tp rank's key heads' [q | k | v | b | a] there, the output back.
  static constexpr double cp_sent(const shape& s, std::int64_t tp, std::int64_t cp) {
    const std::int64_t nk = s.linear_key_heads.get() / tp, nv = s.linear_value_heads.get() / tp;
    return static_cast<double>(2 * nk * s.linear_key_dim.get() + 2 * nv * s.linear_value_dim.get() + 2 * nv) *
           all_to_all_share(cp);
  }
  // The delta rule's own FLOPs per token: Megatron's 6 x 4 nv dv^2 (its formula writes dv^2 for
  // dk dv), verl's 15 dk dv nv; verl counts the projections' and out_proj's weights and the conv's taps.
  static constexpr token_flops rule_flops(const shape& s) {
    const std::int64_t nv = s.linear_value_heads.get(), dk = s.linear_key_dim.get(), dv = s.linear_value_dim.get();
    return {.megatron = 6 * 4 * nv * dv * dv,
            .verl = 15 * dk * dv * nv,
            .verl_weights = s.hidden.get() * (2 * key_width(s) + 3 * value_width(s) + 2 * nv) +
                            s.linear_conv_kernel.get() * (2 * key_width(s) + value_width(s))};
  }
};

// Qwen3-Next's full-attention layers (Qwen3NextAttention): q_proj gives each head [q | gate] (2 x
// head_dim rows per head, so a tp rank's heads are one contiguous block, column-parallel); k_proj
// and v_proj replicated (they are small: Qwen3-Next has 2 kv heads), each rank projecting the kv
// heads its query heads read, so any tp the kv heads fit (a multiple or a divisor) works, fewer kv
// heads than ranks included; their gradients partial over tp; the q/k norm `QkNorm` per head before RoPE
// (zero-centred RMSNorms in Qwen3-Next); RoPE on the shape's rotary share; causal attention; the
// output times sigmoid(gate) before o_proj (row-parallel).
template <class QkNorm>
struct gated_attention {
  static constexpr std::int64_t d(const shape& s) { return effective_head_dim(s).get(); }
  static constexpr row_dims q(const shape& s) { return {2 * s.heads.get() * d(s), s.hidden.get()}; }
  static constexpr row_dims q_bias(const shape& s) { return {2 * s.heads.get() * d(s), 0}; }
  static constexpr row_dims kv(const shape& s) { return {s.kv_heads.get() * d(s), s.hidden.get()}; }
  static constexpr row_dims kv_bias(const shape& s) { return {s.kv_heads.get() * d(s), 0}; }
  static constexpr std::int64_t score_units(const shape& s) { return s.heads.get() * d(s); }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    auto on = [](const auto& v) { return v.is_static() && v.get(); };
    t.add("  q/k/v", on(s.qkv_bias) ? " + bias" : "", on(s.out_bias) ? ", o + bias" : "", ", rope",
          s.rotary_fraction.is_static() && s.rotary_fraction.get() != 1.0 ? " on part of each head" : "", QkNorm::label,
          ", output times sigmoid(gate)  [self_attn: q_proj = [q | gate] per head]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("self_attn");
    const auto param = [&](std::string_view name, shard_kind k, presence when, row_dims_fn dims) {
      b.param(at, {name, k, {name}, 1, extent::none, when, false, false, param_init::normal, false, dims});
    };
    param("q_proj.weight", shard_kind::column, presence::always, &q);
    const auto replicated = [&](std::string_view name, presence when, row_dims_fn dims, param_init init) {
      b.param(at, {name, shard_kind::replicated, {name}, 1, extent::none, when, false, true, init, false, dims});
    };
    replicated("k_proj.weight", presence::always, &kv, param_init::normal);
    replicated("v_proj.weight", presence::always, &kv, param_init::normal);
    b.param(at, {"q_proj.bias", shard_kind::column, {"q_proj.bias"}, 1, extent::none, presence::qkv_bias, false, false,
                 param_init::zeros, false, &q_bias});
    replicated("k_proj.bias", presence::qkv_bias, &kv_bias, param_init::zeros);
    replicated("v_proj.bias", presence::qkv_bias, &kv_bias, param_init::zeros);
    const int qk = lower_block<QkNorm>(b, at);
    b.param(at.sub("o_proj", "o_proj"), {"weight", shard_kind::row, {"weight"}, 1, extent::attn_width});
    b.param(at.sub("o_proj", "o_proj"), {"bias", shard_kind::replicated, {"bias"}, 1, extent::hidden, presence::out_bias});
    const int node = b.node(at, &modules::gated_attention, {qk}, "gated_attention", "attention (output gate)", &details);
    return b.cp_traffic(b.per_token(b.costs(node, {.whole = 3, .split = 10, .scores = 5}, &score_units), &verl_weights),
                        &gqa_cp_sent);
  }
  // verl counts q_proj twice as wide (the gate), k_proj, v_proj and o_proj: h (3 n d + 2 g d).
  static constexpr token_flops verl_weights(const shape& s) {
    return {.verl_weights = s.hidden.get() * (3 * s.heads.get() + 2 * s.kv_heads.get()) * d(s)};
  }
};

// ---- MLPs -----------------------------------------------------------------------------------------

// An MLP keeps its input (2) and its dropout mask (1) whole, its 4h-wide intermediates (16) split
// over tp (the paper's GPT MLP; for SwiGLU and other widths the customary estimate).
inline constexpr activation_terms mlp_keeps{.whole = 3, .split = 16};

// The HF module an MLP's tensors sit in: `mlp` (most families) or `feed_forward` (Llama 4).
struct hf_module {
  std::string_view name;
};
inline constexpr hf_module mlp_module{"mlp"}, feed_forward_module{"feed_forward"};

// down(act(gate(x)) * up(x)), gate and up column-parallel (fused per rank), down row-parallel.
// HF stores gate and up separately (gate_proj, up_proj) or concatenated (gate_up_proj); Llama's
// mlp_bias adds biases on all three (separate storage).
template <activation A = activation::silu, tensor_storage S = tensor_storage::separate, const hf_module& M = mlp_module>
struct gated_mlp {
  static_assert(S != tensor_storage::interleaved, "megadsl: a gated MLP has no interleaved form (separate or concatenated)");
  static constexpr tensor_storage hf_storage = S;
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add(s.mlp_bias.is_static() && s.mlp_bias.get() ? " + biases" : "", "  [", M.name,
          S == tensor_storage::concatenated ? ": gate_up_proj" : "", "]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module(M.name);
    if constexpr (S == tensor_storage::separate)
      b.param(at, {"gate_up.weight", shard_kind::fused_gate_up, {"gate_proj.weight", "up_proj.weight"}, 2});
    else
      b.param(at, {"gate_up.weight", shard_kind::fused_gate_up, {"gate_up_proj.weight"}, 1, extent::none,
                   presence::always, true});
    b.param(at, {"down.weight", shard_kind::row, {"down_proj.weight"}, 1, extent::ffn});
    if constexpr (S == tensor_storage::separate) {
      b.param(at, {"gate_up.bias", shard_kind::fused_gate_up, {"gate_proj.bias", "up_proj.bias"}, 2, extent::none,
                   presence::mlp_bias});
      b.param(at, {"down.bias", shard_kind::replicated, {"down_proj.bias"}, 1, extent::hidden, presence::mlp_bias});
    }
    b.uses(A);
    basic_text<64> name("gated_mlp<");
    name.add(name_of(A), ">");
    return b.costs(b.node(at, &modules::gated_mlp, {}, name.view(), name.view(), &details, static_cast<std::int64_t>(A)),
                   mlp_keeps);
  }
};

// proj(act(fc(x) + b_fc)) + b_proj: fc column-parallel with its bias split, proj row-parallel with
// its bias added after the reduction (StarCoder2's c_fc / c_proj, NeoX's dense_h_to_4h /
// dense_4h_to_h; biases per the shape's out_bias).
template <activation A = activation::gelu_tanh>
struct plain_mlp {
  template <bool Neox>
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add(s.out_bias.is_static() && s.out_bias.get() ? " + biases" : "",
          Neox ? "  [mlp: dense_h_to_4h, dense_4h_to_h]" : "  [mlp: c_fc, c_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const bool neox = layer.names == name_scheme::gpt_neox;
    const slot at = layer.module("mlp");
    const std::string_view fc = neox ? "dense_h_to_4h" : "c_fc", proj = neox ? "dense_4h_to_h" : "c_proj";
    b.param(at.sub("fc", fc), {"weight", shard_kind::column, {"weight"}, 1, extent::ffn_rows});
    b.param(at.sub("fc", fc), {"bias", shard_kind::column, {"bias"}, 1, extent::ffn_rows, presence::out_bias});
    b.param(at.sub("down", proj), {"weight", shard_kind::row, {"weight"}, 1, extent::ffn});
    b.param(at.sub("down", proj), {"bias", shard_kind::replicated, {"bias"}, 1, extent::hidden, presence::out_bias});
    b.uses(A);
    basic_text<64> name("plain_mlp<");
    name.add(name_of(A), ">");
    return b.costs(b.node(at, &modules::plain_mlp, {}, name.view(), name.view(), neox ? &details<true> : &details<false>,
                          static_cast<std::int64_t>(A)),
                   mlp_keeps);
  }
};

// down(xielu(up x)) (Apertus): up column-parallel, down row-parallel, no biases; xIELU's four
// scalars under mlp.act_fn: alpha_p and alpha_n learned (replicated, their gradients summed over
// tp, since each rank activates its own features), beta and eps fixed (HF's 0-dim buffers, kept
// out of the gradient):
//   xielu(x) = x > 0 ? softplus(alpha_p) x^2 + beta x : (expm1(min(x, eps)) - x)(beta + softplus(alpha_n)) + beta x
struct xielu_mlp {
  static constexpr row_dims one_value(const shape&) { return {1, 0}; }
  static constexpr void details(const shape&, basic_text<256>& t) {
    t.append("  [mlp: up_proj, act_fn (alpha_p, alpha_n, beta, eps), down_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("mlp");
    b.param(at.sub("up", "up_proj"), {"weight", shard_kind::column, {"weight"}, 1, extent::ffn_rows});
    b.param(at.sub("down", "down_proj"), {"weight", shard_kind::row, {"weight"}, 1, extent::ffn});
    // Their starting values are XIELUActivation's: alpha_p = log(expm1(0.8)), alpha_n = log(expm1(0.8 - beta)).
    const slot act = at.sub("act", "act_fn");
    b.param(act, {"alpha_p", shard_kind::replicated, {"alpha_p"}, 1, extent::none, presence::always, false, true,
                  param_init::constant, false, &one_value, 0.20338237285614014});
    b.param(act, {"alpha_n", shard_kind::replicated, {"alpha_n"}, 1, extent::none, presence::always, false, true,
                  param_init::constant, false, &one_value, -1.0502256155014038});
    b.param(act, {"beta", shard_kind::replicated, {"beta"}, 1, extent::none, presence::always, false, false,
                  param_init::constant, false, &one_value, 0.5, hf_form::scalar});
    b.param(act, {"eps", shard_kind::replicated, {"eps"}, 1, extent::none, presence::always, false, false,
                  param_init::constant, false, &one_value, -1e-6, hf_form::scalar});
    b.uses(activation::xielu);
    return b.costs(b.node(at, &modules::xielu_mlp, {}, "xielu_mlp", "xielu_mlp", &details), mlp_keeps);
  }
};

struct moe_knobs {
  moe_names names = moe_names::qwen;  // Mixtral's or Qwen's HF tensor names
  bool shared_expert = false;         // Qwen2-MoE's shared expert and its sigmoid gate
  moe_router router = moe_router::softmax;
  bool shared_experts = false;        // DeepSeek's ungated shared experts (mlp.shared_experts.*), added
  bool fp32_router = false;           // the softmax router's logits in fp32 whatever the compute dtype (HunYuan's wg)
};

// A mixture of gated experts behind a top-k router: the shape gives experts, top_k, expert_ffn,
// norm_topk (and shared_expert_ffn). Experts split over ep (whole experts) and each expert over
// etp = tp like a gated MLP; tokens travel to their experts by all-to-all (layers/moe.hpp). The
// router is replicated; under tp its gradient is summed over tp, since the experts' outputs it
// weighs are partial sums there.
template <activation A = activation::silu, moe_knobs K = moe_knobs{}>
struct moe_mlp {
  static constexpr bool mixtral = K.names == moe_names::mixtral;
  static constexpr bool gpt_oss = K.names == moe_names::gpt_oss;
  static constexpr bool llama4 = K.names == moe_names::llama4;
  static constexpr void details(const shape& s, basic_text<256>& t) {
    const auto known = [](const dim& v) { return v.is_static() ? v.get() : std::int64_t{-1}; };
    if constexpr (gpt_oss)
      t.add("  router + bias -> top ", known(s.top_k), " of ", known(s.experts),
            ", softmax over them; experts clamped SwiGLU + biases  [mlp: router, experts.{gate_up,down}_proj(_bias), stacked]");
    else if constexpr (K.router == moe_router::sigmoid_on_input)
      t.add("  router -> top ", known(s.top_k), " of ", known(s.experts),
            ", each expert fed x * sigmoid(logit); + shared gated_mlp  [feed_forward: router, experts.{gate_up,down}_proj "
            "stacked, shared_expert]");
    else if constexpr (K.router == moe_router::sigmoid_grouped)
      t.add("  router sigmoid + expert bias -> top ", known(s.top_k), " of ", known(s.experts), " in the best ",
            known(s.group_top_k), " of ", known(s.expert_groups), " groups",
            s.norm_topk.is_static() && s.norm_topk.get() ? ", renormalised" : "", ", x ", s.routed_scale.is_static() ? s.routed_scale.get() : -1.0,
            "  [mlp: gate (+ e_score_correction_bias), experts.E.gate/up/down_proj]");
    else if constexpr (K.router == moe_router::softmax_biased)
      t.add("  router softmax (fp32) + expert bias -> top ", known(s.top_k), " of ", known(s.experts),
            ", unbiased scores renormalised  [mlp: gate, moe_statics.e_score_correction_bias, experts.E.gate/up/down_proj]");
    else
      t.add("  router softmax -> top ", known(s.top_k), " of ", known(s.experts),
            s.norm_topk.is_static() && s.norm_topk.get() ? ", renormalised" : "",
            mixtral ? "  [block_sparse_moe: gate, experts.E.w1/w3/w2]"
            : K.names == moe_names::hunyuan ? (K.fp32_router ? " (fp32)  [mlp: gate.wg, experts.E.gate/up/down_proj]"
                                                             : "  [mlp: gate.wg, experts.E.gate/up/down_proj]")
                                            : "  [mlp: gate, experts.E.gate/up/down_proj]");
    if (K.shared_expert) t.add("; + sigmoid(gate(x)) * shared gated_mlp  [mlp: shared_expert, shared_expert_gate]");
    if (K.shared_experts && !(s.shared_expert_ffn.is_static() && s.shared_expert_ffn.get() == 0))
      t.add("; + shared experts' gated_mlp  [mlp: shared_experts]");
    if (K.names == moe_names::hunyuan) t.add("; + shared gated_mlp  [mlp: shared_mlp]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module(mixtral ? "block_sparse_moe" : llama4 ? "feed_forward" : "mlp");
    static_assert(llama4 == (K.router == moe_router::sigmoid_on_input) && (!llama4 || (!K.shared_expert && !K.shared_experts && !K.fp32_router)),
                  "megadsl: Llama 4's mixture is its router on the experts' input with its own ungated shared expert");
    static_assert(!(K.shared_expert && K.shared_experts), "megadsl: a mixture has Qwen's gated shared expert or DeepSeek's shared experts, not both");
    static_assert(!(K.names == moe_names::hunyuan && (K.shared_expert || K.shared_experts)),
                  "megadsl: HunYuan's names include its ungated shared MLP (mlp.shared_mlp); set no other shared expert");
    static_assert(!gpt_oss || (!K.shared_expert && !K.shared_experts && K.router == moe_router::softmax && !K.fp32_router),
                  "megadsl: gpt-oss's mixture is its softmax router with a bias and no shared expert");
    static_assert((K.names == moe_names::ernie) == (K.router == moe_router::softmax_biased) &&
                      (K.router != moe_router::softmax_biased || K.fp32_router),
                  "megadsl: ERNIE 4.5's names hold its biased softmax router, whose logits are in fp32");
    b.param(at, {"router.weight", shard_kind::replicated,
                 {K.names == moe_names::hunyuan ? "gate.wg.weight" : gpt_oss || llama4 ? "router.weight" : "gate.weight"}, 1,
                 extent::experts, presence::always, false, true});
    if constexpr (gpt_oss)  // applied on every tp rank alike: replicated, its gradient partial over tp like the weight's
      b.param(at, {"router.bias", shard_kind::replicated, {"router.bias"}, 1, extent::expert_vector, presence::always,
                   false, true});
    // The expert bias selects, never weighs: no gradient reaches it (zero, and no weight decay on a
    // vector, so AdamW leaves it as it is); the trainer's balancing update moves it (finalize_grads).
    if constexpr (K.router == moe_router::sigmoid_grouped)
      b.param(at, {"router.expert_bias", shard_kind::replicated, {"gate.e_score_correction_bias"}, 1, extent::expert_vector,
                   presence::always, false, false, param_init::zeros});
    if constexpr (K.router == moe_router::softmax_biased)  // (1, E) in HF's file
      b.param(at, {"router.expert_bias", shard_kind::replicated, {"moe_statics.e_score_correction_bias"}, 1,
                   extent::expert_vector, presence::always, false, false, param_init::zeros, false, nullptr, 0,
                   hf_form::one_row});
    if constexpr (gpt_oss) {
      // One tensor per layer and projection holds every expert (HF's stored layout, no converter):
      // gate_up_proj (E, h, 2 f) with gate and up columns interleaved, down_proj (E, f, h), and
      // their biases (E, 2 f) interleaved alike and (E, h). The down bias is added once (tp rank 0:
      // the experts' outputs are partial sums over tp), its gradient summed over tp.
      b.param(at, {"experts.{expert}.gate_up.weight", shard_kind::fused_gate_up, {"experts.gate_up_proj"}, 1,
                   extent::expert_ffn, presence::always, true, false, param_init::normal, true, nullptr, 0, hf_form::as_held,
                   hf_stacking::experts_interleaved});
      b.param(at, {"experts.{expert}.gate_up.bias", shard_kind::fused_gate_up, {"experts.gate_up_proj_bias"}, 1,
                   extent::expert_ffn, presence::always, true, false, param_init::zeros, true, nullptr, 0, hf_form::as_held,
                   hf_stacking::experts_interleaved});
      b.param(at, {"experts.{expert}.down.weight", shard_kind::row, {"experts.down_proj"}, 1, extent::expert_ffn,
                   presence::always, false, false, param_init::normal, true, nullptr, 0, hf_form::as_held, hf_stacking::experts});
      b.param(at, {"experts.{expert}.down.bias", shard_kind::replicated, {"experts.down_proj_bias"}, 1, extent::hidden,
                   presence::always, false, true, param_init::zeros, true, nullptr, 0, hf_form::as_held, hf_stacking::experts});
    } else if constexpr (llama4) {
      // Stacked like gpt-oss's, without biases: gate_up_proj (E, h, 2 f) with the gate's columns
      // first, then the up's; down_proj (E, f, h).
      b.param(at, {"experts.{expert}.gate_up.weight", shard_kind::fused_gate_up, {"experts.gate_up_proj"}, 1,
                   extent::expert_ffn, presence::always, true, false, param_init::normal, true, nullptr, 0, hf_form::as_held,
                   hf_stacking::experts});
      b.param(at, {"experts.{expert}.down.weight", shard_kind::row, {"experts.down_proj"}, 1, extent::expert_ffn,
                   presence::always, false, false, param_init::normal, true, nullptr, 0, hf_form::as_held, hf_stacking::experts});
      b.param(at, {"shared_expert.gate_up.weight", shard_kind::fused_gate_up,
                   {"shared_expert.gate_proj.weight", "shared_expert.up_proj.weight"}, 2, extent::shared_ffn});
      b.param(at, {"shared_expert.down.weight", shard_kind::row, {"shared_expert.down_proj.weight"}, 1, extent::shared_ffn});
    } else if constexpr (mixtral) {
      b.param(at, {"experts.{expert}.gate_up.weight", shard_kind::fused_gate_up,
                   {"experts.{expert}.w1.weight", "experts.{expert}.w3.weight"}, 2, extent::expert_ffn,
                   presence::always, false, false, param_init::normal, true});
      b.param(at, {"experts.{expert}.down.weight", shard_kind::row, {"experts.{expert}.w2.weight"}, 1, extent::expert_ffn,
                   presence::always, false, false, param_init::normal, true});
    } else {
      b.param(at, {"experts.{expert}.gate_up.weight", shard_kind::fused_gate_up,
                   {"experts.{expert}.gate_proj.weight", "experts.{expert}.up_proj.weight"}, 2, extent::expert_ffn,
                   presence::always, false, false, param_init::normal, true});
      b.param(at, {"experts.{expert}.down.weight", shard_kind::row, {"experts.{expert}.down_proj.weight"}, 1,
                   extent::expert_ffn, presence::always, false, false, param_init::normal, true});
    }
    if constexpr (K.shared_expert) {
      b.param(at, {"shared_expert.gate_up.weight", shard_kind::fused_gate_up,
                   {"shared_expert.gate_proj.weight", "shared_expert.up_proj.weight"}, 2, extent::shared_ffn});
      b.param(at, {"shared_expert.down.weight", shard_kind::row, {"shared_expert.down_proj.weight"}, 1, extent::shared_ffn});
      // Applied to the whole (gathered) input on every tp rank: replicated, its gradient partial
      // per tp rank (it scales the shared expert's partial sums).
      b.param(at, {"shared_expert_gate.weight", shard_kind::replicated, {"shared_expert_gate.weight"}, 1, extent::one_row,
                   presence::always, false, true});
    }
    if constexpr (K.names == moe_names::hunyuan) {  // the same rows under HunYuan's names, without a gate
      b.param(at, {"shared_expert.gate_up.weight", shard_kind::fused_gate_up,
                   {"shared_mlp.gate_proj.weight", "shared_mlp.up_proj.weight"}, 2, extent::shared_ffn});
      b.param(at, {"shared_expert.down.weight", shard_kind::row, {"shared_mlp.down_proj.weight"}, 1, extent::shared_ffn});
    }
    if constexpr (K.shared_experts) {  // the same rows under DeepSeek's names, without a gate; none at width 0
      b.param(at, {"shared_expert.gate_up.weight", shard_kind::fused_gate_up,
                   {"shared_experts.gate_proj.weight", "shared_experts.up_proj.weight"}, 2, extent::shared_ffn,
                   presence::shared_experts});
      b.param(at, {"shared_expert.down.weight", shard_kind::row, {"shared_experts.down_proj.weight"}, 1, extent::shared_ffn,
                   presence::shared_experts});
    }
    if constexpr (!gpt_oss) b.uses(A);  // gpt-oss's experts apply their clamped SwiGLU whatever hidden_act says
    b.routes = true;
    basic_text<64> name("moe_mlp<");
    // (ERNIE's names say its router: the two go together.)
    name.add(gpt_oss ? std::string_view("clamped_swiglu") : name_of(A),
             mixtral ? ", mixtral" : K.names == moe_names::hunyuan ? ", hunyuan" : gpt_oss ? ", gpt_oss" : llama4 ? ", llama4"
             : K.names == moe_names::ernie ? ", ernie" : ", qwen",
             K.shared_expert ? ", shared" : "",
             K.router == moe_router::sigmoid_grouped ? ", sigmoid_grouped" : K.router == moe_router::sigmoid_on_input ? ", sigmoid_on_input" : "",
             K.shared_experts ? ", shared_experts" : "",
             K.fp32_router ? ", fp32_router" : "", ">");
    basic_text<64> label("moe_mlp<");
    label.add(gpt_oss ? std::string_view("clamped_swiglu") : name_of(A), ">");
    // The dense MLP's estimate (the paper has no mixture): the experts' activations per token are
    // top_k of them, each narrower.
    return b.costs(b.node(at, &modules::moe_mlp, {}, name.view(), label.view(), &details,
                          static_cast<std::int64_t>(A) | (K.fp32_router ? modules::moe_fp32_router_bit : 0) |
                              (gpt_oss ? modules::moe_clamped_swiglu_bit : 0) | (llama4 ? modules::moe_input_router_bit : 0) |
                              (K.router == moe_router::softmax_biased ? modules::moe_biased_softmax_bit : 0)),
                   mlp_keeps);
  }
};

// ---- the embedding --------------------------------------------------------------------------------

// Vocab-parallel token embedding.
template <embed_scale_kind E = embed_scale_kind::none>
struct embedding {
  static constexpr int lower(arch_builder& b, const slot& at) {
    return b.leaf(at, std::array{block_param{"weight", shard_kind::vocab, {"weight"}, 1}}, &modules::embedding,
                  E == embed_scale_kind::sqrt_hidden ? "embedding<sqrt_hidden>" : "embedding",
                  E == embed_scale_kind::sqrt_hidden ? "embedding  (* sqrt(hidden))" : "embedding", nullptr,
                  E == embed_scale_kind::sqrt_hidden ? 1 : 0);
  }
};

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
// Llama's (and OLMo2's, NeoX's: the ones their forms have): the norm before a pre-norm layer's MLP
// is post_attention_layernorm.
inline constexpr norm_names llama_norm_names{"input_layernorm", "post_attention_layernorm", "post_attention_layernorm",
                                             "post_feedforward_layernorm"};
// Gemma 2's sandwich: a norm of its own before the MLP.
inline constexpr norm_names gemma2_norm_names{"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                              "post_feedforward_layernorm"};
// Apertus's pre-norm layer: attention_layernorm, feedforward_layernorm.
inline constexpr norm_names apertus_norm_names{"attention_layernorm", "", "feedforward_layernorm", ""};
// GLM-4's sandwich: its post_attention_layernorm is the norm before the MLP.
inline constexpr norm_names glm4_norm_names{"input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
                                            "post_mlp_layernorm"};

template <residual_kind R, class Norm, class Inner, const norm_names& Names = llama_norm_names>
struct residual {
  static constexpr residual_kind kind = R;
  using inner = Inner;

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
    const std::string_view name = R == residual_kind::pre_norm ? "pre_norm" : R == residual_kind::post_norm ? "post_norm"
                                  : R == residual_kind::sandwich ? "sandwich" : "parallel";
    if constexpr (R == residual_kind::sandwich) {
      const int n2 = lower_block<Norm>(b, at.sub(norm_name(at.at, true), hf_post(at.at)));
      b.hide(n2);
      label.add(", ", hf_post(at.at), "]");
      return b.node(at, &modules::sandwich, {n, inner_node, n2}, name, label.view());
    } else {
      label.append("]");
      return b.node(at, R == residual_kind::pre_norm ? &modules::pre_norm : R == residual_kind::post_norm ? &modules::post_norm
                                                                                                           : &modules::branch,
                    {n, inner_node}, name, label.view());
    }
  }
};

// x + inner(norm(x)) (Llama; Apertus under apertus_norm_names).
template <class Norm, class Inner, const norm_names& Names = llama_norm_names>
struct pre_norm : residual<residual_kind::pre_norm, Norm, Inner, Names> {};
// x + norm(inner(x)): the norm on the sublayer's output, before the residual add (OLMo2).
template <class Norm, class Inner>
struct post_norm : residual<residual_kind::post_norm, Norm, Inner> {};
// x + norm(inner(norm(x))), two norms of their own (Gemma2: input_layernorm and
// post_attention_layernorm around attention, pre_/post_feedforward_layernorm around the MLP; GLM-4
// names them glm4_norm_names).
template <class Norm, class Inner, const norm_names& Names = gemma2_norm_names>
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

// ---- the decoder's layers: one block, or several kinds -------------------------------------------

// Layer i has Layers[i % n] (alternating sliding/full attention, interleaved MoE, ...).
template <class... Layers>
struct pattern {};
// Layers 0 .. K-1 have First, the rest Rest (DeepSeek's first dense layers, with K static).
template <std::int64_t K, class First, class Rest>
struct first_k {};
// Layer i has Layers[Pick(shape, i)]: a choice read from the shape's config numbers (Qwen's
// decoder_sparse_step and mlp_only_layers), so that config.json decides which layer has which.
template <auto Pick, class... Layers>
struct select {};

namespace detail {
template <int N>
constexpr int cycle(const shape&, std::int64_t layer) { return static_cast<int>(layer % N); }
template <std::int64_t K>
constexpr int first(const shape&, std::int64_t layer) { return layer < K ? 0 : 1; }

template <class G>
struct layer_group {  // one block on every layer
  using kinds = std::tuple<G>;
  static constexpr int (*pick)(const shape&, std::int64_t) = nullptr;
};
template <class... L>
struct layer_group<pattern<L...>> {
  using kinds = std::tuple<L...>;
  static constexpr int (*pick)(const shape&, std::int64_t) = &cycle<static_cast<int>(sizeof...(L))>;
};
template <std::int64_t K, class F, class R>
struct layer_group<first_k<K, F, R>> {
  using kinds = std::tuple<F, R>;
  static constexpr int (*pick)(const shape&, std::int64_t) = &first<K>;
};
template <auto Pick, class... L>
struct layer_group<select<Pick, L...>> {
  using kinds = std::tuple<L...>;
  static constexpr int (*pick)(const shape&, std::int64_t) = Pick;
};
}  // namespace detail

// Embedding, the layers, the final norm; the head (LM or value) comes from the model type
// (causal_lm / value_model), its rows declared here. `Names`: the HF names its checkpoints use.
template <class Embedding, class Layers, class FinalNorm, name_scheme Names = name_scheme::llama>
struct decoder {
  static constexpr bool neox = Names == name_scheme::gpt_neox;

  static constexpr arch_builder lower() {
    arch_builder b;
    slot outer{.scope = "", .names = Names};
    slot embed = outer.sub("embed", neox ? "gpt_neox.embed_in" : "model.embed_tokens");
    embed.where = placement::first_stage;
    b.embedding = lower_block<Embedding>(b, embed);

    b.hf_layers = basic_text<48>(neox ? "gpt_neox.layers." : "model.layers.");
    using group = detail::layer_group<Layers>;
    b.pick = group::pick;
    basic_text<384> kinds;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (([&] {
         slot layer{.scope = "layers.{layer}.", .where = placement::layer, .kinds = 1U << K, .names = Names};
         layer.hf = joined<96>(neox ? "gpt_neox.layers" : "model.layers", "{layer}");
         b.routes = false;
         const int first = b.node_count;
         const int root = lower_block<std::tuple_element_t<K, typename group::kinds>>(b, layer);
         b.kinds[K] = {root, b.routes, first, b.node_count - first};
         kinds.add(K == 0 ? "" : ", ", b.signature(root));
       }()),
       ...);
      b.kind_count = static_cast<int>(sizeof...(K));
    }(std::make_index_sequence<std::tuple_size_v<typename group::kinds>>{});
    static_assert(std::tuple_size_v<typename group::kinds> <= max_kinds, "megadsl: more kinds of layer than max_kinds (architecture.hpp)");

    slot final_norm = outer.sub("final_norm", neox ? "gpt_neox.final_layer_norm" : "model.norm");
    final_norm.where = placement::last_stage;
    b.final_norm = lower_block<FinalNorm>(b, final_norm);
    basic_text<160> final_label(b.label(b.final_norm));
    final_label.add("  [", neox ? "final_layer_norm" : "norm", "]");
    b.labels[static_cast<std::size_t>(b.final_norm)] = final_label;

    // Tied embeddings: the HF source is the embedding; on pp > 1 the last stage keeps a copy.
    slot lm = outer.sub("lm_head", neox ? "embed_out" : "lm_head");
    lm.where = placement::last_stage;
    b.param(lm, {"weight", shard_kind::vocab, {"weight"}, 1, extent::none, presence::actor});
    // GPTNeoXForTokenClassification names its head `classifier`, every other class `score`.
    slot value = outer.sub("value_head", neox ? "classifier" : "score");
    value.where = placement::last_stage;
    b.param(value, {"weight", shard_kind::replicated, {"weight"}, 1, extent::none, presence::critic});
    b.param(value, {"bias", shard_kind::replicated, {"bias"}, 1, extent::none, presence::critic_bias});

    b.name.add("decoder(", b.signature(b.embedding), ", ", std::tuple_size_v<typename group::kinds> > 1 ? "layers(" : "",
               kinds.view(), std::tuple_size_v<typename group::kinds> > 1 ? ")" : "", ", ", b.signature(b.final_norm),
               neox ? ", gpt_neox names)" : ")");
    return b;
  }
};

// ---- binding: the builder's texts as the architecture's rows and nodes ----------------------------

struct bound_tables {
  std::array<param_row, max_rows> rows{};
  std::array<module_node, max_nodes> nodes{};
};
constexpr bound_tables bind(const arch_builder& b) {
  bound_tables t;
  for (int i = 0; i < b.row_count; ++i) {
    const auto u = static_cast<std::size_t>(i);
    t.rows[u] = b.rows[u];
    t.rows[u].name = b.texts[u].name.view();
    for (int k = 0; k < b.rows[u].hf_count; ++k) t.rows[u].hf[static_cast<std::size_t>(k)] = b.texts[u].hf[static_cast<std::size_t>(k)].view();
  }
  for (int i = 0; i < b.node_count; ++i) {
    const auto u = static_cast<std::size_t>(i);
    t.nodes[u] = b.nodes[u];
    t.nodes[u].prefix = b.prefixes[u].view();
    t.nodes[u].label = b.labels[u].view();
  }
  return t;
}

template <class Composition>
struct lowered {
  static_assert(requires { Composition::lower(); },
                "megadsl: not a composition: write decoder<embedding<...>, block<pre_norm<rms_norm<...>, attention<...>>, "
                "pre_norm<rms_norm<...>, gated_mlp<...>>>, rms_norm<...>> (layers/blocks.hpp)");
  static constexpr arch_builder built = Composition::lower();
  static constexpr bound_tables tables = bind(built);
};

// ---- block rules ----------------------------------------------------------------------------------

constexpr void concatenated_qkv_rule(const shape& s, const layout&, violations& out) {
  if (s.qkv_bias.is_static() && s.qkv_bias.get())
    out.add("concatenated_qkv_has_no_bias")
        .add("qkv_bias = true with q/k/v stored concatenated (qkv_proj), which has no bias tensor in HF; "
             "use separate storage (attention<>) or qkv_bias = false");
}
constexpr void interleaved_qkv_rule(const shape& s, const layout&, violations& out) {
  if (megadsl::detail::known(s.heads, s.kv_heads) && s.heads.get() != s.kv_heads.get())
    out.add("interleaved_qkv_needs_kv_heads_equal_heads", {s.heads.get(), s.kv_heads.get()})
        .add("kv_heads = ", s.kv_heads.get(), " with heads = ", s.heads.get(),
             ": query_key_value holds one [q; k; v] triple per head; use kv_heads = ", s.heads.get());
}
constexpr void qk_norm_after_rope_rule(const shape& s, const layout&, violations& out) {
  // RoPE on pairs leaves each head's dims as halves (apply_rope): a norm's per-dim weights after it
  // would meet other dims than HF's.
  if (s.rope_interleave.is_static() && s.rope_interleave.get())
    out.add("qk_norm_after_rope_needs_halves")
        .add("rope_interleave: q/k norms after RoPE on interleaved pairs are not supported; rotate halves");
}
constexpr void gated_delta_net_rule(const shape& s, const layout& l, violations& out) {
  if (!megadsl::detail::known(s.linear_key_heads, s.linear_value_heads, s.linear_key_dim, s.linear_value_dim,
                              s.linear_conv_kernel))
    return;
  const std::int64_t nk = s.linear_key_heads.get(), nv = s.linear_value_heads.get();
  if (nk < 1 || nv < 1 || s.linear_key_dim.get() < 1 || s.linear_value_dim.get() < 1 || s.linear_conv_kernel.get() < 1) {
    out.add("positive_sizes", {nk, nv})
        .add("linear_num_key_heads = ", nk, ", linear_num_value_heads = ", nv, ": the gated DeltaNet needs every head "
             "count, head dim and the conv kernel >= 1");
    return;
  }
  if (nv % nk != 0)
    out.add("linear_value_heads_per_key_head", {nv, nk})
        .add("linear_num_value_heads = ", nv, " is not a multiple of linear_num_key_heads = ", nk,
             ": each key head serves a whole number of value heads");
  if (l.tp.is_static() && l.tp.get() > 0 && nk % l.tp.get() != 0)
    out.add("linear_heads_divisible_by_tp", {nk, l.tp.get()})
        .add("linear_num_key_heads = ", nk, " is not divisible by tp = ", l.tp.get(),
             ": each tp rank takes whole key heads of the gated DeltaNet with their value heads");
  else if (l.tp.is_static() && l.cp.is_static() && l.tp.get() > 0 && l.cp.get() > 1 && nk % (l.tp.get() * l.cp.get()) != 0)
    out.add("cp_splits_heads", {nk, l.tp.get(), l.cp.get()})
        .add("linear_num_key_heads = ", nk, " is not divisible by tp x cp = ", l.tp.get() * l.cp.get(),
             ": under context parallelism each cp rank runs the gated delta rule over whole sequences for an equal "
             "share of its tp rank's key heads (Ulysses)");
}
constexpr void mla_rule(const shape& s, const layout& l, violations& out) {
  if (s.attention_multiplier.is_static() && s.attention_multiplier.get() != 0)
    out.add("mla_has_its_own_scale")
        .add("attention_multiplier is set: multi-head latent attention scales its scores by its own YaRN-adjusted "
             "softmax scale; leave attention_multiplier at 0");
  if (megadsl::detail::known(s.kv_lora_rank, s.qk_nope_dim, s.v_head_dim) &&
      (s.kv_lora_rank.get() < 1 || s.qk_nope_dim.get() < 0 || s.v_head_dim.get() < 1))
    out.add("positive_sizes", {s.kv_lora_rank.get(), s.v_head_dim.get()})
        .add("kv_lora_rank = ", s.kv_lora_rank.get(), " and v_head_dim = ", s.v_head_dim.get(),
             ": multi-head latent attention needs both >= 1 (and qk_nope_head_dim >= 0)");
}
constexpr void full_width_qk_norm_rule(const shape& s, const layout& l, violations& out) {
  if (!l.tp.is_static() || l.tp.get() < 1 || !s.kv_heads.is_static() || s.kv_heads.get() < 1) return;
  const std::int64_t kv = s.kv_heads.get(), tp = l.tp.get();
  if (kv >= tp) return;
  text& m = out.add("full_width_qk_norm_needs_kv_heads_per_rank", {kv, tp});
  m.add("the k norm spans all ", kv, " kv heads, and tp = ", tp,
        " would replicate them (kv_heads < tp), which this norm's tp split does not support; valid tp: ");
  bool first = true;
  for (std::int64_t t = 1; t <= kv; ++t)
    if (kv % t == 0 && (!s.heads.is_static() || s.heads.get() < 1 || s.heads.get() % t == 0)) {
      m.add(first ? "" : ", ", t);
      first = false;
    }
}

}  // namespace megadsl::blocks

namespace megadsl {

// The architecture a composition lowers to (architecture.hpp): one object per composition type,
// so two families of one composition (Llama, Mistral, Qwen2) share it.
template <class Composition>
inline constexpr architecture architecture_of{
    blocks::lowered<Composition>::built.name.view(),
    std::span<const param_row>(blocks::lowered<Composition>::tables.rows.data(),
                               static_cast<std::size_t>(blocks::lowered<Composition>::built.row_count)),
    std::span<const module_node>(blocks::lowered<Composition>::tables.nodes.data(),
                                 static_cast<std::size_t>(blocks::lowered<Composition>::built.node_count)),
    std::span<const layer_kind>(blocks::lowered<Composition>::built.kinds.data(),
                                static_cast<std::size_t>(blocks::lowered<Composition>::built.kind_count)),
    blocks::lowered<Composition>::built.pick,
    blocks::lowered<Composition>::built.embedding,
    blocks::lowered<Composition>::built.final_norm,
    std::span<const block_rule>(blocks::lowered<Composition>::built.rules.data(),
                                static_cast<std::size_t>(blocks::lowered<Composition>::built.rule_count)),
    blocks::lowered<Composition>::built.hf_layers.view(),
    blocks::lowered<Composition>::built.act,
    blocks::lowered<Composition>::built.has_act};

constexpr shape with_architecture(shape s, const architecture* a) {
  s.arch = a;
  return s;
}

// A family: a composition of blocks applied to a shape. Derive a struct from it (the struct's name
// is what diagnostics print) and give it `family` and `name`.
template <class Composition, shape S>
struct decoder_family {
  static_assert(S.arch == nullptr || S.arch == &architecture_of<Composition>,
                "megadsl: the shape names another architecture than its family's composition; leave `arch` out of the shape");
  using composition = Composition;
  static constexpr megadsl::shape shape = with_architecture(S, &architecture_of<Composition>);
};

// The families' compositions live with their presets, one header each (models/<family>.hpp).

}  // namespace megadsl
