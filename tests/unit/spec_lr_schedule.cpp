// Megatron's OptimizerParamScheduler and constant micro-batch calculator
// (megatron-core-semantics.md §5): values at chosen steps for every style, each computed by hand
// from the reference's formulas (the arithmetic is in the comments), the constructor's assertions,
// the checkpoint state and the micro-batch count with its rule message.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <catch2/catch.hpp>

#include "megadsl/lr_schedule.hpp"

namespace {

using megadsl::lr_decay_style;
using megadsl::lr_schedule_config;
using megadsl::optimizer_param_scheduler;
using megadsl::wd_incr_style;
using megadsl::wsd_decay_style;

// max 1.0, min 0.1, warmup from 0 over 100 samples, decay until sample 1100 (1000 after warmup).
lr_schedule_config base(lr_decay_style style) {
  return {.init_lr = 0.0, .max_lr = 1.0, .min_lr = 0.1, .lr_warmup_steps = 100, .lr_decay_steps = 1100,
          .decay_style = style};
}

double lr_at(lr_schedule_config c, std::int64_t samples) {
  optimizer_param_scheduler s(c);
  s.step(samples);
  return s.lr();
}

double wd_at(lr_schedule_config c, std::int64_t samples, double wd_mult = 1.0) {
  optimizer_param_scheduler s(c);
  s.step(samples);
  return s.weight_decay(wd_mult);
}

Approx exact(double v) { return Approx(v).epsilon(1e-12).margin(1e-15); }

static_assert(megadsl::check_micro_batches(256, 4, 8).ok());
static_assert(megadsl::check_micro_batches(100, 4, 8).has("global_batch_divisible"));
static_assert(megadsl::samples_per_iteration(8, 4, 8) == 256);

}  // namespace

TEST_CASE("linear warmup, then linear decay", "[lr]") {
  const auto c = base(lr_decay_style::linear);
  CHECK(lr_at(c, 0) == exact(0.0));     // warmup: 0 + (1 - 0) * 0/100
  CHECK(lr_at(c, 50) == exact(0.5));    // 0 + 1 * 50/100
  CHECK(lr_at(c, 100) == exact(1.0));   // n <= warmup still warms up: 100/100
  CHECK(lr_at(c, 600) == exact(0.55));  // r = (600-100)/1000 = 0.5; 0.1 + (1-0.5) * 0.9
  CHECK(lr_at(c, 850) == exact(0.325)); // r = 0.75; 0.1 + 0.25 * 0.9
  CHECK(lr_at(c, 1100) == exact(0.1));  // r = 1; coeff 0
  CHECK(lr_at(c, 1101) == exact(0.1));  // n > decay: min_lr
  // Warmup from init_lr = 0.1: 0.1 + (1 - 0.1) * 25/100 = 0.325.
  auto warm = c;
  warm.init_lr = 0.1;
  CHECK(lr_at(warm, 25) == exact(0.325));
  // No warmup: decay starts at max_lr; r = 0 at n = 0.
  auto cold = c;
  cold.lr_warmup_steps = 0;
  CHECK(lr_at(cold, 0) == exact(1.0));
  CHECK(lr_at(cold, 550) == exact(0.55));  // r = 550/1100 = 0.5
}

TEST_CASE("cosine decay", "[lr]") {
  const auto c = base(lr_decay_style::cosine);
  CHECK(lr_at(c, 50) == exact(0.5));  // warmup as linear
  // r = 0.25: coeff = 0.5 (cos(pi/4) + 1) = 0.5 * 1.7071067811865475 = 0.8535533905932737;
  // 0.1 + 0.9 * 0.8535533905932737 = 0.8681980515339464
  CHECK(lr_at(c, 350) == exact(0.8681980515339464));
  CHECK(lr_at(c, 600) == exact(0.55));  // r = 0.5: coeff 0.5 (cos(pi/2) + 1) = 0.5
  // r = 0.75: coeff = 0.5 (cos(3pi/4) + 1) = 0.1464466094067262; 0.1 + 0.9 * that = 0.2318019484660536
  CHECK(lr_at(c, 850) == exact(0.2318019484660536));
  CHECK(lr_at(c, 1100) == exact(0.1));  // r = 1: coeff 0
  CHECK(lr_at(c, 5000) == exact(0.1));
}

TEST_CASE("constant after warmup, even past the decay steps", "[lr]") {
  const auto c = base(lr_decay_style::constant);
  CHECK(lr_at(c, 50) == exact(0.5));
  CHECK(lr_at(c, 101) == exact(1.0));
  CHECK(lr_at(c, 5000) == exact(1.0));  // the constant check comes before n > decay
}

