// Megatron's distributed optimizer (optimizer_config::distributed, the default): AdamW's moments
// sharded over dp (over the expert-data-parallel group for experts), the same training as the
// replicated optimizer, 1/dp of its state per rank, and checkpoints that reshard.
#include "../catch_torch.hpp"

#include <filesystem>

#include "megadsl/runtime/dist_checkpoint.hpp"
#include "megadsl/runtime/trainer.hpp"
#include "mp_support.hpp"

namespace megadsl::test {
namespace {

namespace fs = std::filesystem;

constexpr actor_loss_config loss_config{.clip_ratio = 0.2, .entropy_coeff = 0.01, .kl_coeff = 0.05};

optimizer_config optimizer(bool distributed) {
  return {.lr = 1e-4, .eps = 1e-6, .weight_decay = 0.01, .clip_grad = 1.0, .distributed = distributed};
}

// Every parameter of this rank, by name (copies).
std::map<std::string, at::Tensor> snapshot(std::vector<named_parameter>& params) {
  std::map<std::string, at::Tensor> out;
  for (const named_parameter& p : params) out[p.name] = p.tensor.detach().clone();
  return out;
}

std::int64_t parameter_elements(std::vector<named_parameter>& params) {
  std::int64_t n = 0;
  for (const named_parameter& p : params) n += p.tensor.numel();
  return n;
}

// Five steps with the distributed and with the replicated optimizer at layout L: the same
// losses, norms and parameters (within 1e-6: reduce-scatter sums in another order), and the sharded state
// is 1/(dp cp) of the replicated one (up to each parameter's padding to a multiple of dp cp).
template <class M, layout L>
void check_same_training() {
  // The gradients' domain, over which the state is sharded: dp x cp.
  const std::int64_t dp = dist().world() / (L.tp.get() * L.pp.get());
  INFO(M::name << " tp=" << L.tp.get() << " pp=" << L.pp.get() << " ep=" << L.ep.get() << " cp=" << L.cp.get()
               << " dp x cp=" << dp);
  const rollout_batch rb = make_rollout(M::shape.vocab);
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<M, L>> a(groups, test_options<M>()), b(groups, test_options<M>());
  trainer ta = make_trainer(a, groups, optimizer(true), loss_config);
  trainer tb = make_trainer(b, groups, optimizer(false), loss_config);
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const step_metrics ma = ta.step(rb, 2), mb = tb.step(rb, 2);
    // The gradients are reduce-scattered (the distributed optimizer) instead of all-reduced, and
    // the norm summed over slices: the same sums in another order.
    CHECK(std::abs(ma.loss - mb.loss) <= 1e-6 * std::max(1.0, std::abs(mb.loss)));
    CHECK(std::abs(ma.grad_norm - mb.grad_norm) <= 1e-6 * std::max(1.0, mb.grad_norm));
  }
  const auto pa = snapshot(a.parameters()), pb = snapshot(b.parameters());
  double worst = 0;
  for (const auto& [name, t] : pa) worst = std::max(worst, max_abs_diff(t, pb.at(name)));
  CHECK(worst <= 1e-6);
  // The whole moments, gathered, are the replicated optimizer's.
  const training_state sa = ta.export_state(), sb = tb.export_state();
  REQUIRE(sa.exp_avg.size() == sb.exp_avg.size());
  CHECK(sa.adam_step == sb.adam_step);
  for (std::size_t i = 0; i < sa.exp_avg.size(); ++i) {
    CHECK(max_abs_diff(sa.exp_avg[i], sb.exp_avg[i]) <= 1e-7);
    CHECK(max_abs_diff(sa.exp_avg_sq[i], sb.exp_avg_sq[i]) <= 1e-9);
  }
  // State per rank: 8 bytes per parameter replicated; distributed, 8/dp (an expert's 8/(dp/ep),
  // its replicas being the expert-data-parallel group's), up to each parameter's padding.
  const auto full = static_cast<double>(tb.optimizer_bytes()), sharded = static_cast<double>(ta.optimizer_bytes());
  CHECK(full == 8.0 * static_cast<double>(parameter_elements(b.parameters())));
  double expected = 0;
  for (const named_parameter& p : b.parameters()) {
    const bool expert = p.plan->row->where == placement::expert;
    expected += 8.0 * static_cast<double>(p.tensor.numel()) / static_cast<double>(expert ? dp / L.ep.get() : dp);
  }
  INFO("optimizer bytes per rank: replicated " << full << ", distributed " << sharded << ", 1/dp of each " << expected);
  CHECK(sharded <= expected + 8.0 * static_cast<double>(b.parameters().size()));
  CHECK(sharded >= expected - 8.0 * static_cast<double>(b.parameters().size()));
  CHECK(sharded < full / 1.9);
}

// Loads the checkpoint in `dir` at layout L with the distributed and with the replicated optimizer:
// two more steps give the same parameters.
template <layout L>
void resume_elsewhere(const fs::path& dir, const rollout_batch& rb) {
  INFO("resumed at tp=" << L.tp.get() << " pp=" << L.pp.get() << " vpp=" << L.vpp.get() << " cp=" << L.cp.get());
  std::map<std::string, at::Tensor> resumed[2];
  for (bool distributed : {true, false}) {
    auto groups = parallel_groups::build(dist(), L);
    parallel_model<causal_lm<tiny8, L>> m(groups, {.seed = 99, .test_init = true});
    trainer t = make_trainer(m, groups, optimizer(distributed), loss_config);
    load_distributed(m, groups, dir, &t);
    CHECK(t.export_state().adam_step == 3);
    for (int step = 0; step < 2; ++step) (void)t.step(rb, 2);
    resumed[distributed ? 0 : 1] = snapshot(m.parameters());
  }
  for (const auto& [name, value] : resumed[0]) {
    INFO(name);
    CHECK(max_abs_diff(value, resumed[1].at(name)) <= 1e-7);
  }
}

}  // namespace

