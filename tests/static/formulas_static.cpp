// Static tests of formulas.hpp: exact integer (or exactly representable) results; compiling is
// passing. Expected values are computed independently from the published formulas (see each
// comment), not read back from the implementation.
#include <array>
#include <cstdint>

#include "megadsl/formulas.hpp"
#include "megadsl/models/presets.hpp"

namespace {

using megadsl::head_info;
using megadsl::layout;
using megadsl::parameter_count;
using megadsl::precision;
using megadsl::training_flops_per_token;
using megadsl::training_memory;

constexpr auto l3 = megadsl::llama3_8b::shape;
constexpr auto l2 = megadsl::llama2_7b::shape;
constexpr head_info actor{};
constexpr head_info critic{.actor = false, .value_bias = true};
constexpr head_info critic_no_bias{.actor = false, .value_bias = false};

// ---- parameter counts ----
// Critic: the value head (h + 1) replaces the lm_head (V h).
static_assert(parameter_count(l3, critic) == 8'030'261'248 - 128'256LL * 4096 + 4096 + 1);
static_assert(parameter_count(l3, critic_no_bias) == 8'030'261'248 - 128'256LL * 4096 + 4096);
// Tied actor has no lm_head; a tied critic still has one embedding and a value head.
static_assert(parameter_count(megadsl::qwen2_5_0_5b::shape, critic) == 494'032'768 + 896 + 1);
// Per layer, Llama-3-8B: q 4096^2, k/v 2 x 4096 x 1024, o 4096^2, MLP 3 x 4096 x 14336, 2 norms.
static_assert(megadsl::layer_parameter_count(l3) == 218'112'000);
// Qwen2.5-0.5B q/k/v bias: 14 x 64 + 2 x 2 x 64 = 1152 per layer.
static_assert(megadsl::layer_parameter_count(megadsl::qwen2_5_0_5b::shape) ==
              896 * 896 * 2 + 2 * 896 * 128 + 1152 + 3 * 896 * 4864 + 2 * 896);

// ---- parameters per (tp, pp) rank (shard plan) ----
// tp 1: the pipeline ranks add up to the HF count (untied, vocab already a multiple of 128).
static_assert(training_memory(l3, layout{.pp = 4}, actor, precision::fp32, 0).parameters == 2'270'232'576);
static_assert(training_memory(l3, layout{.pp = 4}, actor, precision::fp32, 1).parameters == 1'744'896'000);
static_assert(training_memory(l3, layout{.pp = 4}, actor, precision::fp32, 3).parameters == 2'270'236'672);
static_assert(2'270'232'576 + 2 * 1'744'896'000LL + 2'270'236'672 == 8'030'261'248);
// tp 8 pp 4: vocab padded to 129024 = 16128 per rank; 8 layers of 27,271,168 elements each.
static_assert(training_memory(l3, layout{.tp = 8, .pp = 4}, actor, precision::fp32, 0).parameters == 284'229'632);
static_assert(training_memory(l3, layout{.tp = 8, .pp = 4}, actor, precision::fp32, 1).parameters == 218'169'344);
static_assert(training_memory(l3, layout{.tp = 8, .pp = 4}, actor, precision::fp32, 3).parameters == 284'233'728);
// tiny, tp 4 (kv heads replicated: each rank 1 kv group + 2 q heads), vocab 1000 -> 1024.
static_assert(training_memory(megadsl::tiny_llama::shape, layout{.tp = 4, .pp = 2}, actor, precision::fp32, 0).parameters == 429'056);
static_assert(training_memory(megadsl::tiny_llama::shape, layout{.tp = 4, .pp = 2}, actor, precision::fp32, 1).parameters == 429'312);
// Tied Qwen2.5-0.5B: pp 1 holds the embedding once; pp 2 keeps a copy on the last stage.
static_assert(training_memory(megadsl::qwen2_5_0_5b::shape, layout{.tp = 2}, actor, precision::fp32, 0).parameters == 247'095'680);
static_assert(training_memory(megadsl::qwen2_5_0_5b::shape, layout{.tp = 2, .pp = 2}, actor, precision::fp32, 1).parameters == 157'610'624);
static_assert(training_memory(megadsl::qwen2_5_0_5b::shape, layout{.tp = 2, .pp = 2}, critic, precision::fp32, 1).parameters == 89'486'849);

// ---- bytes per parameter ----
static_assert(megadsl::bytes_of(precision::fp32).total() == 16);
static_assert(megadsl::bytes_of(precision::bf16_mixed).total() == 18);  // Megatron's 18
constexpr auto m_bf16 = training_memory(l3, layout{.tp = 8, .pp = 4}, actor, precision::bf16_mixed, 1);
static_assert(m_bf16.weight_bytes == 2.0 * 218'169'344 && m_bf16.gradient_bytes == 4.0 * 218'169'344 &&
              m_bf16.optimizer_bytes == 12.0 * 218'169'344 && m_bf16.total_bytes == 18.0 * 218'169'344);
// Distributed optimizer over dp = 4: 6 + 12/4 = 9 bytes per parameter.
static_assert(training_memory(l3, layout{.tp = 8, .pp = 4}, actor, precision::bf16_mixed, 1, 4).total_bytes ==
              9.0 * 218'169'344);

// ---- activations (Korthikanti et al. 2022; the gated MLP at its width), Llama-3-8B, s = 4096, b = 1:
//      sbh = 2^24, 5as/h = 160 ----
constexpr double sbh = 4096.0 * 4096.0;
static_assert(megadsl::activation_bytes_per_layer(l3, layout{}, 4096, 1, false) == sbh * (46 + 160));
static_assert(megadsl::activation_bytes_per_layer(l3, layout{}, 4096, 1, true) == sbh * (46 + 160));
static_assert(megadsl::activation_bytes_per_layer(l3, layout{.tp = 8}, 4096, 1, false) == sbh * (10 + 4.5 + 20));
static_assert(megadsl::activation_bytes_per_layer(l3, layout{.tp = 8}, 4096, 1, true) == sbh * 206 / 8);
static_assert(megadsl::activation_bytes_per_layer(l3, layout{.tp = 8}, 4096, 1, false, megadsl::recompute::selective) == sbh * 14.5);
static_assert(megadsl::activation_bytes_per_layer(l3, layout{.tp = 8}, 4096, 1, true, megadsl::recompute::selective) == sbh * 46 / 8);
static_assert(megadsl::activation_bytes_per_layer(l3, layout{.tp = 8}, 4096, 1, false, megadsl::recompute::full) == 2 * sbh);
// The terms are the blocks': two norms (2 each), attention (3 whole, 8 split, 5 scores), the gated
// MLP at its width (3 whole, 8 ffn / h = 28 split: gate/up, the activation, the product); Gemma2's
// sandwich has four norms.
static_assert(megadsl::layer_activation_terms(l3, 0).whole == 10 && megadsl::layer_activation_terms(l3, 0).split == 36 &&
              megadsl::layer_activation_terms(l3, 0).scores == 5);
static_assert(megadsl::layer_activation_terms(megadsl::gemma2_9b::shape, 0).whole == 14);
// First stage under 1F1B: L/p layers x p micro-batches = L x per-layer.
static_assert(megadsl::activation_bytes_first_stage(l3, layout{.tp = 8, .pp = 4}, 4096, 1, true) == 32 * sbh * 206 / 8);
// Fewer micro-batches than stages: only those are in flight.
static_assert(megadsl::activation_bytes_first_stage(l3, layout{.tp = 8, .pp = 4}, 4096, 1, true, 2) == 16 * sbh * 206 / 8);
// Interleaved (vpp 2): x (1 + (p - 1)/(p v)) = 1.375.
static_assert(megadsl::interleave_factor(layout{.pp = 4, .vpp = 2}) == 1.375);
static_assert(megadsl::activation_bytes_first_stage(l3, layout{.tp = 8, .pp = 4, .vpp = 2}, 4096, 1, true) == 1.375 * 32 * sbh * 206 / 8);

// ---- FLOPs per token (anchors-and-user-pain.md §1 and §3) ----
// Megatron, padded vocab at tp 1 (128256 is a multiple of 128): 51.47 / 48.25 GF at s = 4096,
// 57.91 / 51.47 at s = 8192; verl before #4959 54.62 / 61.06; torchtitan 51.47 / 57.91.
constexpr auto f4k = training_flops_per_token(l3, layout{}, 4096);
constexpr auto f8k = training_flops_per_token(l3, layout{}, 8192);
static_assert(f4k.megatron_non_causal == 51'470'401'536.0);
static_assert(f4k.megatron_causal == 48'249'176'064.0);
static_assert(f4k.torchtitan == 51'471'998'976.0);
static_assert(f4k.verl == 51'401'195'520.0);
static_assert(f4k.verl_legacy == 54'622'420'992.0);
static_assert(f8k.megatron_non_causal == 57'912'852'480.0);
static_assert(f8k.megatron_causal == 51'470'401'536.0);  // causal at 8k == non-causal at 4k
static_assert(f8k.torchtitan == 57'914'449'920.0);
static_assert(f8k.verl_legacy == 61'064'871'936.0);
// tp 2 pads 128256 to a multiple of 256: unchanged; tp 8 pads to 129024: +6 h x 768 per token.
static_assert(training_flops_per_token(l3, layout{.tp = 2}, 4096).megatron_non_causal == f4k.megatron_non_causal);
static_assert(training_flops_per_token(l3, layout{.tp = 8}, 4096).megatron_non_causal ==
              f4k.megatron_non_causal + 6.0 * 4096 * 768);
// Llama-2-7B, s = 4096: 46.08 GF (NeMo 24.07's 776e12 / 16847 = 46.06).
static_assert(training_flops_per_token(l2, layout{}, 4096).megatron_non_causal == 46'084'915'200.0);

// A plain MLP (StarCoder2-7B: c_fc and c_proj, no gate) multiplies 2 h ffn weights per token, not
// 3 h ffn: its dense term is 12 L (h n d + h g d) + 12 L h ffn + 6 h V', written out here.
static_assert(training_flops_per_token(megadsl::starcoder2_7b::shape, layout{}, 4096).megatron_non_causal ==
              12.0 * 32 * (4608 * 36 * 128 + 4608 * 4 * 128) + 12.0 * 32 * 4608 * 18432 + 6.0 * 4608 * 49152 +
                  12.0 * 4096 * 32 * 36 * 128);
static_assert(training_flops_per_token(megadsl::starcoder2_7b::shape, layout{}, 4096).megatron_causal == 46'657'437'696.0);

// verl oracle (verl-semantics.md §6), Llama-2-7B, dt = 1 s: 149.226491215872 and 536.372695793664 TFLOP.
constexpr std::array<std::int64_t, 3> mixed{512, 1024, 2048};
constexpr std::array<std::int64_t, 3> full{4096, 4096, 4096};
static_assert(megadsl::verl_flops(l2, mixed) == 149'226'491'215'872.0);
static_assert(megadsl::verl_flops(l2, full) == 536'372'695'793'664.0);
// One sequence: the batch functions reduce to s x the per-token figure.
constexpr std::array<std::int64_t, 1> one{4096};
static_assert(megadsl::verl_flops(megadsl::llama3_8b::shape, one) == 4096 * f4k.verl);
static_assert(megadsl::verl_flops(megadsl::llama3_8b::shape, one, 12) == 4096 * f4k.verl_legacy);
static_assert(megadsl::megatron_flops(l3, layout{}, one, false) == 4096 * f4k.megatron_non_causal);
static_assert(megadsl::megatron_flops(l3, layout{}, one, true) == 4096 * f4k.megatron_causal);

}  // namespace