TEST_CASE("inverse square root", "[lr]") {
  const auto c = base(lr_decay_style::inverse_square_root);
  CHECK(lr_at(c, 100) == exact(1.0));                 // warmup's last step
  CHECK(lr_at(c, 400) == exact(0.5));                 // 1 * sqrt(100) / sqrt(400) = 10/20
  CHECK(lr_at(c, 900) == exact(1.0 / 3.0));           // 10/30
  CHECK(lr_at(c, 1100) == exact(0.30151134457776363)); // 10/sqrt(1100)
  CHECK(lr_at(c, 1101) == exact(0.1));                // past decay: min_lr
  // The floor at min_lr: decay far away, min 0.08. 10/sqrt(10000) = 0.1; 10/sqrt(40000) = 0.05 -> 0.08.
  auto far = c;
  far.lr_decay_steps = 1000000;
  far.min_lr = 0.08;
  CHECK(lr_at(far, 10000) == exact(0.1));
  CHECK(lr_at(far, 40000) == exact(0.08));
  // No warmup: sqrt(max(0, 1)) / sqrt(max(n, 1)); n = 0 reads as 1 -> max_lr.
  auto cold = far;
  cold.lr_warmup_steps = 0;
  CHECK(lr_at(cold, 0) == exact(1.0));
  CHECK(lr_at(cold, 4) == exact(0.5));  // 1/sqrt(4)
}

TEST_CASE("warmup-stable-decay with each anneal style", "[lr]") {
  // Anneal over the last 200 samples: starts after 1100 - 200 = 900; r' = (n - 900)/200.
  auto c = base(lr_decay_style::wsd);
  c.wsd_decay_steps = 200;
  const auto with = [&](wsd_decay_style s) {
    auto d = c;
    d.wsd_style = s;
    return d;
  };
  for (auto s : {wsd_decay_style::linear, wsd_decay_style::cosine, wsd_decay_style::exponential,
                 wsd_decay_style::minus_sqrt}) {
    INFO(megadsl::name_of(s));
    CHECK(lr_at(with(s), 50) == exact(0.5));   // warmup
    CHECK(lr_at(with(s), 800) == exact(1.0));  // stable: coeff 1
    CHECK(lr_at(with(s), 900) == exact(1.0));  // n <= anneal start
    CHECK(lr_at(with(s), 1100) == exact(0.1)); // r' = 1: every style reaches coeff 0
    CHECK(lr_at(with(s), 1200) == exact(0.1)); // past decay
  }
  // r' = 0.5 (n = 1000):
  CHECK(lr_at(with(wsd_decay_style::linear), 1000) == exact(0.55));  // 1 - 0.5
  CHECK(lr_at(with(wsd_decay_style::cosine), 1000) == exact(0.55));  // 0.5 (cos(pi/2) + 1)
  // 2 * 0.5^0.5 - 1 = 0.41421356237309515; 0.1 + 0.9 * that = 0.4727922061357856
  CHECK(lr_at(with(wsd_decay_style::exponential), 1000) == exact(0.4727922061357856));
  // 1 - sqrt(0.5) = 0.2928932188134524; 0.1 + 0.9 * that = 0.36360389693210716
  CHECK(lr_at(with(wsd_decay_style::minus_sqrt), 1000) == exact(0.36360389693210716));
  // r' = 0.25 (n = 950):
  CHECK(lr_at(with(wsd_decay_style::linear), 950) == exact(0.775));  // 0.1 + 0.75 * 0.9
  CHECK(lr_at(with(wsd_decay_style::cosine), 950) == exact(0.8681980515339464));  // as cosine r = 0.25
  // 0.5^0.25 = 0.8408964152537145; 2 * that - 1 = 0.681792830507429; 0.1 + 0.9 * that = 0.7136135474566861
  CHECK(lr_at(with(wsd_decay_style::exponential), 950) == exact(0.7136135474566861));
  CHECK(lr_at(with(wsd_decay_style::minus_sqrt), 950) == exact(0.55));  // 1 - sqrt(0.25) = 0.5
}

