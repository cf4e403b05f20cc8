// A new architecture is one type alias: this example declares a family that no header of megadsl
// has (Llama attention with Qwen3's per-head q/k RMSNorm, and Gemma's GELU-tanh gated MLP), gives
// it a shape, and runs its actor and critic on several local ranks (tp 2 x pp 2 with sequence
// parallelism and remove-padding by default) against the same model in one process.
//
//   ./build/examples/03_new_family              # 4 local ranks: tp 2 x pp 2
//   ./build/examples/03_new_family --ranks 8    # tp 2 x pp 2 x dp 2
//
// Sharding, collectives, the parameter table (q/k norms whole on every tp rank, their gradients
// summed over tp) and `describe` come from the composition; nothing else is written for it.
#include <ATen/ATen.h>

#include <cstdio>

#include "megadsl/megadsl.hpp"

namespace md = megadsl;
namespace b = megadsl::blocks;

// The composition: embedding, one decoder block looped `layers` times, the final norm.
using qk_gelu_blocks =
    b::decoder<b::embedding<>,
               b::block<b::pre_norm<b::rms_norm<>, b::attention<b::attention_knobs{}, b::per_head_qk_norm<b::rms_norm<>>>>,
                        b::pre_norm<b::rms_norm<>, b::gated_mlp<md::activation::gelu_tanh>>>,
               b::rms_norm<>>;

// The family, and a model of it (a struct, so that diagnostics name it).
template <md::shape S>
struct qk_gelu : md::decoder_family<qk_gelu_blocks, S> {
  static constexpr std::string_view family = "qk-gelu";
  static constexpr std::string_view name = "qk-gelu";
};
struct tiny_qk_gelu : qk_gelu<md::shape{.hidden = 128, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 352,
                                        .vocab = 1000, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny-qk-gelu";
};

constexpr md::layout layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true};
using actor = md::causal_lm<tiny_qk_gelu, layout>;
using critic = md::value_model<tiny_qk_gelu, layout>;
static_assert(md::local_shape<actor>("layers.{layer}.q_norm.weight") == md::vec(16));  // head_dim, every rank

int main(int argc, char** argv) {
  return md::run_ranks(argc, argv, 4, [](md::distributed& dist) {
    auto groups = md::parallel_groups::build(dist, layout);
    // test_init: random norm weights too, so that the q/k norms matter.
    const md::model_options options{.test_init = true};
    md::parallel_model<actor> policy(groups, options);
    md::parallel_model<critic> value(groups, options);

    const at::Tensor ids = at::tensor({0L, 0L, 0L, 17L, 250L, 31L, 999L, 4L,  //
                                       5L, 6L, 7L, 8L, 9L, 10L, 11L, 12L}).view({2, 8});
    const at::Tensor mask = (at::arange(16).view({2, 8}) >= 3).to(at::kLong);
    const md::batch batch{.input_ids = ids, .attention_mask = mask};
    const md::model_output a = policy.forward(batch);
    const md::model_output c = value.forward(batch);

    auto single = md::parallel_groups::single();
    md::parallel_model<md::causal_lm<tiny_qk_gelu>> policy1(single, options);
    md::parallel_model<md::value_model<tiny_qk_gelu>> value1(single, options);
    const double lp_diff = (policy1.forward(batch).log_probs - a.log_probs).abs().max().item<double>();
    const double v_diff = (value1.forward(batch).values - c.values).abs().max().item<double>();

    if (dist.rank() == 0) {
      std::printf("megadsl: a family declared in this file\n%s", std::string(md::composition_tree(tiny_qk_gelu::shape).view()).c_str());
      std::printf("actor and critic at tp 2 x pp 2, sp and rmpad on, %lld ranks\n", static_cast<long long>(dist.world()));
      std::printf("mean log-prob %.5f, mean value %+.5f\n",
                  (a.log_probs.sum() / a.valid.sum()).item<double>(), (c.values.sum() / mask.sum()).item<double>());
      std::printf("max |difference| from the single-process model: log-probs %.2e, values %.2e\n", lp_diff, v_diff);
      std::printf("%s\n", lp_diff < 1e-5 && v_diff < 1e-5 ? "every layout equals the single-process model"
                                                          : "MISMATCH with the single-process model");
    }
    return (lp_diff < 1e-5 && v_diff < 1e-5) ? 0 : 1;
  });
}
