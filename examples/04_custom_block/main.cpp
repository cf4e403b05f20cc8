// A new block, outside megadsl: this example declares the squared-ReLU MLP in its own files
// (relu2_mlp.hpp: the block type, its parameters and HF names; relu2_mlp.cpp: its module),
// composes a family from it with megadsl's attention and norms, and, touching nothing in megadsl:
//   - runs its actor and critic at tp 2 x pp 2 with sequence parallelism and remove-padding against
//     the same model in one process;
//   - saves the distributed actor as an HF checkpoint (its own model_type, registered here) and
//     loads it into a single-process model that started from other weights: the same log-probs.
//
//   ./04_custom_block                 # 4 local ranks
//   ./04_custom_block --out DIR       # where the HF checkpoint goes (default ./04_custom_block.hf)
#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "megadsl/family_config.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/megadsl.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "relu2_mlp.hpp"

namespace md = megadsl;
namespace b = megadsl::blocks;

// The composition: Llama's attention and RMSNorms around the squared-ReLU MLP.
using relu2_blocks = b::decoder<b::embedding<>,
                                b::block<b::pre_norm<b::rms_norm<>, b::attention<>>, b::pre_norm<b::rms_norm<>, example::relu2_mlp>>,
                                b::rms_norm<>>;

// Its config.json: a model_type of its own (transformers has no such class; megadsl reads and
// writes it), the keys it reads, transformers-like defaults.
inline constexpr md::config_key_rule relu2_keys[] = {{"rms_norm_eps", md::key_use::read},
                                                     {"attention_bias", md::key_use::read}};
inline constexpr md::family_config relu2_config{
    .model_type = "llama_relu2", .hf_class = "LlamaRelu2", .display = "megadsl's example 04 (Llama with a squared-ReLU MLP)",
    .arch = &md::architecture_of<relu2_blocks>, .max_positions = 2048, .rms_eps = 1e-6,
    .bias = {.qkv = md::attention_bias_key, .out = md::attention_bias_key}, .keys = relu2_keys};

template <md::shape S>
struct llama_relu2 : md::decoder_family<relu2_blocks, S> {
  static constexpr std::string_view family = relu2_config.model_type;
  static constexpr std::string_view name = "llama-relu2";
};
struct tiny_relu2 : llama_relu2<md::shape{.hidden = 128, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 320,
                                          .vocab = 1000, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny-relu2";
};

constexpr md::layout layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true};
using actor = md::causal_lm<tiny_relu2, layout>;
using critic = md::value_model<tiny_relu2, layout>;
// The block's rows are the model's: up_proj split over tp by rows, down_proj by columns.
static_assert(md::local_shape<actor>("layers.{layer}.up.weight") == md::mat(320 / 2, 128));
static_assert(md::local_shape<actor>("layers.{layer}.down.weight") == md::mat(128, 320 / 2));
static_assert(md::parameter_count(tiny_relu2::shape) ==
              2 * 1000 * 128 + 4 * (128 * (128 + 2 * 32) + 128 * 128 + 2 * 128 * 320 + 2 * 128) + 128);

int main(int argc, char** argv) {
  std::filesystem::path out = std::filesystem::current_path() / "04_custom_block.hf";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
  md::register_family(relu2_config);  // config.json's model_type "llama_relu2" is this family
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    auto groups = md::parallel_groups::build(dist, layout);
    const md::model_options options{.test_init = true};  // random norm weights too
    md::parallel_model<actor> policy(groups, options);
    md::parallel_model<critic> value(groups, options);

    // Two left-padded rows; remove-padding packs their real tokens.
    const at::Tensor ids = at::tensor({0L, 0L, 0L, 17L, 250L, 31L, 999L, 4L,  //
                                       5L, 6L, 7L, 8L, 9L, 10L, 11L, 12L}).view({2, 8});
    const at::Tensor mask = (at::arange(16).view({2, 8}) >= 3).to(at::kLong);
    const md::batch batch{.input_ids = ids, .attention_mask = mask};
    const md::model_output a = policy.forward(batch);
    const md::model_output c = value.forward(batch);

    auto single = md::parallel_groups::single();
    md::parallel_model<md::causal_lm<tiny_relu2>> policy1(single, options);
    md::parallel_model<md::value_model<tiny_relu2>> value1(single, options);
    const double lp_diff = (policy1.forward(batch).log_probs - a.log_probs).abs().max().item<double>();
    const double v_diff = (value1.forward(batch).values - c.values).abs().max().item<double>();

    // The distributed actor as an HF checkpoint, loaded into a single-process model that started
    // from other weights (another seed).
    md::save_hf(policy, groups, out);
    groups.world->barrier();  // every rank sees the checkpoint
    md::parallel_model<md::causal_lm<tiny_relu2>> loaded(single, md::model_options{.seed = 99, .test_init = true});
    const double before = (loaded.forward(batch).log_probs - a.log_probs).abs().max().item<double>();
    md::load_hf(loaded, single, out);
    const double after = (loaded.forward(batch).log_probs - a.log_probs).abs().max().item<double>();

    if (dist.rank() == 0) {
      std::printf("megadsl: a block declared outside megadsl, in a family of this file\n%s",
                  std::string(md::composition_tree(tiny_relu2::shape).view()).c_str());
      std::printf("actor and critic at tp 2 x pp 2, sp and rmpad on, %lld ranks\n", static_cast<long long>(dist.world()));
      std::printf("max |difference| from the single-process model: log-probs %.2e, values %.2e\n", lp_diff, v_diff);
      std::printf("HF checkpoint %s (model_type llama_relu2): a model of other weights differed by %.2e, "
                  "after load_hf by %.2e\n", out.string().c_str(), before, after);
      const bool ok = lp_diff < 1e-5 && v_diff < 1e-5 && after < 1e-5 && before > 1e-3;
      std::printf("%s\n", ok ? "the custom block equals the single-process model and round-trips through HF"
                             : "MISMATCH");
      return ok ? 0 : 1;
    }
    return 0;
  });
}
