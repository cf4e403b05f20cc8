// Ranks that disagree end together with one line naming what differs and where (issue 23, items
// 9-11): the model each rank builds, the batch each replica is given, the global batch of a
// training step. And a step whose gradient norm is not finite is skipped on every rank alike.
#include "../catch_torch.hpp"

#include <c10/core/GradMode.h>

#include <limits>

#include "megadsl/parallel/agreement.hpp"
#include "megadsl/parallel/comm.hpp"
#include "mp_support.hpp"

namespace megadsl::test {
namespace {

constexpr layout tp2{.tp = 2};  // 4 ranks: replicas (dp) {0, 1} and {2, 3}
using actor = causal_lm<tiny_llama, tp2>;

}  // namespace

TEST_CASE("ranks that build different models all refuse, naming the field and the ranks", "[world4][agreement]") {
  REQUIRE(dist().world() == 4);
  auto groups = parallel_groups::build(dist(), tp2);
  model_options o{.test_init = true};
  if (dist().rank() == 3) o.seed = 4321;
  REQUIRE_THROWS_MATCHES(parallel_model<actor>(groups, o), agreement_error,
                         Catch::Message("megadsl: the ranks built different models: seed is 1234 on ranks 0, 1, 2, "
                                        "4321 on rank 3; every rank must build the same model: the same config.json, "
                                        "layout, head and options"));
}

TEST_CASE("each replica may have its own batch; ranks of one replica may not", "[world4][agreement]") {
  auto groups = parallel_groups::build(dist(), tp2);
  parallel_model<actor> model(groups, {.test_init = true});
  const std::int64_t replica = groups.me.dp;
  // Replicas 0 and 1 with different batches (data parallelism): fine.
  const padded_batch mine = make_batch(tiny_llama::shape.vocab, true, 7 + static_cast<std::uint64_t>(replica));
  c10::NoGradGuard no_grad;
  global_comm_stats().reset();
  const model_output out = model.forward({.input_ids = mine.ids, .attention_mask = mine.mask});
  CHECK(out.log_probs.size(0) == mine.ids.size(0));
  CHECK(global_comm_stats().check_calls == 1);  // one all-gather of the batches' digests, counted apart

  // Rank 3 of replica 1 given another batch of the same shape: every rank ends, replica 0's too.
  const padded_batch other = make_batch(tiny_llama::shape.vocab, true, dist().rank() == 3 ? 99 : 8);
  const padded_batch& given = replica == 0 ? mine : other;
  REQUIRE_THROWS_WITH(model.forward({.input_ids = given.ids, .attention_mask = given.mask}),
                         Catch::Matchers::Contains("the ranks were given different batches in forward (same shapes, "
                                                   "other values): checksum ") &&
                             Catch::Matchers::Contains(" on rank 2, ") && Catch::Matchers::Contains(" on rank 3; every "
                                                                                                   "rank of a model replica"));
  // Rank 1 with one row fewer: the shapes are named.
  const at::Tensor ids = dist().rank() == 1 ? mine.ids.narrow(0, 1, mine.ids.size(0) - 1) : mine.ids;
  const at::Tensor mask = dist().rank() == 1 ? mine.mask.narrow(0, 1, mine.mask.size(0) - 1) : mine.mask;
  const std::string rows = std::to_string(mine.ids.size(0)), cols = std::to_string(mine.ids.size(1));
  REQUIRE_THROWS_WITH(model.forward({.input_ids = ids, .attention_mask = mask}),
                         Catch::Matchers::Contains("batches of different shapes in forward: input_ids is " + rows + " x " +
                                                   cols + " on rank 0, " + std::to_string(mine.ids.size(0) - 1) + " x " +
                                                   cols + " on rank 1"));
  // A rank that calls forward while the others step: the calls are named.
  auto trainer = make_trainer(model, groups);
  const rollout_batch rb = make_rollout(tiny_llama::shape.vocab);
  auto call = [&] {
    if (dist().rank() == 0) model.forward({.input_ids = mine.ids, .attention_mask = mine.mask});
    else trainer.step(rb, 1);
  };
  REQUIRE_THROWS_MATCHES(call(), agreement_error,
                         Catch::Message("megadsl: the ranks are making different calls: forward on rank 0, a training "
                                        "step on ranks 1, 2, 3; every rank must make the same calls in the same order"));
}

TEST_CASE("a training step needs the same global batch on every rank", "[world4][agreement]") {
  auto groups = parallel_groups::build(dist(), tp2);
  parallel_model<actor> model(groups, {.test_init = true});
  auto trainer = make_trainer(model, groups);
  rollout_batch rb = make_rollout(tiny_llama::shape.vocab);
  if (dist().rank() == 2) rb.advantages = rb.advantages + 1;
  REQUIRE_THROWS_WITH(trainer.step(rb, 2),
                         Catch::Matchers::Contains("different batches in a training step (same shapes, other values)") &&
                             Catch::Matchers::Contains("on ranks 0, 1, 3, ") && Catch::Matchers::Contains("on rank 2; every rank must"));
  CHECK(trainer.steps_done() == 0);
  // With the checksum off, only the shapes are compared (the caller vouches for the values).
  parallel_model<actor> unchecked(groups, {.test_init = true, .batch_checksum = false});
  auto unchecked_trainer = make_trainer(unchecked, groups);
  const step_metrics m = unchecked_trainer.step(rb, 2);
  CHECK(std::isfinite(m.loss));
}

TEST_CASE("a call's options are checked with its batch: temperature, learning rate, loss settings, micro-batches",
          "[world4][agreement]") {
  auto groups = parallel_groups::build(dist(), tp2);
  parallel_model<actor> model(groups, {.test_init = true});
  const padded_batch b = make_batch(tiny_llama::shape.vocab, true, 7 + static_cast<std::uint64_t>(groups.me.dp));
  {
    c10::NoGradGuard no_grad;
    global_comm_stats().reset();
    model.forward({.input_ids = b.ids, .attention_mask = b.mask}, {.temperature = 0.7});
    CHECK(global_comm_stats().check_calls == 1);  // still one all-gather for batch and options
    // tp ranks 0 and 1 of a replica at different temperatures: log-probs that match neither.
    REQUIRE_THROWS_MATCHES(model.forward({.input_ids = b.ids, .attention_mask = b.mask},
                                         {.temperature = dist().rank() == 1 ? 0.5 : 1.0}),
                           agreement_error,
                           Catch::Message("megadsl: the ranks made forward with different options: temperature is 1 on "
                                          "ranks 0, 2, 3, 0.5 on rank 1; every rank must make the same call with the same "
                                          "options"));
  }
  const rollout_batch rb = make_rollout(tiny_llama::shape.vocab);
  auto trainer = make_trainer(model, groups, {.lr = dist().rank() == 2 ? 2e-5 : 1e-5});
  REQUIRE_THROWS_WITH(trainer.step(rb, 2), Catch::Matchers::Contains("the ranks made a training step with different "
                                                                     "options: lr is 1.0000000000000001e-05 on ranks 0, 1, 3, "
                                                                     "2.0000000000000002e-05 on rank 2"));
  CHECK(trainer.steps_done() == 0);
  auto same = make_trainer(model, groups, {}, {.clip_ratio = dist().rank() == 0 ? 0.3 : 0.2});
  REQUIRE_THROWS_WITH(same.step(rb, 2), Catch::Matchers::Contains("clip_ratio is 0.29999999999999999 on rank 0, "
                                                                  "0.20000000000000001 on ranks 1, 2, 3"));
  // Different micro-batch counts used to abort inside Gloo (a 1536- against a 768-element exchange).
  auto fine = make_trainer(model, groups);
  REQUIRE_THROWS_WITH(fine.step(rb, dist().rank() == 3 ? 1 : 2),
                      Catch::Matchers::Contains("microbatches is 2 on ranks 0, 1, 2, 1 on rank 3"));
  CHECK(std::isfinite(fine.step(rb, 2).loss));  // and the ranks go on together
}

TEST_CASE("a step whose gradient norm is not finite is skipped on every rank", "[world4][agreement]") {
  auto groups = parallel_groups::build(dist(), layout{.tp = 2, .sp = true});
  parallel_model<actor> model(groups, {.test_init = true});
  auto trainer = make_trainer(model, groups);
  rollout_batch rb = make_rollout(tiny_llama::shape.vocab);
  std::vector<at::Tensor> before;
  for (const auto& p : model.parameters()) before.push_back(p.tensor.detach().clone());
  rollout_batch bad = rb;
  bad.advantages = rb.advantages.clone();
  // A trained position of a row of the second dp replica (row 5 holds positions 7-11; 6-10 are trained).
  bad.advantages[5][8] = std::numeric_limits<float>::quiet_NaN();
  const step_metrics m = trainer.step(bad, 2);
  CHECK(m.skipped);
  CHECK(std::isnan(m.grad_norm));
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(at::equal(before[i], model.parameters()[i].tensor));
  CHECK(trainer.steps_done() == 0);
  CHECK(trainer.steps_skipped() == 1);
  const step_metrics next = trainer.step(rb, 2);
  CHECK_FALSE(next.skipped);
  CHECK(std::isfinite(next.grad_norm));
  CHECK(trainer.steps_done() == 1);
}

}  // namespace megadsl::test
