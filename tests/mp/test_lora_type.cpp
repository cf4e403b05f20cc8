// LoRA in the model's type (issue 48): causal_lm<M, L, lora{...}> attaches fresh adapters at
// construction and trains them with the base frozen, the same in every layout and the same as
// adapters attached at run time (runtime/lora_io.hpp).
#include "../catch_torch.hpp"

#include <c10/core/GradMode.h>

#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/runtime/lora_io.hpp"
#include "megadsl/runtime/trainer.hpp"
#include "mp_support.hpp"

namespace megadsl::test {

namespace {

inline constexpr lora adapters = lora{.rank = 4, .alpha = 8.0}.target("q_proj").target("o_proj").target("down_proj");
static_assert(valid_lora<tiny8, adapters>);
static_assert(!valid_lora<tiny8, lora{.rank = 4}.target("lm_head")>);  // lora_target_supported

template <layout L>
using lora_actor = causal_lm<tiny8, L, adapters>;

// Two steps of the actor loss; each step's loss and the adapters gathered whole (PEFT's names).
template <class Model>
std::pair<std::vector<double>, std::vector<std::pair<std::string, at::Tensor>>> train(Model& m, parallel_groups& g) {
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  trainer t = make_trainer(m, g, optimizer_config{.lr = 1e-3, .eps = 1e-6}, actor_loss_config{.clip_ratio = 0.2});
  std::vector<double> losses;
  for (int step = 0; step < 2; ++step) losses.push_back(t.step(rb, 2).loss);
  return {losses, gather_peft_adapter(*m.lora(), m.config(), g, hf_name_map{})};
}

}  // namespace

TEST_CASE("LoRA in the model's type: fresh adapters attached at construction, trained alike in every layout",
          "[world4][lora]") {
  constexpr layout one{};
  constexpr layout split{.tp = 2, .pp = 2, .sp = true};
  static_assert(lora_actor<split>::adapters == adapters);
  auto g1 = parallel_groups::build(dist(), one);
  parallel_model<lora_actor<one>> a(g1, test_options<tiny8>());
  parallel_model<causal_lm<tiny8, one>> base(g1, test_options<tiny8>());
  REQUIRE(a.lora() != nullptr);
  CHECK(a.lora()->size() == 3 * 8);  // 3 modules in 8 layers
  for (const named_parameter& p : a.parameters()) CHECK_FALSE(p.tensor.requires_grad());  // frozen
  // A and B of each: q_proj's B in the fused q/k/v's 2 kv groups (2 pieces), o's and down's whole.
  CHECK(a.trainable_parameters().size() == (3 + 2 + 2) * 8);
  // B starts at zero: the base's log-probs, bit for bit.
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  {
    const c10::NoGradGuard no_grad;
    CHECK(at::equal(a.forward({.input_ids = rb.input_ids, .attention_mask = rb.attention_mask}).log_probs,
                    base.forward({.input_ids = rb.input_ids, .attention_mask = rb.attention_mask}).log_probs));
  }
  const auto [want_losses, want] = train(a, g1);
  // The same adapters attached at run time train to the same bits.
  parallel_model<causal_lm<tiny8, one>> attached(g1, test_options<tiny8>());
  attached.attach_lora(new_adapters(adapters, attached.config(), g1.me.tp, attached.parameters(), test_options<tiny8>().seed));
  const auto [losses, got] = train(attached, g1);
  CHECK(losses == want_losses);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(at::equal(got[i].second, want[i].second));
  // tp 2 x pp 2 with sp: within 1e-5 of one process.
  auto g4 = parallel_groups::build(dist(), split);
  parallel_model<lora_actor<split>> s(g4, test_options<tiny8>());
  const auto [split_losses, split_adapters] = train(s, g4);
  for (std::size_t i = 0; i < split_losses.size(); ++i) CHECK(std::abs(split_losses[i] - want_losses[i]) < 1e-5);
  REQUIRE(split_adapters.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(split_adapters[i].first == want[i].first);
    CHECK((split_adapters[i].second - want[i].second).abs().max().item<double>() < 1e-5);
    if (want[i].first.find("lora_B") != std::string::npos) CHECK(want[i].second.abs().max().item<double>() > 1e-4);  // trained
  }
}

}  // namespace megadsl::test
