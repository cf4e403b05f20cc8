// The decoder: embedding, layers of one or several kinds (pattern, first_k, select), final norm.
#pragma once

#include "megadsl/blocks/lm_head.hpp"
#include "megadsl/blocks/residuals.hpp"

namespace megadsl::blocks {

// ---- the decoder's layers: one block, or several kinds -------------------------------------------

// Layer i has Layers[i % n] (alternating sliding/full attention, interleaved MoE, ...).
template <class... Layers>
struct pattern {};
// Layers 0 .. K-1 have First, the rest Rest (DeepSeek's first dense layers, with K static).
template <std::int64_t K, class First, class Rest>
struct first_k {};
// Layer i has Layers[Pick(shape, i)]: a choice read from the shape's config numbers (Qwen's
// decoder_sparse_step and mlp_only_layers), so that config.json decides which layer has which.
// Pick is the function, or a layer_choice that also declares config keys the choice reads itself
// (select<&llama4_choice, ...>: Llama 4's use_qk_norm picks the attention with or without the norm).
template <auto Pick, class... Layers>
struct select {};
struct layer_choice {
  int (*pick)(const shape&, std::int64_t);
  std::span<const config_setting> settings;  // read by the generic reader, as any block's (b.setting)
};

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
  static constexpr bool with_keys = std::is_same_v<decltype(Pick), const layer_choice*>;
  static constexpr int (*pick)(const shape&, std::int64_t) = [] {
    if constexpr (with_keys) return Pick->pick;
    else return Pick;
  }();
  static constexpr std::span<const config_setting> settings = [] {
    if constexpr (with_keys) return Pick->settings;
    else return std::span<const config_setting>{};
  }();
};
}  // namespace detail

// Embedding, the layers, the final norm, the heads (LM or value, chosen by the model type:
// causal_lm / value_model; lm_head.hpp). `Names`: the HF names its checkpoints use for the
// decoder's own tensors (builder.hpp's decoder_names). The name (an architecture's, which
// checkpoints record) does not spell the head: its scale is in `describe`.
template <class Embedding, class Layers, class FinalNorm, const decoder_names& Names = hf_default_names, class Head = lm_head<>>
struct decoder {
  // The last part of an HF name ("model.norm": "norm").
  static constexpr std::string_view leaf(std::string_view n) { return n.substr(n.rfind('.') + 1); }

  static constexpr arch_builder lower() {
    arch_builder b;
    slot outer{.scope = "", .names = &Names};
    slot embed = outer.sub("embed", Names.embedding);
    embed.where = placement::first_stage;
    b.embedding = lower_block<Embedding>(b, embed);

    b.hf_layers = basic_text<48>(Names.layers);
    b.hf_layers.append(".");
    using group = detail::layer_group<Layers>;
    b.pick = group::pick;
    if constexpr (requires { group::settings; })
      for (const config_setting& c : group::settings) b.setting(c);
    basic_text<384> kinds;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (([&] {
         slot layer{.scope = "layers.{layer}.", .where = placement::layer, .kinds = 1U << K, .names = &Names};
         layer.hf = joined<96>(Names.layers, "{layer}");
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

    slot final_norm = outer.sub("final_norm", Names.final_norm);
    final_norm.where = placement::last_stage;
    b.final_norm = lower_block<FinalNorm>(b, final_norm);
    basic_text<160> final_label(b.label(b.final_norm));
    final_label.add("  [", leaf(Names.final_norm), "]");
    b.labels[static_cast<std::size_t>(b.final_norm)] = final_label;

    Head::lower(b, outer);

    b.name.add("decoder(", b.signature(b.embedding), ", ", std::tuple_size_v<typename group::kinds> > 1 ? "layers(" : "",
               kinds.view(), std::tuple_size_v<typename group::kinds> > 1 ? ")" : "", ", ", b.signature(b.final_norm),
               Names.signature.empty() ? "" : ", ", Names.signature, ")");
    return b;
  }
};

}  // namespace megadsl::blocks
