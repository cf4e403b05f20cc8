// Megatron's OptimizerParamScheduler (learning rate and weight decay over training) and its
// constant micro-batch calculator.
//
//   megadsl::optimizer_param_scheduler sched({.max_lr = 3e-4, .min_lr = 3e-5, .lr_warmup_steps = 2000 * 256,
//                                             .lr_decay_steps = 100000 * 256,
//                                             .decay_style = megadsl::lr_decay_style::cosine});
//   sched.step(num_micro * micro_batch * dp);   // once per iteration: steps count SAMPLES
//   optimizer.lr = sched.lr();  optimizer.weight_decay = sched.weight_decay();
//
// Steps are samples, not iterations (Megatron calls step(num_micro * mbs * dp) per iteration and
// multiplies every --*-iters argument by the global batch; from_iterations does that conversion).
// The state a checkpoint needs is one plain struct, lr_scheduler_state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>
#include <string_view>

#include "megadsl/layout.hpp"
#include "megadsl/rules.hpp"

namespace megadsl {

enum class lr_decay_style : std::uint8_t { constant, linear, cosine, inverse_square_root, wsd };
enum class wsd_decay_style : std::uint8_t { linear, cosine, exponential, minus_sqrt };
enum class wd_incr_style : std::uint8_t { constant, linear, cosine };

constexpr std::string_view name_of(lr_decay_style s) {
  constexpr std::string_view names[] = {"constant", "linear", "cosine", "inverse-square-root", "WSD"};
  return names[static_cast<std::size_t>(s)];
}
constexpr std::string_view name_of(wsd_decay_style s) {
  constexpr std::string_view names[] = {"linear", "cosine", "exponential", "minus_sqrt"};
  return names[static_cast<std::size_t>(s)];
}
constexpr std::string_view name_of(wd_incr_style s) {
  constexpr std::string_view names[] = {"constant", "linear", "cosine"};
  return names[static_cast<std::size_t>(s)];
}

// OptimizerParamScheduler's arguments; every step count is in samples. Defaults are Megatron's
// command-line defaults where it has one (--lr-decay-style linear, --lr-wsd-decay-style
// exponential, --weight-decay-incr-style constant).
struct lr_schedule_config {
  double init_lr = 0.0;  // --lr-warmup-init: where the linear warmup starts
  double max_lr = 0.0;   // --lr
  double min_lr = 0.0;   // --min-lr
  // A double because --lr-warmup-fraction makes it fraction * lr_decay_steps, not always whole.
  double lr_warmup_steps = 0.0;
  std::int64_t lr_decay_steps = 0;
  lr_decay_style decay_style = lr_decay_style::linear;
  std::int64_t wsd_decay_steps = 0;  // WSD only: length of the final anneal
  wsd_decay_style wsd_style = wsd_decay_style::exponential;
  double start_wd = 0.0;  // --start-weight-decay (--weight-decay when constant)
  double end_wd = 0.0;    // --end-weight-decay
  std::int64_t wd_incr_steps = 0;
  wd_incr_style wd_style = wd_incr_style::constant;
};

// Megatron's command line in iterations (training.py get_optimizer_param_scheduler).
struct lr_schedule_iterations {
  std::int64_t train_iters = 0;
  std::int64_t global_batch_size = 0;
  std::int64_t lr_decay_iters = 0;   // 0: train_iters
  std::int64_t lr_warmup_iters = 0;
  double lr_warmup_fraction = -1.0;  // >= 0: warmup = fraction * decay steps, instead of the iters
  std::int64_t lr_wsd_decay_iters = 0;
};

// `rates` with its step counts replaced by the iterations times the global batch:
// decay = lr_decay_iters * gbs, weight-decay ramp = train_iters * gbs, warmup = fraction * decay
// or lr_warmup_iters * gbs, WSD anneal = lr_wsd_decay_iters * gbs.
inline lr_schedule_config from_iterations(const lr_schedule_iterations& it, lr_schedule_config rates) {
  const std::int64_t gbs = it.global_batch_size;
  rates.lr_decay_steps = (it.lr_decay_iters > 0 ? it.lr_decay_iters : it.train_iters) * gbs;
  rates.wd_incr_steps = it.train_iters * gbs;
  rates.wsd_decay_steps = it.lr_wsd_decay_iters * gbs;
  rates.lr_warmup_steps = it.lr_warmup_fraction >= 0
                              ? it.lr_warmup_fraction * static_cast<double>(rates.lr_decay_steps)
                              : static_cast<double>(it.lr_warmup_iters * gbs);
  return rates;
}

// What a checkpoint stores: exactly the keys of Megatron's OptimizerParamScheduler.state_dict
// (max_lr, lr_warmup_steps, num_steps, lr_decay_style, lr_decay_steps, min_lr, start_wd, end_wd,
// wd_incr_style, wd_incr_steps). init_lr and the WSD anneal (length and style) are not in it, so
// loading keeps the constructor's: resuming a stable-phase checkpoint with a new anneal works.
struct lr_scheduler_state {
  std::int64_t num_steps = 0;
  double max_lr = 0.0, min_lr = 0.0, lr_warmup_steps = 0.0;
  std::int64_t lr_decay_steps = 0;
  lr_decay_style decay_style = lr_decay_style::linear;
  double start_wd = 0.0, end_wd = 0.0;
  std::int64_t wd_incr_steps = 0;
  wd_incr_style wd_style = wd_incr_style::constant;
};

// Megatron's two flags for a checkpoint's values: take them (use_checkpoint_opt_param_scheduler,
// the default), keep the constructor's (override_opt_param_scheduler), or require them to agree.
enum class checkpoint_values : std::uint8_t { use_checkpoint, override_with_class, must_match };

namespace detail {

inline std::string lr_number(double v) {  // %g: "0.0003", not std::to_string's "0.000300"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Megatron's constructor asserts, each with the values and the fix.
inline void check_lr_schedule(const lr_schedule_config& c) {
  const auto fail = [](const std::string& why) {
    throw std::invalid_argument("megadsl: lr schedule: " + why);
  };
  if (c.min_lr < 0) fail("min_lr = " + lr_number(c.min_lr) + " must be >= 0");
  if (c.max_lr < c.min_lr)
    fail("max_lr = " + lr_number(c.max_lr) + " must be >= min_lr = " + lr_number(c.min_lr));
  if (c.init_lr > c.max_lr)
    fail("init_lr = " + lr_number(c.init_lr) + " must be <= max_lr = " + lr_number(c.max_lr) +
         " (warmup rises from init_lr to max_lr)");
  if (c.lr_decay_steps <= 0)
    fail("lr_decay_steps = " + std::to_string(c.lr_decay_steps) + " must be positive (steps are samples: iterations * global batch)");
  if (c.lr_warmup_steps < 0 || c.lr_warmup_steps >= static_cast<double>(c.lr_decay_steps))
    fail("lr_warmup_steps = " + lr_number(c.lr_warmup_steps) + " must lie in [0, lr_decay_steps = " +
         std::to_string(c.lr_decay_steps) + ")");
  if (c.decay_style == lr_decay_style::wsd && c.wsd_decay_steps <= 0)
    fail("the WSD decay style needs wsd_decay_steps > 0 (Megatron's --lr-wsd-decay-iters times the global batch)");
  if (c.start_wd < 0) fail("start_wd = " + lr_number(c.start_wd) + " must be >= 0");
  if (c.end_wd < c.start_wd)
    fail("end_wd = " + lr_number(c.end_wd) + " must be >= start_wd = " + lr_number(c.start_wd));
  if (c.wd_style == wd_incr_style::constant && c.start_wd != c.end_wd)
    fail("a constant weight decay needs start_wd == end_wd (got " + lr_number(c.start_wd) + " and " +
         lr_number(c.end_wd) + "); use wd_style linear or cosine for a ramp");
  if (c.wd_style != wd_incr_style::constant && c.wd_incr_steps <= 0)
    fail("a " + std::string(name_of(c.wd_style)) + " weight-decay ramp needs wd_incr_steps > 0");
}

}  // namespace detail

class optimizer_param_scheduler {
 public:
  explicit optimizer_param_scheduler(const lr_schedule_config& config) : config_(config) {
    detail::check_lr_schedule(config_);
  }

