// What a family's composition of blocks lowers to (DESIGN decision 16): one constexpr value that
// the rest of megadsl reads and that names no block kind.
//
//   rows    every parameter the blocks declare, with its megadsl and HF names, shard geometry
//           (geometry.hpp), placement, init and the layer kinds that have it (the table the shard
//           plan, the loaders and savers, distributed checkpoints and the formulas iterate)
//   settings  the config.json keys the blocks read themselves (config_setting)
//   nodes   each block's run-time module: a factory compiled once in the block's own source
//           file, and the node indices of the blocks it wraps (the stage builds a layer by
//           walking its kind's tree: no switch over block kinds)
//   kinds   the distinct layers of the decoder (one, or a pattern or config-driven choice of
//           several) and `pick`, which layer has which
//   rules   the layout rules the blocks add (rules.hpp runs them with its own)
//
// A composition (layers/blocks.hpp) makes it with `architecture_of<Composition>`; a model's shape
// points at it (`shape::arch`); a model read from config.json gets its family's.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "megadsl/geometry.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/text.hpp"

namespace megadsl {

struct layout;
struct violations;
class block_module;
class block_build;

// When a declared row exists in a model: always, or per a config.json switch or the head. (Which
// blocks a model has is its architecture; these are the numbers config.json gives.)
enum class presence : std::int8_t {
  always,
  key_nonzero,  // where the block's own config key `when_key` is not 0 (MLA's q_a_proj: q_lora_rank)
  key_zero,     // where it is 0 (MLA's q_proj: q_lora_rank null)
  qkv_bias,     // the q/k/v biases (qkv_bias)
  out_bias,     // o_proj's and a plain MLP's biases (out_bias)
  mlp_bias,     // a gated MLP's gate/up/down biases (mlp_bias)
  shared_experts,  // DeepSeek's ungated shared experts, when shared_expert_ffn > 0 (ERNIE 4.5's may be none)
  actor, critic, critic_bias,
};

// Where a parameter lives: in the pipeline (first stage, its layer's stage, last stage), and for an
// expert's weights also in the expert-parallel group (the rank holding that expert).
enum class placement : std::int8_t { first_stage, layer, last_stage, expert };

// How a parameter starts when a model is built without a checkpoint.
enum class param_init : std::int8_t {
  normal,  // N(0, init_std)
  zeros,   // biases; a (1 + w) norm's weight
  ones,    // a norm's weight
  constant,  // the row's init_value (xIELU's scalars)
};

// How HF stores an expert's tensors: one per expert (nn.Linear's (out, in), named with {expert}),
// or every expert of the layer in one tensor (gpt-oss, Llama 4: (experts, in, out) or
// (experts, out), no {expert} in the name), its gate and up columns interleaved (gpt-oss's
// gate_up_proj: gate = [..., 0::2], up = [..., 1::2]) or not.
enum class hf_stacking : std::int8_t { none, experts, experts_interleaved };

// How HF's file holds a tensor megadsl holds in another form (reshaped where HF tensors are read
// and written: load_hf, save_hf, the export): as megadsl does; a 0-dim buffer megadsl holds as (1)
// (xIELU's beta and eps: fixed, not among HF's parameters, so parameter_count leaves it out); a
// depthwise nn.Conv1d's weight (rows, 1, cols) held as (rows, cols) (Qwen3-Next's conv1d); a
// vector stored as one row (1, n), held as (n) (ERNIE 4.5's moe_statics.e_score_correction_bias).
enum class hf_form : std::int8_t { as_held, scalar, conv, one_row };

// A parameter as a block declares it, relative to the block's slot: its name under the block's
// megadsl prefix, its shard geometry (geometry.hpp: its HF dims, the dim split over tp, its replica
// rule), its HF sources under the block's HF module (in fused-slot order).
struct block_param {
  std::string_view name;  // "weight", "qkv.weight", "experts.{expert}.down.weight"
  row_geometry_fn geometry;
  std::array<std::string_view, 3> hf;  // "q_proj.weight", ...
  int hf_count = 1;
  presence when = presence::always;
  bool concatenated = false;  // the sources are rows of the one HF tensor `hf[0]`, in source order
  // Replicated, but each tp rank's gradient is a partial sum (summed over tp): a per-head q/k norm
  // applied to each rank's own heads, a router or gate weighing outputs that are partial over tp.
  bool grad_partial_over_tp = false;
  param_init init = param_init::normal;
  bool per_expert = false;  // one copy per expert of its layer (placement::expert)
  double init_value = 0;    // param_init::constant's value
  hf_form form = hf_form::as_held;           // how HF's file holds it (a scalar, a conv, one row)
  hf_stacking stacking = hf_stacking::none;  // (per_expert rows) how HF stores the layer's experts
  std::string_view when_key{};  // presence::key_nonzero / key_zero: the block's config key (b.setting)
};

// A parameter of the model: a block's row bound at its slot. `{layer}` stands for the global
// layer index, `{expert}` for the expert's index in its layer.
struct param_row {
  std::string_view name;  // megadsl parameter name (checkpoint key of a distributed checkpoint)
  row_geometry_fn geometry;
  placement where;
  presence when;
  std::array<std::string_view, 3> hf;  // HF source names, in fused-slot order
  int hf_count;
  bool concatenated = false;
  bool grad_partial_over_tp = false;
  param_init init = param_init::normal;
  std::uint32_t layer_kinds = 0;  // layer rows: the kinds of layer that have it (bit k: kind k)
  double init_value = 0;          // (block_param::init_value)
  hf_form form = hf_form::as_held;           // (block_param::form)
  hf_stacking stacking = hf_stacking::none;  // (block_param::stacking)
  std::string_view when_key{};               // (block_param::when_key)
};

// The most parameter rows and kinds of layer one architecture holds (layers/blocks.hpp's builder
// checks them; the shard plan's lists are this long).
inline constexpr int max_rows = 64, max_kinds = 8;

// A bias (a vector added after its projection).
constexpr bool is_bias(const param_row& r) { return r.name.ends_with(".bias"); }
// The LM head (the actor's) and the value head (the critic's weight, its bias).
constexpr bool is_lm_head_row(const param_row& r) { return r.when == presence::actor; }

// A block's share of the activations a layer keeps for its backward (Korthikanti et al. 2022,
// Table 2), in units of s x b x h bytes (16-bit activations): `whole` is held whole on every tp
// rank without sequence parallelism, `split` is split over tp, `scores` is in units of
// s x b x h x (heads x s / h) (an attention's softmax and its dropout mask), split over tp and not
// kept under selective recompute. A norm keeps its input (2), attention 3 + 8 + 5 scores, an MLP
// 3 + 16: a pre-norm layer's 10 + 24 / t + 5as / (ht), the paper's.
// core: a recurrent rule's intermediates (the gated DeltaNet's chunked rule, in fp32 whatever the
// activations' dtype), per token like `split` and split over tp, and not kept under selective
// recompute, which runs the rule again in the backward.
struct activation_terms {
  double whole = 0, split = 0, scores = 0, core = 0;
};

// A token mixer's cost beyond its matrices that grows with the tokens, not with the sequence's
// square (module_node::per_token), per layer and token, forward + backward, as each convention
// counts it: Megatron's formula and verl's estimator. verl_weights: the weights verl's estimator
// counts for the block (6 FLOPs per token each), which for a layer holding such a block replace
// the attention's h (2 n d + 2 g d) in verl's figure.
struct token_flops {
  std::int64_t megatron = 0, verl = 0, verl_weights = 0;
};

// A block's run-time module factory, defined in the block's own source file (compiled once).
using module_factory = std::unique_ptr<block_module> (*)(const block_build&);

// A block's constexpr knobs as its node carries them to its module: the object (a template
// argument's, or a static member: both live for the program) and its type's name, which the module
// checks when it reads them as that type (block_build::knobs<T>()). Each knobs type names itself:
//   struct attention_knobs { static constexpr std::string_view knobs_name = "attention_knobs"; ... };
struct knobs_ref {
  const void* object = nullptr;
  std::string_view type;
};
template <class T>
constexpr knobs_ref knobs_of(const T& k) {
  return {&k, T::knobs_name};
}

// A block as the run-time builds it: its factory, the prefix of its parameters' layer-local names
// ("attn_norm", "" for the layer's own), the blocks it wraps, and its typed knobs (knobs_ref).
struct module_node {
  module_factory make = nullptr;
  std::string_view prefix;
  std::array<std::int16_t, 4> children{-1, -1, -1, -1};
  int child_count = 0;
  knobs_ref knobs;
  std::string_view label;  // its line in `describe` (empty: described by its parent)
  // Appends what the shape adds to the line (biases, top-k, soft-caps); may be null.
  void (*details)(const shape&, basic_text<256>&) = nullptr;
  // The block's FLOPs beyond its matrices' (2 x weight elements per token, which the formulas count
  // from its rows): its token-mixing scores, in units of heads x head_dim per layer, each costing
  // 2 x 2 x seq FLOPs per token forward (Megatron's 12 s L n d for forward + backward, non-causal).
  // Null: none.
  std::int64_t (*score_units)(const shape&) = nullptr;
  // Its per-token FLOPs that neither its matrices nor sequence-long scores account for (a
  // recurrent rule's: the gated DeltaNet's), per layer, and the weights verl's estimator counts for
  // it in place of an attention's (token_flops). Null: none, and verl counts an attention's.
  token_flops (*per_token)(const shape&) = nullptr;
  // What one rank sends over its cp group per token of its own in one forward under context
  // parallelism (Ulysses: the all-to-alls to whole sequences of a share of the heads and back, and
  // any all-gather), in elements, at the layout's tp and cp; the backward sends as much. Null:
  // nothing (a block that mixes no tokens).
  double (*cp_sent)(const shape&, std::int64_t tp, std::int64_t cp) = nullptr;
  // Under ring context parallelism: the k and v elements per row of its block that go around the
  // ring (its tp rank's heads at its own widths; dk and dv the same back). Null: it sends none.
  double (*ring_sent)(const shape&, std::int64_t tp) = nullptr;
  activation_terms keeps{};  // what it keeps for the backward
  // What it keeps when its own sizes decide it (the gated DeltaNet's heads and widths): replaces
  // `keeps`. Null: `keeps`.
  activation_terms (*keeps_of)(const shape&) = nullptr;
};

// One kind of decoder layer: the root of its module tree, its nodes (`first_node` and the
// `nodes` after it), and whether it routes tokens to experts (records top_k choices per token).
struct layer_kind {
  int root = -1;
  bool routes = false;
  int first_node = 0, nodes = 0;
};

// A layout rule a block adds: appends its violations (rules.hpp's `violations::add`).
using block_rule = void (*)(const shape&, const layout&, violations&);

// HF's MLP activations (`hidden_act`) a composition's MLPs apply.
// xielu: Apertus's xIELU, whose per-layer scalars its own block holds (blocks::xielu_mlp); the
// others are plain functions any MLP block applies (activation_fn_of).
enum class activation : std::int8_t { silu, gelu_tanh, gelu, xielu };
constexpr std::string_view name_of(activation a) {
  return a == activation::silu ? "silu" : a == activation::gelu_tanh ? "gelu_tanh" : a == activation::gelu ? "gelu" : "xielu";
}

// A config.json key a block reads itself (the block lists it in `lower`: b.setting(...)): the
// generic reader takes it from config.json (or an older spelling), checks it, and writes it back;
// the block's module (block_build::setting) and its rows' geometry (megadsl::setting) read the
// value. No family and no core file names it.
//   number, integer  a JSON number (an integer: whole); null is refused (the config classes would fail on it)
//   integer_or_null  an integer, or null for none (read as 0, written back as null; 0 is accepted
//                    whatever `least` says): MLA's q_lora_rank
//   flag             true or false
//   truthy           tested for truth as the config class's Python does: true/false, a number (0:
//                    false), null (false); written back as true or false
enum class setting_kind : std::int8_t { number, integer, flag, truthy, integer_or_null };
struct config_setting {
  std::string_view key;                     // config.json's key
  double fallback = 0;                      // its value where config.json is silent (the config class's default)
  setting_kind kind = setting_kind::number;
  double least = -1e308, most = 1e308;      // the values it accepts; others are refused, naming the key
  std::string_view meaning;                 // what it does (for messages and `describe`)
  std::array<std::string_view, 2> also{};   // other spellings it is read under (an older transformers')
  // What two declarations of one key must agree on. (Not the texts: g++ 12 refuses to read a
  // constexpr object's string_views beside its key in a constant expression, "modification of ...
  // is not a constant expression".)
  constexpr bool same_value_as(const config_setting& o) const {
    return key == o.key && fallback == o.fallback && kind == o.kind && least == o.least && most == o.most;
  }
  // Whether the key takes `v` (its range; an integer_or_null's 0, its none).
  constexpr bool accepts(double v) const { return (kind == setting_kind::integer_or_null && v == 0) || (v >= least && v <= most); }
};

struct architecture {
  std::string_view name;  // the composition, for messages and checkpoint metadata
  std::span<const param_row> rows;
  std::span<const module_node> nodes;
  std::span<const layer_kind> kinds;
  // The kind of layer `layer` (null: every layer is kind 0). Reads only config numbers of the shape.
  int (*pick)(const shape&, std::int64_t layer) = nullptr;
  int embedding = -1, final_norm = -1;  // their nodes
  std::span<const block_rule> rules;
  std::string_view hf_layers;  // HF's prefix of the layers' names: "model.layers."
  activation act = activation::silu;  // the MLPs' activation (config.json's hidden_act)
  bool has_act = false;
  std::span<const config_setting> settings{};  // the blocks' own config keys, in declaration order
  // The LM head's logits scaled by a config key (blocks::lm_head: Cohere's logit_scale times,
  // Granite's logits_scaling divided by): its index in `settings`; -1: unscaled.
  int logit_scale = -1;
  bool logit_divides = false;
};

// The architecture of a shape: its family's, or config.json's model_type's once resolved. Read
// before that, it is a dynamic value: constant evaluation fails, and at run time
// `unresolved_value` is thrown, as for any other field.
constexpr const architecture& arch_of(const shape& s) {
  if (s.arch == nullptr) throw unresolved_value{};
  return *s.arch;
}

// The kind of layer `layer`.
constexpr int kind_of_layer(const shape& s, std::int64_t layer) {
  const architecture& a = arch_of(s);
  return a.pick == nullptr ? 0 : a.pick(s, layer);
}
// Whether layer `layer` routes its tokens to experts.
constexpr bool layer_routes(const shape& s, std::int64_t layer) {
  return arch_of(s).kinds[static_cast<std::size_t>(kind_of_layer(s, layer))].routes;
}
// Whether some kind of layer routes (a mixture of experts): the model records routing.
constexpr bool routes_any(const shape& s) {
  for (const layer_kind& k : arch_of(s).kinds)
    if (k.routes) return true;
  return false;
}
// Layers that route.
constexpr std::int64_t routed_layers(const shape& s) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < s.layers.get(); ++i) n += layer_routes(s, i);
  return n;
}
// Whether every layer routes (the published Mixtral, Qwen-MoE and Qwen3-MoE checkpoints).
constexpr bool every_layer_routes(const shape& s) { return routes_any(s) && routed_layers(s) == s.layers.get(); }
// The score units (module_node::score_units) of every layer, summed: L n d for a decoder whose
// every layer attends with n heads of d.
constexpr std::int64_t score_units(const shape& s) {
  const architecture& a = arch_of(s);
  std::int64_t per_kind[max_kinds]{};
  for (std::size_t k = 0; k < a.kinds.size(); ++k)
    for (int n = a.kinds[k].first_node; n < a.kinds[k].first_node + a.kinds[k].nodes; ++n)
      if (const auto f = a.nodes[static_cast<std::size_t>(n)].score_units; f != nullptr) per_kind[k] += f(s);
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < s.layers.get(); ++i) total += per_kind[kind_of_layer(s, i)];
  return total;
}