TEST_CASE("weight decay: constant, linear and cosine ramps", "[lr]") {
  auto c = base(lr_decay_style::linear);
  c.start_wd = 0.0;
  c.end_wd = 0.1;
  c.wd_incr_steps = 1000;
  c.wd_style = wd_incr_style::linear;
  CHECK(wd_at(c, 0) == exact(0.0));
  CHECK(wd_at(c, 250) == exact(0.025));        // r = 0.25
  CHECK(wd_at(c, 250, 0.5) == exact(0.0125));  // times wd_mult
  CHECK(wd_at(c, 1000) == exact(0.1));         // r = 1
  CHECK(wd_at(c, 1001) == exact(0.1));         // past the ramp: end_wd
  c.wd_style = wd_incr_style::cosine;
  CHECK(wd_at(c, 0) == exact(0.0));    // 0.5 (cos(pi) + 1) = 0
  CHECK(wd_at(c, 500) == exact(0.05)); // 0.5 (cos(pi/2) + 1) = 0.5
  // 0.5 (cos(0.75 pi) + 1) = 0.1464466094067262; times 0.1
  CHECK(wd_at(c, 250) == exact(0.01464466094067262));
  CHECK(wd_at(c, 1000) == exact(0.1)); // 0.5 (cos(0) + 1) = 1
  auto constant = base(lr_decay_style::linear);
  constant.start_wd = constant.end_wd = 0.01;
  CHECK(wd_at(constant, 0) == exact(0.01));
  CHECK(wd_at(constant, 123456) == exact(0.01));
  CHECK(wd_at(constant, 5, 0.0) == exact(0.0));  // wd_mult 0: biases and norms
}

TEST_CASE("steps are samples; iterations convert through the global batch", "[lr]") {
  optimizer_param_scheduler s(base(lr_decay_style::linear));
  const std::int64_t per_iteration = megadsl::samples_per_iteration(4, 2, 4);  // 4 micro * mbs 2 * dp 4 = 32
  for (int i = 0; i < 3; ++i) s.step(per_iteration);
  CHECK(s.num_steps() == 96);
  CHECK(s.lr() == exact(0.96));  // warmup 96/100

  // train 1000 iterations of 32: decay 32000 samples, weight-decay ramp 32000, warmup 1% = 320.
  const auto c = megadsl::from_iterations({.train_iters = 1000, .global_batch_size = 32, .lr_warmup_fraction = 0.01},
                                          {.max_lr = 1.0, .min_lr = 0.1});
  CHECK(c.lr_decay_steps == 32000);
  CHECK(c.wd_incr_steps == 32000);
  CHECK(c.lr_warmup_steps == exact(320.0));
  const auto d = megadsl::from_iterations({.train_iters = 1000, .global_batch_size = 32, .lr_decay_iters = 800,
                                           .lr_warmup_iters = 10, .lr_wsd_decay_iters = 100},
                                          {.max_lr = 1.0});
  CHECK(d.lr_decay_steps == 25600);
  CHECK(d.wd_incr_steps == 32000);
  CHECK(d.lr_warmup_steps == exact(320.0));
  CHECK(d.wsd_decay_steps == 3200);
  CHECK(d.max_lr == 1.0);
}

TEST_CASE("the constructor's assertions, with the values in the message", "[lr]") {
  using Catch::Matchers::Equals;
  const auto with = [](auto edit) {
    auto c = base(lr_decay_style::linear);
    edit(c);
    return c;
  };
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.min_lr = -1; })),
                    Equals("megadsl: lr schedule: min_lr = -1 must be >= 0"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.max_lr = 0.05; })),
                    Equals("megadsl: lr schedule: max_lr = 0.05 must be >= min_lr = 0.1"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.init_lr = 2; })),
                    Equals("megadsl: lr schedule: init_lr = 2 must be <= max_lr = 1 (warmup rises from init_lr to "
                           "max_lr)"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.lr_decay_steps = 0; })),
                    Equals("megadsl: lr schedule: lr_decay_steps = 0 must be positive (steps are samples: iterations "
                           "* global batch)"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.lr_warmup_steps = 1100; })),
                    Equals("megadsl: lr schedule: lr_warmup_steps = 1100 must lie in [0, lr_decay_steps = 1100)"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.decay_style = lr_decay_style::wsd; })),
                    Equals("megadsl: lr schedule: the WSD decay style needs wsd_decay_steps > 0 (Megatron's "
                           "--lr-wsd-decay-iters times the global batch)"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.start_wd = 0.1; c.end_wd = 0.01; c.wd_style = wd_incr_style::linear; c.wd_incr_steps = 10; })),
                    Equals("megadsl: lr schedule: end_wd = 0.01 must be >= start_wd = 0.1"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.end_wd = 0.1; })),
                    Equals("megadsl: lr schedule: a constant weight decay needs start_wd == end_wd (got 0 and 0.1); "
                           "use wd_style linear or cosine for a ramp"));
  CHECK_THROWS_WITH(optimizer_param_scheduler(with([](auto& c) { c.end_wd = 0.1; c.wd_style = wd_incr_style::cosine; })),
                    Equals("megadsl: lr schedule: a cosine weight-decay ramp needs wd_incr_steps > 0"));
}

