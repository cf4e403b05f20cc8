// The vocabulary every block is written in: the slot a block is lowered at, the architecture
// builder, the shared enums and the block concepts.
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

inline constexpr int max_nodes = 64, max_rules = 8;  // (max_rows, max_kinds: architecture.hpp)

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

// The HF tensor names of a family's checkpoints outside its blocks' modules, bound by the family
// (the decoder's fourth argument): LlamaForCausalLM's by default (model.embed_tokens,
// model.layers.N., model.norm, lm_head, score); a family whose checkpoints name them otherwise
// declares its own (models/gpt_neox.hpp).
struct decoder_names {
  std::string_view layers = "model.layers";           // <layers>.{layer}.<block's module>
  std::string_view embedding = "model.embed_tokens";
  std::string_view final_norm = "model.norm";
  std::string_view lm_head = "lm_head";
  std::string_view value_head = "score";               // the critic's (…ForTokenClassification's)
  std::string_view signature = {};                     // in the architecture's name, which checkpoints record
};
inline constexpr decoder_names hf_default_names{};

// Where a block sits: the prefix of its parameters' megadsl names (within `scope`: a layer's
// `layers.{layer}.` or the model's ""), its HF module, its placement and the layer kinds having it.
struct slot {
  std::string_view scope;
  basic_text<48> name;
  basic_text<96> hf;
  placement where = placement::layer;
  std::uint32_t kinds = 0;
  sublayer at = sublayer::none;
  const decoder_names* names = &hf_default_names;

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
  // The text arrays are default-initialised (each element by its own member initialisers), not
  // value-initialised with {}: GCC 13 then reads an element never assigned (a mixture's router's
  // signature) as "<anonymous>" out of its lifetime and rejects the constant expression.
  std::array<row_text, max_rows> texts;
  std::array<param_row, max_rows> rows{};
  int row_count = 0;
  std::array<basic_text<48>, max_nodes> prefixes;
  std::array<basic_text<160>, max_nodes> labels;
  std::array<basic_text<384>, max_nodes> signatures;
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
  std::array<config_setting, max_settings> settings{};
  int setting_count = 0;
  int logit_scale = -1;  // architecture.hpp's
  bool logit_divides = false;

  // A config.json key the block reads itself (architecture.hpp's config_setting): once, however
  // many layers have the block; two blocks declaring one key must declare it alike.
  // Its index in the architecture's settings.
  constexpr int setting(const config_setting& c) {
    for (int i = 0; i < setting_count; ++i)
      if (settings[static_cast<std::size_t>(i)].key == c.key) {
        if (!settings[static_cast<std::size_t>(i)].same_value_as(c)) throw "megadsl: two blocks declare one config key differently";
        return i;
      }
    if (setting_count == max_settings) throw "megadsl: the composition declares more config settings than max_settings (shape.hpp)";
    if (c.key.empty() || c.key.size() >= max_setting_key) throw "megadsl: a config setting's key is empty or longer than max_setting_key (shape.hpp)";
    settings[static_cast<std::size_t>(setting_count)] = c;
    return setting_count++;
  }

  // A parameter of the block at `at`. The same parameter in several kinds of layer is one row.
  constexpr void param(const slot& at, const block_param& p) {
    if (p.geometry == nullptr) throw "megadsl: a block parameter states no geometry (geometry.hpp)";
    row_text t;
    t.name = basic_text<80>(at.scope);  // "layers.{layer}." or ""
    t.name.append(joined<80>(at.name.view(), p.name).view());
    for (int i = 0; i < p.hf_count; ++i) t.hf[static_cast<std::size_t>(i)] = joined<112>(at.hf.view(), p.hf[static_cast<std::size_t>(i)]);
    for (int i = 0; i < row_count; ++i) {
      const auto u = static_cast<std::size_t>(i);
      if (texts[u].name.view() != t.name.view()) continue;
      if (texts[u].hf[0].view() != t.hf[0].view() || rows[u].geometry != p.geometry)
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
    rows[u] = param_row{{}, p.geometry, p.per_expert ? placement::expert : at.where, p.when, {}, p.hf_count,
                        p.concatenated, p.grad_partial_over_tp, p.init, at.kinds, p.init_value, p.form, p.stacking,
                        p.when_key};
  }

  // The block's module: its factory, the blocks it wraps, its `describe` line (label + details) and
  // its short name in the architecture's signature.
  constexpr int node(const slot& at, module_factory make, std::initializer_list<int> children, std::string_view name,
                     std::string_view label = {}, details_fn details = nullptr, knobs_ref knobs = {}) {
    if (node_count == max_nodes) throw "megadsl: the composition has more blocks than blocks::max_nodes";
    if (children.size() > 4) throw "megadsl: a block wraps at most four blocks";
    const auto u = static_cast<std::size_t>(node_count);
    module_node& n = nodes[u];
    n.make = make;
    n.knobs = knobs;
    n.details = details;
    prefixes[u] = at.name;
    labels[u] = basic_text<160>(label);
    basic_text<384>& sig = signatures[u];
    sig.append(name);
    // A child without a name of its own (a mixture's router) is named by its parent's name.
    int i = 0, named = 0;
    for (int c : children) {
      if (c < 0) continue;
      if (const std::string_view s = signatures[static_cast<std::size_t>(c)].view(); !s.empty())
        sig.add(named++ == 0 ? "(" : ", ", s);
      n.children[static_cast<std::size_t>(i++)] = static_cast<std::int16_t>(c);
    }
    n.child_count = i;
    if (named > 0) sig.append(")");
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
  // What it passes around the cp ring per row (architecture.hpp's module_node::ring_sent).
  constexpr int ring_traffic(int node, double (*f)(const shape&, std::int64_t tp)) {
    nodes[static_cast<std::size_t>(node)].ring_sent = f;
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
                     std::string_view label = {}, details_fn details = nullptr, knobs_ref knobs = {}) {
    for (const block_param& p : params) param(at, p);
    return node(at, make, {}, name, label.empty() ? name : label, details, knobs);
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

// Ulysses' traffic per token of a rank's own (elements, one forward): an all-to-all keeps 1/cp of
// what it moves and sends the rest; an all-gather sends the rank's rows to each of the cp - 1 others.
constexpr double all_to_all_share(std::int64_t cp) { return static_cast<double>(cp - 1) / static_cast<double>(cp); }

}  // namespace megadsl::blocks