  // Megatron's step(increment): count `samples` more (num_micro_batches * micro_batch * dp).
  void step(std::int64_t samples) { num_steps_ += samples; }

  [[nodiscard]] std::int64_t num_steps() const { return num_steps_; }
  [[nodiscard]] const lr_schedule_config& config() const { return config_; }

  // get_lr for the default parameter group.
  [[nodiscard]] double lr() const { return lr(config_.max_lr, config_.min_lr); }

  // get_lr for a parameter group with its own max_lr / min_lr (Megatron's param-group overrides).
  [[nodiscard]] double lr(double max_lr, double min_lr) const {
    const lr_schedule_config& c = config_;
    const auto n = static_cast<double>(num_steps_);
    const auto decay = static_cast<double>(c.lr_decay_steps);
    if (c.lr_warmup_steps > 0 && n <= c.lr_warmup_steps)  // linear warmup
      return c.init_lr + (max_lr - c.init_lr) * n / c.lr_warmup_steps;
    if (c.decay_style == lr_decay_style::constant) return max_lr;
    if (n > decay) return min_lr;
    if (c.decay_style == lr_decay_style::inverse_square_root) {
      const double warmup = std::max(c.lr_warmup_steps, 1.0), steps = std::max(n, 1.0);
      return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(steps));
    }
    const double ratio = (n - c.lr_warmup_steps) / (decay - c.lr_warmup_steps);  // in [0, 1]
    double coeff = 1.0;
    switch (c.decay_style) {
      case lr_decay_style::linear: coeff = 1.0 - ratio; break;
      case lr_decay_style::cosine: coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0); break;
      case lr_decay_style::wsd: {  // warmup, stable at max_lr, then anneal over the last wsd steps
        const double anneal_start = decay - static_cast<double>(c.wsd_decay_steps);
        if (n <= anneal_start) break;
        const double r = (n - anneal_start) / static_cast<double>(c.wsd_decay_steps);
        switch (c.wsd_style) {
          case wsd_decay_style::linear: coeff = 1.0 - r; break;
          case wsd_decay_style::cosine: coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0); break;
          case wsd_decay_style::exponential: coeff = 2.0 * std::pow(0.5, r) - 1.0; break;
          case wsd_decay_style::minus_sqrt: coeff = 1.0 - std::sqrt(r); break;
        }
        break;
      }
      default: break;
    }
    return min_lr + coeff * (max_lr - min_lr);
  }

  // get_wd times the group's wd_mult (0 for biases and norms in Megatron's default grouping).
  [[nodiscard]] double weight_decay(double wd_mult = 1.0) const {
    const lr_schedule_config& c = config_;
    if (num_steps_ > c.wd_incr_steps || c.wd_style == wd_incr_style::constant) return c.end_wd * wd_mult;
    const double ratio = static_cast<double>(num_steps_) / static_cast<double>(c.wd_incr_steps);
    const double coeff =
        c.wd_style == wd_incr_style::linear ? ratio : 0.5 * (std::cos(std::numbers::pi * (1.0 - ratio)) + 1.0);
    return (c.start_wd + coeff * (c.end_wd - c.start_wd)) * wd_mult;
  }

  [[nodiscard]] lr_scheduler_state state() const {
    const lr_schedule_config& c = config_;
    return {.num_steps = num_steps_, .max_lr = c.max_lr, .min_lr = c.min_lr, .lr_warmup_steps = c.lr_warmup_steps,
            .lr_decay_steps = c.lr_decay_steps, .decay_style = c.decay_style, .start_wd = c.start_wd,
            .end_wd = c.end_wd, .wd_incr_steps = c.wd_incr_steps, .wd_style = c.wd_style};
  }

  // Megatron's load_state_dict: settle each value the state holds by `policy` (the others stay
  // the constructor's), then step(num_steps) (so a fresh scheduler ends at the checkpoint's
  // count). must_match names the first value that differs.
  void load(const lr_scheduler_state& s, checkpoint_values policy = checkpoint_values::use_checkpoint) {
    if (policy == checkpoint_values::must_match) {
      const auto differ = [](std::string_view what, const std::string& mine, const std::string& theirs) {
        throw std::invalid_argument("megadsl: lr schedule: the constructor's " + std::string(what) + " (" + mine +
                                    ") and the checkpoint's (" + theirs + ") do not match");
      };
      const lr_schedule_config& a = config_;
      const lr_scheduler_state& b = s;
      if (a.max_lr != b.max_lr) differ("max_lr", detail::lr_number(a.max_lr), detail::lr_number(b.max_lr));
      if (a.min_lr != b.min_lr) differ("min_lr", detail::lr_number(a.min_lr), detail::lr_number(b.min_lr));
      if (a.lr_warmup_steps != b.lr_warmup_steps)
        differ("lr_warmup_steps", detail::lr_number(a.lr_warmup_steps), detail::lr_number(b.lr_warmup_steps));
      if (a.lr_decay_steps != b.lr_decay_steps)
        differ("lr_decay_steps", std::to_string(a.lr_decay_steps), std::to_string(b.lr_decay_steps));
      if (a.decay_style != b.decay_style)
        differ("decay_style", std::string(name_of(a.decay_style)), std::string(name_of(b.decay_style)));
      if (a.start_wd != b.start_wd) differ("start_wd", detail::lr_number(a.start_wd), detail::lr_number(b.start_wd));
      if (a.end_wd != b.end_wd) differ("end_wd", detail::lr_number(a.end_wd), detail::lr_number(b.end_wd));
      if (a.wd_incr_steps != b.wd_incr_steps)
        differ("wd_incr_steps", std::to_string(a.wd_incr_steps), std::to_string(b.wd_incr_steps));
      if (a.wd_style != b.wd_style)
        differ("wd_style", std::string(name_of(a.wd_style)), std::string(name_of(b.wd_style)));
    } else if (policy == checkpoint_values::use_checkpoint) {
      lr_schedule_config c = config_;  // init_lr, wsd_decay_steps, wsd_style: the constructor's
      c.max_lr = s.max_lr;
      c.min_lr = s.min_lr;
      c.lr_warmup_steps = s.lr_warmup_steps;
      c.lr_decay_steps = s.lr_decay_steps;
      c.decay_style = s.decay_style;
      c.start_wd = s.start_wd;
      c.end_wd = s.end_wd;
      c.wd_incr_steps = s.wd_incr_steps;
      c.wd_style = s.wd_style;
      detail::check_lr_schedule(c);
      config_ = c;
    }
    step(s.num_steps);
  }

 private:
  lr_schedule_config config_;
  std::int64_t num_steps_ = 0;
};