TEST_CASE("checkpoint state: a plain struct, loaded by Megatron's three policies", "[lr]") {
  optimizer_param_scheduler trained(base(lr_decay_style::cosine));
  trained.step(350);
  const megadsl::lr_scheduler_state saved = trained.state();
  CHECK(saved.num_steps == 350);

  optimizer_param_scheduler resumed(base(lr_decay_style::cosine));
  resumed.load(saved);  // use_checkpoint (Megatron's default)
  CHECK(resumed.num_steps() == 350);
  CHECK(resumed.lr() == exact(trained.lr()));

  auto other = base(lr_decay_style::linear);
  other.max_lr = 2.0;
  optimizer_param_scheduler taken(other);
  taken.load(saved, megadsl::checkpoint_values::use_checkpoint);  // the checkpoint's cosine schedule wins
  CHECK(taken.lr() == exact(0.8681980515339464));
  optimizer_param_scheduler kept(other);
  kept.load(saved, megadsl::checkpoint_values::override_with_class);  // own linear schedule, saved count
  CHECK(kept.num_steps() == 350);
  CHECK(kept.lr() == exact(0.1 + 0.75 * 1.9));  // r = 0.25, max 2.0: 0.1 + (1 - 0.25) * (2.0 - 0.1)
  optimizer_param_scheduler strict(other);
  CHECK_THROWS_WITH(strict.load(saved, megadsl::checkpoint_values::must_match),
                    "megadsl: lr schedule: the constructor's max_lr (2) and the checkpoint's (1) do not match");
}

TEST_CASE("resuming a WSD run from a stable-phase checkpoint keeps the new anneal (Megatron's policy)", "[lr]") {
  // Trained with a 100-step exponential anneal planned; stopped in the stable phase.
  lr_schedule_config planned = base(lr_decay_style::wsd);
  planned.wsd_decay_steps = 100;
  planned.wsd_style = megadsl::wsd_decay_style::exponential;
  optimizer_param_scheduler trained(planned);
  trained.step(500);
  const megadsl::lr_scheduler_state saved = trained.state();
  CHECK(trained.lr() == exact(1.0));  // stable: max_lr

  // Resumed with a longer linear anneal and another warmup start: the state has neither, so
  // both stay the constructor's, while the checkpoint's max_lr, decay steps and count win.
  lr_schedule_config changed = planned;
  changed.wsd_decay_steps = 400;
  changed.wsd_style = megadsl::wsd_decay_style::linear;
  changed.init_lr = 0.5;
  changed.max_lr = 3.0;  // the checkpoint's 1.0 wins under use_checkpoint
  optimizer_param_scheduler resumed(changed);
  resumed.load(saved);
  CHECK(resumed.num_steps() == 500);
  CHECK(resumed.config().wsd_decay_steps == 400);
  CHECK(resumed.config().wsd_style == megadsl::wsd_decay_style::linear);
  CHECK(resumed.config().init_lr == 0.5);
  CHECK(resumed.config().max_lr == 1.0);
  // lr_decay_steps 1100: the new anneal starts at 700, the old one at 1000. At 1050 the new
  // linear anneal is 7/8 through (coeff 1/8); the old exponential one halfway (2 * 0.5^0.5 - 1).
  resumed.step(550);
  CHECK(resumed.lr() == exact(0.1 + 0.125 * 0.9));
  optimizer_param_scheduler old_plan(planned);
  old_plan.load(saved);
  old_plan.step(550);
  CHECK(old_plan.lr() == exact(0.1 + (2 * std::pow(0.5, 0.5) - 1) * 0.9));
}

TEST_CASE("constant micro-batch calculator", "[lr]") {
  using Catch::Matchers::Equals;
  CHECK(megadsl::num_micro_batches(256, 4, 8) == 8);  // 256 / (4 * 8)
  CHECK(megadsl::num_micro_batches(0, 4, 8) == 1);    // unset global batch: mbs * dp
  CHECK(megadsl::num_micro_batches(100, 4, 8, true) == 3);  // rounded down to 96
  CHECK_THROWS_WITH(megadsl::num_micro_batches(100, 4, 8),
                    Equals("megadsl: invalid batch sizes: global_batch_divisible: global batch 100 is not divisible by "
                           "micro batch 4 * dp 8 = 32; use a global batch of 96 or 128"));
  CHECK_THROWS_WITH(megadsl::num_micro_batches(16, 4, 8),
                    Equals("megadsl: invalid batch sizes: global_batch_divisible: global batch 16 is not divisible by "
                           "micro batch 4 * dp 8 = 32; use a global batch of 32 or 64"));
  CHECK_THROWS_WITH(megadsl::num_micro_batches(16, 4, 8, true),
                    Equals("megadsl: num_micro_batches: global batch 16 rounds down to 0 with micro batch 4 * dp 8 = "
                           "32; use a global batch of at least 32"));
  CHECK_THROWS_WITH(megadsl::num_micro_batches(64, 0, 8),
                    Equals("megadsl: invalid batch sizes: positive_sizes: micro_batch = 0 must be positive"));
}