// The per-token costs (module_node::per_token) of layer `layer`'s blocks, summed, and whether
// any of its blocks declares one.
constexpr std::pair<token_flops, bool> layer_token_flops(const shape& s, std::int64_t layer) {
  const architecture& a = arch_of(s);
  const layer_kind& k = a.kinds[static_cast<std::size_t>(kind_of_layer(s, layer))];
  token_flops t;
  bool any = false;
  for (int n = k.first_node; n < k.first_node + k.nodes; ++n)
    if (const auto f = a.nodes[static_cast<std::size_t>(n)].per_token; f != nullptr) {
      const token_flops b = f(s);
      t.megatron += b.megatron;
      t.verl += b.verl;
      t.verl_weights += b.verl_weights;
      any = true;
    }
  return {t, any};
}

// The k and v elements per row layer `layer` passes around the cp ring (module_node::ring_sent,
// summed over its blocks).
constexpr double layer_ring_sent(const shape& s, std::int64_t layer, std::int64_t tp) {
  const architecture& a = arch_of(s);
  const layer_kind& k = a.kinds[static_cast<std::size_t>(kind_of_layer(s, layer))];
  double sent = 0;
  for (int n = k.first_node; n < k.first_node + k.nodes; ++n)
    if (const auto f = a.nodes[static_cast<std::size_t>(n)].ring_sent; f != nullptr) sent += f(s, tp);
  return sent;
}

