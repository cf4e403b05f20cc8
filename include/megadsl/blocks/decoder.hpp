// The decoder: embedding, layers of one or several kinds (pattern, first_k, select), final norm.
#pragma once

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
    b.param(lm, {"weight", &geo::vocab, {"weight"}, 1, presence::actor});
    // GPTNeoXForTokenClassification names its head `classifier`, every other class `score`.
    slot value = outer.sub("value_head", neox ? "classifier" : "score");
    value.where = placement::last_stage;
    b.param(value, {"weight", &geo::value_weight, {"weight"}, 1, presence::critic});
    b.param(value, {"bias", &geo::value_bias, {"bias"}, 1, presence::critic_bias});

    b.name.add("decoder(", b.signature(b.embedding), ", ", std::tuple_size_v<typename group::kinds> > 1 ? "layers(" : "",
               kinds.view(), std::tuple_size_v<typename group::kinds> > 1 ? ")" : "", ", ", b.signature(b.final_norm),
               neox ? ", gpt_neox names)" : ")");
    return b;
  }
};

}  // namespace megadsl::blocks
