// Layout checks shared by the multi-process tests: a layout's inference and five PPO steps against
// the single-process model.
#pragma once

#include "../catch_torch.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "megadsl/runtime/trainer.hpp"
#include "mp_support.hpp"

namespace megadsl::test {

// Log-probs and entropy (actor) or values (critic) of a left- or right-padded batch equal one
// process's within 1e-5.
template <class M, layout L, bool Actor>
inline void check_inference(bool left) {
  using spec = std::conditional_t<Actor, causal_lm<M, L>, value_model<M, L>>;
  using ref_spec = std::conditional_t<Actor, causal_lm<M>, value_model<M>>;
  INFO(M::name << (Actor ? " actor" : " critic") << " tp=" << L.tp.get() << " pp=" << L.pp.get() << " vpp=" << L.vpp.get()
               << " cp=" << L.cp.get() << " sp=" << L.sp.get() << " rmpad=" << L.rmpad.get());
  const model_options opt = test_options<M>();
  auto single = parallel_groups::single();
  parallel_model<ref_spec> ref(single, opt);
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<spec> model(groups, opt);
  const padded_batch pb = make_batch(M::shape.vocab, left);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output r = ref.forward(b), o = model.forward(b);
  if constexpr (Actor) {
    CHECK(max_abs_diff(r.log_probs, o.log_probs) <= 1e-5);
    CHECK(max_abs_diff(r.entropy, o.entropy) <= 1e-5);
  } else {
    CHECK(max_abs_diff(r.values, o.values) <= 1e-5);
  }
}

// Five PPO steps (loss, grad norm, then every parameter) equal one process's within 1e-5, and the
// parameters moved; with `dropout`, both train at those rates (the same masks in any layout).
template <class M, layout L, bool Actor>
inline void check_training(std::int64_t microbatches, const micro_batch_options* budget = nullptr,
                           const dropout_rates& dropout = {}) {
  using spec = std::conditional_t<Actor, causal_lm<M, L>, value_model<M, L>>;
  using ref_spec = std::conditional_t<Actor, causal_lm<M>, value_model<M>>;
  INFO(M::name << (Actor ? " actor" : " critic") << " tp=" << L.tp.get() << " pp=" << L.pp.get()
               << " vpp=" << L.vpp.get() << " cp=" << L.cp.get() << " sp=" << L.sp.get() << " rmpad=" << L.rmpad.get()
               << " microbatches=" << microbatches << " " << describe(dropout));
  model_options mopt = test_options<M>();
  mopt.dropout = dropout;
  // Adam divides by sqrt(v) + eps: an element whose gradient is near zero turns fp32
  // summation-order noise (~1e-9 here, different across layouts and GEMM shapes) into an update
  // difference of up to lr * noise / eps. With eps 1e-6 that bound is 1e-7 per step, and at lr 1e-4
  // five steps still move the parameters by ~5e-4 (checked below); with the default 1e-8 the bound
  // is 1e-5 per step, and whether a layout passes depends on the BLAS's blocking.
  const optimizer_config opt{.lr = 1e-4, .eps = 1e-6, .weight_decay = 0.01, .clip_grad = 1.0};
  const actor_loss_config acfg{.clip_ratio = 0.2, .entropy_coeff = 0.01, .kl_coeff = 0.05};
  const rollout_batch rb = make_rollout(M::shape.vocab);

  auto single = parallel_groups::single();
  parallel_model<ref_spec> ref(single, mopt);
  trainer ref_trainer = make_trainer(ref, single, opt, acfg);
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<spec> model(groups, mopt);
  trainer t = make_trainer(model, groups, opt, acfg);

  for (int step = 0; step < 5; ++step) {
    const step_metrics a = ref_trainer.step(rb, 1);
    const step_metrics b = budget != nullptr ? t.step(rb, *budget) : t.step(rb, microbatches);
    INFO("step " << step);
    CHECK(std::abs(a.loss - b.loss) <= 1e-5 * std::max(1.0, std::abs(a.loss)));
    CHECK(std::abs(a.grad_norm - b.grad_norm) <= 1e-5 * std::max(1.0, a.grad_norm));
  }
  const auto want = gather_hf_tensors(ref.parameters(), ref.config(), nullptr, false);
  const auto got = gather_hf_tensors(model.parameters(), model.config(), groups.tp.get(), false);
  REQUIRE(!got.empty());
  double worst = 0;
  for (const auto& [name, value] : got) {
    INFO("parameter " << name);
    REQUIRE(want.count(name) == 1);
    worst = std::max(worst, max_abs_diff(want.at(name), value));
    CHECK(max_abs_diff(want.at(name), value) <= 1e-5);
  }
  // The parameters moved (the comparison is not between untouched initial values).
  const auto initial = [&] {
    parallel_model<ref_spec> fresh(single, mopt);
    return gather_hf_tensors(fresh.parameters(), fresh.config(), nullptr, false);
  }();
  double moved = 0;
  for (const auto& [name, value] : want) moved = std::max(moved, max_abs_diff(initial.at(name), value));
  INFO("largest difference from single-process training " << worst << ", largest change by training " << moved);
  CHECK(moved > 1e-4);
}

}  // namespace megadsl::test