// The elements one rank sends over cp per token of its own in one forward of layer `layer`
// (module_node::cp_sent, summed over its blocks).
constexpr double layer_cp_sent(const shape& s, std::int64_t layer, std::int64_t tp, std::int64_t cp) {
  const architecture& a = arch_of(s);
  const layer_kind& k = a.kinds[static_cast<std::size_t>(kind_of_layer(s, layer))];
  double sent = 0;
  for (int n = k.first_node; n < k.first_node + k.nodes; ++n)
    if (const auto f = a.nodes[static_cast<std::size_t>(n)].cp_sent; f != nullptr) sent += f(s, tp, cp);
  return sent;
}

// The activations layer `layer` keeps: its blocks' terms summed.
constexpr activation_terms layer_activation_terms(const shape& s, std::int64_t layer) {
  const architecture& a = arch_of(s);
  const layer_kind& k = a.kinds[static_cast<std::size_t>(kind_of_layer(s, layer))];
  activation_terms t;
  for (int n = k.first_node; n < k.first_node + k.nodes; ++n) {
    const module_node& node = a.nodes[static_cast<std::size_t>(n)];
    const activation_terms b = node.keeps_of != nullptr ? node.keeps_of(s) : node.keeps;
    t.whole += b.whole;
    t.split += b.split;
    t.scores += b.scores;
    t.core += b.core;
  }
  return t;
}

