// The gated MLP (SwiGLU, GeGLU), and the HF module names MLPs are bound under.
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// ---- MLPs -----------------------------------------------------------------------------------------

// An MLP keeps its input (2) and its dropout mask (1) whole, its 4h-wide intermediates (16) split
// over tp (the paper's GPT MLP; a mixture's experts take it as the customary estimate).
inline constexpr activation_terms mlp_keeps{.whole = 3, .split = 16};

// A gated MLP at its own width: its input (2) and dropout mask (1) whole, and split over tp the
// gate/up output (2 ffn wide), the activation's output and the product (ffn each): 4 ffn values,
// 8 ffn / h in the paper's 16-bit units (a Llama-3 layer's 28, not the GPT MLP's 16; megadsl's
// SwiGLU keeps exactly these, bench_context_parallel_memory).
constexpr activation_terms gated_mlp_keeps(const shape& s) {
  return {.whole = 3, .split = 8.0 * static_cast<double>(s.ffn.get()) / static_cast<double>(s.hidden.get())};
}

// The HF module an MLP's tensors sit in: `mlp` (most families) or `feed_forward` (Llama 4).
struct hf_module {
  std::string_view name;
};
inline constexpr hf_module mlp_module{"mlp"}, feed_forward_module{"feed_forward"};

// down(act(gate(x)) * up(x)), gate and up column-parallel (fused per rank), down row-parallel.
// HF stores gate and up separately (gate_proj, up_proj) or concatenated (gate_up_proj); Llama's
// mlp_bias adds biases on all three (separate storage).
// What an MLP's module is told (gated_mlp, plain_mlp): its activation.
struct mlp_knobs {
  static constexpr std::string_view knobs_name = "mlp_knobs";
  activation act = activation::silu;
};

template <activation A = activation::silu, tensor_storage S = tensor_storage::separate, const hf_module& M = mlp_module>
struct gated_mlp {
  static constexpr mlp_knobs knobs{A};
  static_assert(S != tensor_storage::interleaved, "megadsl: a gated MLP has no interleaved form (separate or concatenated)");
  static constexpr tensor_storage hf_storage = S;
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add(s.mlp_bias.is_static() && s.mlp_bias.get() ? " + biases" : "", "  [", M.name,
          S == tensor_storage::concatenated ? ": gate_up_proj" : "", "]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module(M.name);
    if constexpr (S == tensor_storage::separate)
      b.param(at, {"gate_up.weight", &geo::gate_up<&geo::dense_ffn, false>, {"gate_proj.weight", "up_proj.weight"}, 2});
    else
      b.param(at, {"gate_up.weight", &geo::gate_up<&geo::dense_ffn, false>, {"gate_up_proj.weight"}, 1, presence::always,
                   true});
    b.param(at, {"down.weight", &geo::down<&geo::dense_ffn>, {"down_proj.weight"}, 1});
    if constexpr (S == tensor_storage::separate) {
      b.param(at, {"gate_up.bias", &geo::gate_up<&geo::dense_ffn, true>, {"gate_proj.bias", "up_proj.bias"}, 2,
                   presence::mlp_bias});
      b.param(at, {"down.bias", &geo::hidden, {"down_proj.bias"}, 1, presence::mlp_bias});
    }
    b.uses(A);
    basic_text<64> name("gated_mlp<");
    name.add(name_of(A), ">");
    return b.costs(b.node(at, &modules::gated_mlp, {}, name.view(), name.view(), &details, knobs_of(knobs)),
                   &gated_mlp_keeps);
  }
};

}  // namespace megadsl::blocks
