// An attention megadsl does not have, declared in this example's own files (qk_scales.hpp: a
// learned scale per query head and per kv head with a geometry and a config.json key of their
// own; qk_scales.cpp: its module), composed into a family here, and, touching nothing in megadsl:
//   - runs its actor and critic at tp 2 x pp 2 with sequence parallelism and remove-padding against
//     the same model in one process, forward and after one PPO step (with one kv head over tp 2,
//     each tp rank holds the kv head's scale, and their gradients are summed);
//   - saves the distributed actor as an HF checkpoint: config.json carries qk_scale_cap, which
//     megadsl's reader reads back; a model that started from other weights loads it and gives the
//     same log-probs; a model declaring another cap is refused, naming the key.
//
//   ./05_custom_attention             # 4 local ranks
//   ./05_custom_attention --out DIR   # where the HF checkpoint goes (default ./05_custom_attention.hf)
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "megadsl/family_config.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/megadsl.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/runtime/trainer.hpp"
#include "qk_scales.hpp"

namespace md = megadsl;
namespace b = megadsl::blocks;

// Llama's layer with the scales in its attention's q/k slot.
using scaled_blocks =
    b::decoder<b::embedding<>,
               b::block<b::pre_norm<b::rms_norm<>, b::attention<b::attention_knobs{}, example::learned_qk_scales>>,
                        b::pre_norm<b::rms_norm<>, b::gated_mlp<>>>,
               b::rms_norm<>>;

// Its config.json: a model_type of its own; qk_scale_cap is the block's, not listed here.
inline constexpr md::config_key_rule scaled_keys[] = {{"rms_norm_eps", md::key_use::read},
                                                      {"attention_bias", md::key_use::read}};
inline constexpr md::family_config scaled_config{
    .model_type = "llama_qk_scales", .hf_class = "LlamaQkScales",
    .display = "megadsl's example 05 (Llama with learned q/k scales per head)",
    .arch = &md::architecture_of<scaled_blocks>, .max_positions = 2048, .rms_eps = 1e-6,
    .bias = {.qkv = md::attention_bias_key, .out = md::attention_bias_key}, .keys = scaled_keys};

template <md::shape S>
struct llama_qk_scales : md::decoder_family<scaled_blocks, S> {
  static constexpr std::string_view family = scaled_config.model_type;
  static constexpr std::string_view name = "llama-qk-scales";
};
// Eight query heads over one kv head, the scales capped at 1.5 (not the default 4).
constexpr md::shape tiny{.hidden = 128, .layers = 4, .heads = 8, .kv_heads = 1, .ffn = 256, .vocab = 1000,
                         .max_positions = 256,
                         .settings = md::settings_given({{"qk_scale_cap", 1.5}})};
struct tiny_scaled : llama_qk_scales<tiny> {
  static constexpr std::string_view name = "tiny-qk-scales";
};
// The same model with the default cap: other numbers, so another model.
struct tiny_default_cap : llama_qk_scales<md::shape{.hidden = 128, .layers = 4, .heads = 8, .kv_heads = 1, .ffn = 256,
                                                    .vocab = 1000, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny-qk-scales-default-cap";
};

constexpr md::layout layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true};
using actor = md::causal_lm<tiny_scaled, layout>;
using critic = md::value_model<tiny_scaled, layout>;
// The geometry, per tp rank: 4 of the 8 query heads' scales; the one kv head's scale on both ranks.
static_assert(md::local_shape<actor>("layers.{layer}.q_scale") == md::vec(4));
static_assert(md::local_shape<actor>("layers.{layer}.k_scale") == md::vec(1));
static_assert(md::setting(tiny_scaled::shape, "qk_scale_cap") == 1.5);
static_assert(md::setting(tiny_default_cap::shape, "qk_scale_cap") == 4.0);

