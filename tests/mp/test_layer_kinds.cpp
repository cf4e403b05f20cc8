// Layers of several kinds in one decoder, declared in the type (layers/blocks.hpp: pattern,
// first_k): the parameter rows exist on their kind's layers only, pipeline stages split mixed
// layers, and every layout equals the single-process model in inference and PPO training.
#include "../catch_torch.hpp"

#include "layout_checks.hpp"

namespace megadsl::test {
namespace {

namespace b = blocks;
using attention_layer = b::block<b::pre_norm<b::rms_norm<>, b::attention<>>, b::pre_norm<b::rms_norm<>, b::gated_mlp<>>>;
using qk_norm_layer = b::block<b::pre_norm<b::rms_norm<>, b::attention<b::attention_knobs{}, b::per_head_qk_norm<b::rms_norm<>>>>,
                               b::pre_norm<b::rms_norm<>, b::gated_mlp<>>>;
using moe_layer = b::block<b::pre_norm<b::rms_norm<>, b::attention<>>, b::pre_norm<b::rms_norm<>, b::moe<>>>;

// Per-head q/k norms on every other layer (kinds 0, 1, 0, 1, ...).
using alternating_blocks = b::decoder<b::embedding<>, b::pattern<attention_layer, qk_norm_layer>, b::rms_norm<>>;
template <shape S>
struct alternating : decoder_family<alternating_blocks, S> {
  static constexpr std::string_view family = "alternating";
};
struct tiny8_alternating : alternating<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                             .vocab = 500, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny8-alternating";
};

// DeepSeek's shape of layers: the first two dense, the rest a mixture of experts.
using first_dense_blocks = b::decoder<b::embedding<>, b::first_k<2, attention_layer, moe_layer>, b::rms_norm<>>;
template <shape S>
struct first_dense : decoder_family<first_dense_blocks, S> {
  static constexpr std::string_view family = "first-dense";
};
struct tiny8_first_dense : first_dense<shape{.hidden = 128, .layers = 8, .heads = 4, .kv_heads = 2, .ffn = 352,
                                             .vocab = 500, .max_positions = 256, .experts = 4, .top_k = 2,
                                             .expert_ffn = 96, .norm_topk = true}> {
  static constexpr std::string_view name = "tiny8-first-dense";
};

// The rows and counts follow the kinds: q/k norms on the odd layers only, experts after layer 1.
constexpr const shape& alt = tiny8_alternating::shape;
constexpr const shape& fd = tiny8_first_dense::shape;
static_assert(kind_of_layer(alt, 0) == 0 && kind_of_layer(alt, 3) == 1 && !routes_any(alt));
static_assert(in_layer(*find_row(*alt.arch, "layers.{layer}.q_norm.weight"), alt, 1) &&
              !in_layer(*find_row(*alt.arch, "layers.{layer}.q_norm.weight"), alt, 2));
static_assert(in_layer(*find_row(*alt.arch, "layers.{layer}.qkv.weight"), alt, 2));  // one row, both kinds
static_assert(parameter_count(alt) == parameter_count(tiny8::shape) + 4 * 2 * 32);  // 4 layers x q/k norms of head_dim 32
static_assert(routed_layers(fd) == 6 && !layer_routes(fd, 1) && layer_routes(fd, 2));
static_assert(score_units(alt) == 8 * 4 * 32 && score_units(fd) == score_units(alt));  // every layer attends: L n d
static_assert(layer_parameter_count(fd, 0) == layer_parameter_count(tiny8::shape, 0));
static_assert(layer_parameter_count(fd, 2) ==
              layer_parameter_count(tiny8::shape, 0) - 3 * 128 * 352 + 128 * 4 + 4 * 3 * 128 * 96);

TEST_CASE("layers of two kinds (a pattern, the first k dense): every layout equals one process", "[world4][layer_kinds]") {
  for (const bool left : {true, false}) {
    check_inference<tiny8_alternating, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(left);
    check_inference<tiny8_alternating, layout{.pp = 4}, false>(left);
    check_inference<tiny8_first_dense, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(left);
    check_inference<tiny8_first_dense, layout{.pp = 2, .ep = 2}, true>(left);  // stage 0: two dense, two sparse
  }
  check_training<tiny8_alternating, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_first_dense, layout{.pp = 2, .rmpad = true, .ep = 2}, true>(2);
}

}  // namespace
}  // namespace megadsl::test