// Whether the architecture declares a row of geometry `g` (a shared expert's down projection, a
// router's expert bias, ...).
constexpr bool has_geometry(const shape& s, row_geometry_fn g) {
  for (const param_row& r : arch_of(s).rows)
    if (r.geometry == g) return true;
  return false;
}
// Whether the composition has a shared expert (its rows are sized by shared_expert_ffn).
constexpr bool has_shared_expert(const shape& s) { return has_geometry(s, &geo::down<&geo::shared_ffn>); }
// Whether the composition's shared expert is always there (Qwen's, HunYuan's, Llama 4's), not only
// when shared_expert_ffn > 0 (DeepSeek's ungated shared experts: presence::shared_experts).
constexpr bool shared_ffn_required(const shape& s) {
  for (const param_row& r : arch_of(s).rows)
    if (r.geometry == &geo::down<&geo::shared_ffn> && r.when == presence::always) return true;
  return false;
}
// The index of the architecture's setting `key` (config_setting), or -1.
constexpr int setting_index(const architecture& a, std::string_view key) {
  for (std::size_t i = 0; i < a.settings.size(); ++i)
    if (a.settings[i].key == key) return static_cast<int>(i);
  return -1;
}
// The value of the blocks' config setting `key` in this model: config.json's (or the
// declaration's), else the setting's default.
constexpr double setting(const shape& s, std::string_view key) {
  const architecture& a = arch_of(s);
  const int i = setting_index(a, key);
  if (i < 0) throw "megadsl: no block of the composition declares this config setting (b.setting in its lower)";
  if (const double* v = s.settings.find(key)) return *v;
  return a.settings[static_cast<std::size_t>(i)].fallback;
}
// The first key the shape gives that no block of its composition declares, or "".
constexpr std::string_view undeclared_setting(const shape& s) {
  if (s.arch == nullptr) return {};
  for (int i = 0; i < s.settings.count; ++i)
    if (const std::string_view key = s.settings.given[static_cast<std::size_t>(i)].name(); setting_index(*s.arch, key) < 0)
      return key;
  return {};
}

