// Offload between phases: parameters, gradients and optimizer state moved to host memory and back,
// each separately; nothing is left on the device, and training goes on as if nothing had moved.
#include "../catch_torch.hpp"

#include "megadsl/runtime/trainer.hpp"
#include "mp_support.hpp"

namespace megadsl::test {

namespace {

// `distributed`: Megatron's distributed optimizer (its slices are views of the parameters; the
// gradients are reduce-scattered and none is kept after the step), else the replicated one (the
// whole gradients stay until the next step).
void check_offload(bool distributed) {
  INFO((distributed ? "distributed" : "replicated") << " optimizer");
  constexpr layout l{.tp = 2};  // dp 2
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const optimizer_config opt{.lr = 1e-4, .eps = 1e-6, .distributed = distributed};
  const actor_loss_config acfg{.clip_ratio = 0.2};
  auto groups = parallel_groups::build(dist(), l);
  parallel_model<causal_lm<tiny8, l>> a(groups, test_options<tiny8>()), b(groups, test_options<tiny8>());
  trainer ta = make_trainer(a, groups, opt, acfg), tb = make_trainer(b, groups, opt, acfg);
  for (int step = 0; step < 2; ++step) {
    (void)ta.step(rb, 2);
    (void)tb.step(rb, 2);
  }
  const std::int64_t params = a.parameter_bytes(), grads = a.gradient_bytes(), moments = ta.optimizer_bytes();
  REQUIRE(params > 0);
  REQUIRE(grads == (distributed ? 0 : params));
  REQUIRE(moments > 0);
  // Each separately: the parameters only, then the rest.
  a.offload(/*params=*/true, /*grads=*/false);
  CHECK(a.parameter_bytes() == 0);
  CHECK(a.gradient_bytes() == grads);
  a.offload(false, true);
  ta.offload_optimizer();
  CHECK(a.gradient_bytes() == 0);
  CHECK(ta.optimizer_bytes() == 0);  // below 5% of what they held: nothing
  CHECK_THROWS_WITH(a.forward({.input_ids = rb.input_ids, .attention_mask = rb.attention_mask}),
                    Catch::Contains("parameters are offloaded to host memory; call reload() first"));
  a.reload();
  CHECK_THROWS_WITH(ta.step(rb, 2), Catch::Contains("the optimizer state is offloaded to host memory; call reload_optimizer()"));
  ta.reload_optimizer();
  CHECK(a.parameter_bytes() == params);
  CHECK(ta.optimizer_bytes() == moments);
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    INFO(a.parameters()[i].name);
    CHECK(at::equal(a.parameters()[i].tensor, b.parameters()[i].tensor));
    const at::Tensor& ga = a.parameters()[i].tensor.grad();
    REQUIRE(ga.defined() == b.parameters()[i].tensor.grad().defined());
    if (ga.defined()) CHECK(at::equal(ga, b.parameters()[i].tensor.grad()));
  }
  // Training goes on bit for bit as the model that never moved.
  for (int step = 0; step < 2; ++step) {
    const step_metrics ma = ta.step(rb, 2), mb = tb.step(rb, 2);
    CHECK(ma.loss == mb.loss);
    CHECK(ma.grad_norm == mb.grad_norm);
  }
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    INFO(a.parameters()[i].name);
    CHECK(at::equal(a.parameters()[i].tensor, b.parameters()[i].tensor));
  }
}

}  // namespace

TEST_CASE("offloading parameters, gradients and optimizer state frees them and changes no number",
          "[world4][training][offload]") {
  check_offload(false);
  check_offload(true);
}

}  // namespace megadsl::test