// ---- micro-batches per step ---------------------------------------------------------------------

// Rules for the constant calculator, worded as rules.hpp's global_batch_divisible.
constexpr violations check_micro_batches(std::int64_t global_batch, std::int64_t micro_batch, std::int64_t dp) {
  violations out;
  const struct {
    std::string_view name;
    std::int64_t value;
  } sizes[] = {{"global_batch", global_batch}, {"micro_batch", micro_batch}, {"dp", dp}};
  for (const auto& [name, value] : sizes)
    if (value <= 0) out.add("positive_sizes").add(name, " = ", value, " must be positive");
  if (!out.ok()) return out;
  const std::int64_t unit = micro_batch * dp;
  if (global_batch < unit)  // the rule's alternatives would start at 0
    out.add("global_batch_divisible")
        .add("global batch ", global_batch, " is not divisible by micro batch ", micro_batch, " * dp ", dp, " = ",
             unit, "; use a global batch of ", unit, " or ", 2 * unit);
  else  // tp = pp = cp = 1, so the rule's world is dp
    detail::check_run(layout{}, run_facts{.world = dp, .global_batch = global_batch, .micro_batch = micro_batch}, out);
  return out;
}

// Megatron's ConstantNumMicroBatchesCalculator: gbs / (mbs * dp). global_batch == 0 means
// mbs * dp (Megatron's default when --global-batch-size is unset); decrease_batch_size_if_needed
// rounds the global batch down to a multiple of mbs * dp instead of rejecting it.
inline std::int64_t num_micro_batches(std::int64_t global_batch, std::int64_t micro_batch, std::int64_t dp,
                                      bool decrease_batch_size_if_needed = false) {
  if (global_batch == 0) global_batch = micro_batch * dp;
  if (decrease_batch_size_if_needed && micro_batch > 0 && dp > 0) {
    const std::int64_t unit = micro_batch * dp;
    if (global_batch > 0 && global_batch < unit)
      throw std::invalid_argument("megadsl: num_micro_batches: global batch " + std::to_string(global_batch) +
                                  " rounds down to 0 with micro batch " + std::to_string(micro_batch) + " * dp " +
                                  std::to_string(dp) + " = " + std::to_string(unit) +
                                  "; use a global batch of at least " + std::to_string(unit));
    global_batch = global_batch / unit * unit;
  }
  const violations v = check_micro_batches(global_batch, micro_batch, dp);
  if (!v.ok()) throw std::invalid_argument("megadsl: invalid batch sizes: " + std::string(v.joined().view()));
  return global_batch / (micro_batch * dp);
}

// Samples one iteration consumes: what to pass to optimizer_param_scheduler::step.
constexpr std::int64_t samples_per_iteration(std::int64_t num_micro_batches, std::int64_t micro_batch, std::int64_t dp) {
  return num_micro_batches * micro_batch * dp;
}

}  // namespace megadsl