// The row named `name`, or nullptr.
constexpr const param_row* find_row(const architecture& a, std::string_view name) {
  for (const param_row& r : a.rows)
    if (r.name == name) return &r;
  return nullptr;
}

// The composition as an indented tree (`megadsl describe`): each block's line, and which layers
// have each kind of layer. Sizes the shape does not know yet print as -1.
constexpr basic_text<4096> composition_tree(const shape& s) {
  const architecture& a = arch_of(s);
  basic_text<4096> t;
  auto print = [&](int node, int depth, auto& self) -> void {
    const module_node& n = a.nodes[static_cast<std::size_t>(node)];
    int below = depth;
    if (!n.label.empty()) {
      for (int i = 0; i < depth; ++i) t.append("  ");
      t.append(n.label);
      if (n.details != nullptr) {
        basic_text<256> more;
        n.details(s, more);
        t.append(more.view());
      }
      t.append("\n");
      below = depth + 1;
    }
    for (int c = 0; c < n.child_count; ++c) self(n.children[static_cast<std::size_t>(c)], below, self);
  };
  t.append("decoder\n");
  print(a.embedding, 1, print);
  const bool known = s.layers.is_static();
  for (std::size_t k = 0; k < a.kinds.size(); ++k) {
    std::int64_t count = -1;
    basic_text<128> which;
    if (known) {
      count = 0;
      for (std::int64_t i = 0; i < s.layers.get(); ++i)
        if (kind_of_layer(s, i) == static_cast<int>(k)) {
          if (count < 12) which.add(count == 0 ? "" : ", ", i);
          else if (count == 12) which.append(", ...");
          ++count;
        }
      if (count == 0) continue;  // a kind this model's config gives no layer
    }
    if (a.kinds.size() > 1) t.add("  kind ", static_cast<std::int64_t>(k), ":");
    t.add("  block x ", count);
    if (a.kinds.size() > 1 && known) t.add(" (layers ", which.view(), ")");
    t.append("\n");
    print(a.kinds[k].root, 2, print);
  }
  print(a.final_norm, 1, print);
  if (s.final_softcap.is_static() && s.final_softcap.get() != 0) t.append("  lm head: tanh soft-cap of the logits\n");
  if (a.logit_scale >= 0) {
    const std::string_view key = a.settings[static_cast<std::size_t>(a.logit_scale)].key;
    t.add("  lm head: logits ", a.logit_divides ? "/ " : "x ", key);
    if (!s.settings.dynamic) t.add(" (", setting(s, key), ")");
    t.append("\n");
  }
  return t;
}

// Names a critic accepts for its value head when loading (DESIGN §7), in order of preference.
// `lm_head.weight` counts only with shape (1, h).
inline constexpr std::array<std::string_view, 6> value_head_sources{
    {"score", "classifier", "v_head", "value_head", "reward_head", "lm_head"}};

}  // namespace megadsl
