// N PPO steps of an actor and a critic on the embedded tiny model, under any layout given on the
// command line (the layout type is `dynamic`; the shape stays static), logging loss, gradient
// norm, learning rate and tokens/s. The README's main job.
//
//   ./build/examples/02_ppo                                   # 4 ranks: tp 2 x pp 2
//   ./build/examples/02_ppo --ranks 8 --tp 2 --pp 2 --sp --rmpad --steps 10
//   ./build/examples/02_ppo --ranks 4 --pp 4 --vpp 1 --microbatches 4
//
// The synthetic task: every response token gets advantage +1 if its id is even, -1 if odd, so the
// policy should learn to prefer even tokens; the printed "even - odd" log-prob gap grows.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "megadsl/lr_schedule.hpp"
#include "megadsl/megadsl.hpp"
#include "megadsl/models/tiny.hpp"  // md::tiny_llama
#include "megadsl/runtime/trainer.hpp"

namespace md = megadsl;
using model = md::tiny_llama;
using actor = md::causal_lm<model, md::dynamic_layout>;
using critic = md::value_model<model, md::dynamic_layout>;

namespace {

struct options {
  md::layout layout{.tp = 2, .pp = 2};
  int steps = 8;
  std::int64_t microbatches = 2;
  std::int64_t batch = 16;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value after ") + argv[i]);
      return std::atoll(argv[++i]);
    };
    const std::string a = argv[i];
    if (a == "--tp") o.layout.tp = next();
    else if (a == "--pp") o.layout.pp = next();
    else if (a == "--vpp") o.layout.vpp = next();
    else if (a == "--sp") o.layout.sp = true;
    else if (a == "--rmpad") o.layout.rmpad = true;
    else if (a == "--steps") o.steps = static_cast<int>(next());
    else if (a == "--microbatches") o.microbatches = next();
    else if (a == "--batch") o.batch = next();
    else if (a == "--ranks") ++i;
    else throw std::invalid_argument("unknown flag " + a + " (flags: --ranks --tp --pp --vpp --sp --rmpad --steps --microbatches --batch)");
  }
  return o;
}

// Prompts of 6-10 tokens and responses of 4-8, left-padded to 16.
md::rollout_batch make_rollout(std::int64_t rows, std::uint64_t seed) {
  const std::int64_t s = 16, vocab = model::shape.vocab;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor prompt_len = at::randint(6, 11, {rows}, gen, at::kLong);
  const at::Tensor response_len = at::randint(4, 7, {rows}, gen, at::kLong);
  md::rollout_batch rb;
  rb.input_ids = at::randint(0, vocab, {rows, s}, gen, at::kLong);
  rb.attention_mask = at::zeros({rows, s}, at::kLong);
  rb.loss_mask = at::zeros({rows, s}, at::kFloat);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t p = prompt_len[r].item<std::int64_t>(), n = response_len[r].item<std::int64_t>();
    rb.attention_mask[r].narrow(0, s - p - n, p + n).fill_(1);
    rb.loss_mask[r].narrow(0, s - n - 1, n).fill_(1);  // position t predicts response token t+1
  }
  rb.input_ids = rb.input_ids.masked_fill(rb.attention_mask == 0, 0);
  const at::Tensor next_token = at::constant_pad_nd(rb.input_ids.narrow(1, 1, s - 1), {0, 1});
  rb.advantages = at::where(next_token.remainder(2) == 0, 1.0, -1.0).to(at::kFloat);
  rb.returns = rb.advantages.clone();
  return rb;
}

}  // namespace

int main(int argc, char** argv) {
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    const options o = parse(argc, argv);
    auto groups = md::parallel_groups::build(dist, o.layout);
    md::parallel_model<actor> policy(groups, {}, model::shape, o.layout);
    md::parallel_model<critic> value(groups, {}, model::shape, o.layout);

    // Megatron's scheduler: linear warmup over the first step, cosine decay to 10% over the run.
    md::optimizer_param_scheduler schedule(md::lr_schedule_config{
        .init_lr = 1e-4, .max_lr = 2e-3, .min_lr = 2e-4, .lr_warmup_steps = static_cast<double>(o.batch),
        .lr_decay_steps = o.steps * o.batch, .decay_style = md::lr_decay_style::cosine,
        .start_wd = 0.01, .end_wd = 0.01});
    const auto lr_at = [&](std::int64_t) { return schedule.lr(); };
    md::trainer actor_trainer = md::make_trainer(policy, groups, {.lr = 2e-3, .weight_decay = 0.01, .clip_grad = 1.0, .lr_at = lr_at},
                                                 {.clip_ratio = 0.2, .entropy_coeff = 0.001});
    md::trainer critic_trainer = md::make_trainer(value, groups, {.lr = 2e-3, .clip_grad = 1.0, .lr_at = lr_at});

    const bool print = dist.rank() == 0;
    if (print)
      std::printf("megadsl PPO: %s, tp %lld pp %lld vpp %lld sp %s rmpad %s on %lld ranks (dp %lld), %lld sequences x %lld micro-batches\n\n"
                  "step  actor loss  grad norm  critic loss  grad norm        lr   tokens/s  even-odd log p\n",
                  std::string(model::name).c_str(), static_cast<long long>(o.layout.tp.get()), static_cast<long long>(o.layout.pp.get()),
                  static_cast<long long>(o.layout.vpp.get()), o.layout.sp.get() ? "on" : "off", o.layout.rmpad.get() ? "on" : "off",
                  static_cast<long long>(dist.world()), static_cast<long long>(groups.grid.dp), static_cast<long long>(o.batch),
                  static_cast<long long>(o.microbatches));
    for (int step = 0; step < o.steps; ++step) {
      md::rollout_batch rb = make_rollout(o.batch, 100 + static_cast<std::uint64_t>(step));
      const md::batch inputs{.input_ids = rb.input_ids, .attention_mask = rb.attention_mask};
      {  // the rollout's log-probs and values, before the update
        c10::NoGradGuard no_grad;
        rb.old_log_probs = policy.forward(inputs, {.entropy = false}).log_probs.detach();
        rb.old_values = value.forward(inputs).values.detach();
      }
      const md::step_metrics a = actor_trainer.step(rb, o.microbatches);
      const md::step_metrics c = critic_trainer.step(rb, o.microbatches);
      schedule.step(o.batch);
      const at::Tensor even = (rb.advantages > 0).to(at::kFloat) * rb.loss_mask, odd = (rb.advantages < 0).to(at::kFloat) * rb.loss_mask;
      const double gap = ((rb.old_log_probs * even).sum() / even.sum() - (rb.old_log_probs * odd).sum() / odd.sum()).item<double>();
      if (print)
        std::printf("%4d  %10.5f  %9.4f  %11.5f  %9.4f  %8.2e  %9.0f  %+14.5f\n", step, a.loss, a.grad_norm, c.loss,
                    c.grad_norm, a.lr, static_cast<double>(a.tokens + c.tokens) / (a.seconds + c.seconds), gap);
    }
    return 0;
  });
}
