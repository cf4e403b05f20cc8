// A composition lowered to its architecture: the bound tables, architecture_of and
// decoder_family.
#pragma once

#include "megadsl/blocks/decoder.hpp"

namespace megadsl::blocks {

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
    blocks::lowered<Composition>::built.has_act,
    std::span<const config_setting>(blocks::lowered<Composition>::built.settings.data(),
                                    static_cast<std::size_t>(blocks::lowered<Composition>::built.setting_count)),
    blocks::lowered<Composition>::built.logit_scale,
    blocks::lowered<Composition>::built.logit_divides};

constexpr shape with_architecture(shape s, const architecture* a) {
  s.arch = a;
  if (!undeclared_setting(s).empty())
    throw "megadsl: the shape's settings give a config key no block of the composition declares (settings_given)";
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