TEST_CASE("the distributed optimizer trains like the replicated one at dp 2 (tp 2) and dp 4, with 1/dp of its state",
          "[world4][training][distributed_optimizer]") {
  check_same_training<tiny8, layout{.tp = 2}>();
  check_same_training<tiny8, layout{}>();
  check_same_training<tiny8_tied, layout{.pp = 2}>();
  check_same_training<tiny8, layout{.rmpad = true, .cp = 2}>();  // sliced over dp 2 x cp 2
}

TEST_CASE("the distributed optimizer shards an expert's state over the expert-data-parallel group (ep 2)",
          "[world4][training][distributed_optimizer][moe]") {
  check_same_training<tiny8_mixtral, layout{.ep = 2}>();
  check_same_training<tiny8_mixtral, layout{.cp = 2, .ep = 2}>();  // ep across the cp ranks
}

TEST_CASE("a checkpoint of the distributed optimizer resumes at dp 4 as the run would have gone on, and at another layout "
          "as the replicated optimizer does", "[world4][training][distributed_optimizer][dist_checkpoint]") {
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const fs::path dir = fs::temp_directory_path() /
                       ("megadsl-test-" + std::string(std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "0") +
                        "-distopt");
  constexpr layout four{};
  std::map<std::string, at::Tensor> uninterrupted;
  {
    auto groups = parallel_groups::build(dist(), four);
    parallel_model<causal_lm<tiny8, four>> m(groups, test_options<tiny8>());
    trainer t = make_trainer(m, groups, optimizer(true), loss_config);
    for (int step = 0; step < 3; ++step) (void)t.step(rb, 2);
    save_distributed(m, groups, dir, &t);
    for (int step = 0; step < 2; ++step) (void)t.step(rb, 2);
    uninterrupted = snapshot(m.parameters());
  }
  {  // dp 4 again: bit for bit the run that went on
    auto groups = parallel_groups::build(dist(), four);
    parallel_model<causal_lm<tiny8, four>> m(groups, {.seed = 99, .test_init = true});
    trainer t = make_trainer(m, groups, optimizer(true), loss_config);
    load_distributed(m, groups, dir, &t);
    for (int step = 0; step < 2; ++step) (void)t.step(rb, 2);
    for (const auto& [name, value] : snapshot(m.parameters())) {
      INFO(name);
      CHECK(at::equal(value, uninterrupted.at(name)));
    }
  }
  // Another layout: the distributed and the replicated optimizer resume alike.
  resume_elsewhere<layout{.tp = 2}>(dir, rb);           // dp 4 -> tp 2 x dp 2
  resume_elsewhere<layout{.pp = 2, .vpp = 2}>(dir, rb);  // dp 4 -> pp 2 (interleaved) x dp 2
  resume_elsewhere<layout{.rmpad = true, .cp = 2}>(dir, rb);  // dp 4 -> cp 2 x dp 2
  auto groups = parallel_groups::build(dist(), four);
  groups.world->barrier();
  if (dist().rank() == 0) fs::remove_all(dir);
}

}  // namespace megadsl::test