namespace {

// Two prompts with responses, left-padded; the advantages favour even next tokens.
md::rollout_batch make_rollout() {
  md::rollout_batch rb;
  rb.input_ids = at::tensor({0L, 0L, 0L, 17L, 250L, 31L, 999L, 4L, 5L, 6L, 7L, 8L, 9L, 10L, 11L, 12L}).view({2, 8});
  rb.attention_mask = (at::arange(16).view({2, 8}) >= 3).to(at::kLong);
  rb.loss_mask = (at::arange(16).view({2, 8}).remainder(8) >= 4).to(at::kFloat);
  const at::Tensor next = at::constant_pad_nd(rb.input_ids.narrow(1, 1, 7), {0, 1});
  rb.advantages = at::where(next.remainder(2) == 0, 1.0, -1.0).to(at::kFloat);
  rb.returns = rb.advantages.clone();
  return rb;
}

template <class Policy, class Value>
void ppo_step(Policy& policy, Value& value, const md::parallel_groups& groups, md::rollout_batch rb) {
  const md::batch inputs{.input_ids = rb.input_ids, .attention_mask = rb.attention_mask};
  {
    c10::NoGradGuard no_grad;
    rb.old_log_probs = policy.forward(inputs, {.entropy = false}).log_probs.detach();
    rb.old_values = value.forward(inputs).values.detach();
  }
  // lr 1e-4 and eps 1e-6, as megadsl's own layout tests: Adam's first step is lr * sign(g), so a
  // larger lr turns last-bit differences of near-zero gradients into visible ones.
  md::trainer a = md::make_trainer(policy, groups, {.lr = 1e-4, .eps = 1e-6, .clip_grad = 1.0}, {.clip_ratio = 0.2});
  md::trainer c = md::make_trainer(value, groups, {.lr = 1e-4, .eps = 1e-6, .clip_grad = 1.0});
  a.step(rb, 1);
  c.step(rb, 1);
}

// The scales' gradients against the single-process model's: each rank's q_scale is its query heads'
// share, its k_scale the kv head's (on both tp ranks, the copies' gradients summed). Summed over ranks.
template <class Policy, class Policy1>
double scale_grad_difference(Policy& policy, Policy1& policy1, const md::parallel_groups& groups, const md::batch& batch) {
  const md::loss_function loss = [](const md::model_output& out, std::int64_t) {
    return (out.log_probs * out.valid.to(at::kFloat)).sum() * 0.1;
  };
  policy.forward_backward({batch}, loss);
  policy.finalize_grads(true);
  auto single = md::parallel_groups::single();
  policy1.forward_backward({batch}, loss);
  policy1.finalize_grads(true);
  const std::int64_t tp_rank = groups.tp != nullptr ? groups.tp->rank() : 0;
  double diff = 0;
  for (const md::named_parameter& p : policy.parameters()) {
    if (!p.name.ends_with("_scale")) continue;
    for (const md::named_parameter& q : policy1.parameters())
      if (q.name == p.name) {
        const std::int64_t n = p.tensor.size(0);
        const at::Tensor whole = q.tensor.grad();
        const at::Tensor mine = whole.size(0) == n ? whole : whole.narrow(0, tp_rank * n, n);
        diff += (p.tensor.grad() - mine).abs().max().template item<double>();
      }
  }
  at::Tensor t = at::tensor({diff}, at::kDouble);
  groups.world->all_reduce(t);
  for (auto* ps : {&policy.parameters(), &policy1.parameters()})
    for (md::named_parameter& p : *ps) p.tensor.mutable_grad() = at::Tensor();
  return t.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path out = std::filesystem::current_path() / "05_custom_attention.hf";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
  md::register_family(scaled_config);  // config.json's model_type "llama_qk_scales" is this family
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    auto groups = md::parallel_groups::build(dist, layout);
    const md::model_options options{.test_init = true};  // random scales and norm weights too
    md::parallel_model<actor> policy(groups, options);
    md::parallel_model<critic> value(groups, options);
    auto single = md::parallel_groups::single();
    md::parallel_model<md::causal_lm<tiny_scaled>> policy1(single, options);
    md::parallel_model<md::value_model<tiny_scaled>> value1(single, options);

    const md::rollout_batch rb = make_rollout();
    const md::batch batch{.input_ids = rb.input_ids, .attention_mask = rb.attention_mask};
    const auto diff = [&](auto& p, auto& v, auto& p1, auto& v1) {
      c10::NoGradGuard no_grad;
      return std::pair{(p1.forward(batch).log_probs - p.forward(batch).log_probs).abs().max().template item<double>(),
                       (v1.forward(batch).values - v.forward(batch).values).abs().max().template item<double>()};
    };
    const auto [lp0, v0] = diff(policy, value, policy1, value1);
    const double grads = scale_grad_difference(policy, policy1, groups, batch);
    const auto log_probs1 = [&] {
      c10::NoGradGuard no_grad;
      return policy1.forward(batch).log_probs;
    };
    const at::Tensor start = log_probs1();
    ppo_step(policy, value, groups, rb);
    ppo_step(policy1, value1, single, rb);
    const auto [lp1, v1] = diff(policy, value, policy1, value1);
    const double moved = (log_probs1() - start).abs().max().item<double>();  // the step changed the policy

    // The distributed actor as an HF checkpoint; its config.json read back by megadsl's reader.
    md::save_hf(policy, groups, out);
    groups.world->barrier();  // every rank sees the checkpoint
    const md::hf_config cfg = md::read_hf_config(out);
    const double cap_read = md::setting(cfg.s, "qk_scale_cap");
    md::parallel_model<md::causal_lm<tiny_scaled>> loaded(single, md::model_options{.seed = 99, .test_init = true});
    const at::Tensor lp = [&] {
      c10::NoGradGuard no_grad;
      return policy.forward(batch).log_probs;
    }();
    const double before = (loaded.forward(batch).log_probs - lp).abs().max().item<double>();
    md::load_hf(loaded, single, out);
    const double after = (loaded.forward(batch).log_probs - lp).abs().max().item<double>();
    // The key as config.json may hold it: under its older spelling, out of its range, not a number.
    std::string text;
    {
      std::ifstream in(out / "config.json");
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const auto with = [&](const std::string& from, const std::string& to) {
      std::string t = text;
      t.replace(t.find(from), from.size(), to);
      return t;
    };
    const double old_spelling =
        md::setting(md::parse_hf_config(with("\"qk_scale_cap\"", "\"qk_scales_cap\""), "old.json").s, "qk_scale_cap");
    std::string out_of_range, not_a_number;
    try {
      md::parse_hf_config(with("\"qk_scale_cap\": 1.5", "\"qk_scale_cap\": 100.0"), "range.json");
    } catch (const std::exception& e) {
      out_of_range = e.what();
    }
    try {
      md::parse_hf_config(with("\"qk_scale_cap\": 1.5", "\"qk_scale_cap\": \"big\""), "type.json");
    } catch (const std::exception& e) {
      not_a_number = e.what();
    }
    std::string refusal = "(not refused)";
    try {
      md::parallel_model<md::causal_lm<tiny_default_cap>> other(single, options);
      md::load_hf(other, single, out);
    } catch (const std::exception& e) {
      refusal = e.what();
    }

    if (dist.rank() == 0) {
      std::printf("megadsl: an attention block declared outside megadsl, with its own geometry and config key\n%s",
                  std::string(md::composition_tree(tiny_scaled::shape).view()).c_str());
      std::printf("actor and critic at tp 2 x pp 2, sp and rmpad on, %lld ranks; one kv head over tp 2\n",
                  static_cast<long long>(dist.world()));
      std::printf("max |difference| from the single-process model: log-probs %.2e, values %.2e; the scales' "
                  "gradients %.2e; after one PPO step (which moved the log-probs by %.2e) %.2e, %.2e\n", lp0, v0, grads,
                  moved, lp1, v1);
      std::printf("HF checkpoint %s: config.json's qk_scale_cap read back as %g; a model of other weights differed "
                  "by %.2e, after load_hf by %.2e\n", out.string().c_str(), cap_read, before, after);
      std::printf("a model declaring the default cap is refused: %s\n", refusal.c_str());
      std::printf("qk_scales_cap (its older spelling) read as %g; refused: %s | %s\n", old_spelling, out_of_range.c_str(),
                  not_a_number.c_str());
      const bool ok = lp0 < 1e-5 && v0 < 1e-5 && grads < 1e-5 && moved > 1e-4 && lp1 < 1e-5 && v1 < 1e-5 && cap_read == 1.5 && after < 1e-5 &&
                      before > 1e-3 && refusal.find("qk_scale_cap") != std::string::npos && old_spelling == 1.5 &&
                      out_of_range.find("qk_scale_cap") != std::string::npos && not_a_number.find("qk_scale_cap") != std::string::npos;
      std::printf("%s\n", ok ? "the custom attention equals the single-process model and round-trips through HF"
                             : "MISMATCH");
      return ok ? 0 : 1;
    }
    return 0;
  });
}
