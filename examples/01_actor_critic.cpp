// The main job: a tiny Llama-family actor and critic, declared as types with their parallel
// layout, run on several local ranks (tp 2 x dp 2 by default), compared with the same model in
// one process.
//
//   ./build/examples/01_actor_critic            # 4 local ranks
//   ./build/examples/01_actor_critic --ranks 2  # tp 2 x dp 1
//   torchrun --nproc-per-node 4 ./build/examples/01_actor_critic   # same, under torchrun
#include <ATen/ATen.h>

#include <cstdio>

#include "megadsl/megadsl.hpp"
#include "megadsl/models/tiny.hpp"  // md::tiny_llama

namespace md = megadsl;

// The embedded tiny model: GQA with 8 query and 2 kv heads, a vocab of 1000 (padded inside).
using model = md::tiny_llama;
constexpr md::layout layout{.tp = 2, .sp = true, .rmpad = true};
using actor = md::causal_lm<model, layout>;
using critic = md::value_model<model, layout>;
// using broken = md::causal_lm<model, md::layout{.tp = 3}>;  // rejected: heads_divisible_by_tp ...

int main(int argc, char** argv) {
  return md::run_ranks(argc, argv, 4, [](md::distributed& dist) {
    auto groups = md::parallel_groups::build(dist, layout);
    md::parallel_model<actor> policy(groups);
    md::parallel_model<critic> value(groups);

    // Two prompts+responses, left-padded as rollouts are (0 = padding).
    const at::Tensor ids = at::tensor({0L, 0L, 0L, 17L, 250L, 31L, 999L, 4L,  //
                                       5L, 6L, 7L, 8L, 9L, 10L, 11L, 12L}).view({2, 8});
    const at::Tensor mask = (at::arange(16).view({2, 8}) >= 3).to(at::kLong);  // row 0: 3 pads; row 1: none
    const md::batch batch{.input_ids = ids, .attention_mask = mask};

    const md::model_output a = policy.forward(batch);
    const md::model_output c = value.forward(batch);

    // The same model on one process: the layout must not change a number.
    auto single = md::parallel_groups::single();
    md::parallel_model<md::causal_lm<model>> policy1(single);
    md::parallel_model<md::value_model<model>> value1(single);
    const double lp_diff = (policy1.forward(batch).log_probs - a.log_probs).abs().max().item<double>();
    const double v_diff = (value1.forward(batch).values - c.values).abs().max().item<double>();

    if (dist.rank() == 0) {
      const auto g = groups.grid;
      std::printf("megadsl: %s actor and critic, tp=%lld sp=on rmpad=on on %lld ranks (tp %lld x dp %lld)\n",
                  std::string(model::name).c_str(), static_cast<long long>(g.tp), static_cast<long long>(dist.world()),
                  static_cast<long long>(g.tp), static_cast<long long>(g.dp));
      for (std::int64_t row = 0; row < 2; ++row) {
        std::printf("\nsequence %lld\n  pos  token  log p(next)  entropy    value\n", static_cast<long long>(row));
        for (std::int64_t t = 0; t < 8; ++t) {
          if (mask[row][t].item<long>() == 0) continue;
          char logp[32] = "          -";  // the last token has no next token
          if (a.valid[row][t].item<bool>()) std::snprintf(logp, sizeof logp, "%11.5f", a.log_probs[row][t].item<double>());
          std::printf("  %3lld  %5lld  %s  %7.4f  %+8.5f\n", static_cast<long long>(t),
                      static_cast<long long>(ids[row][t].item<long>()), logp, a.entropy[row][t].item<double>(),
                      c.values[row][t].item<double>());
        }
      }
      std::printf("\nmax |difference| from the single-process model: log-probs %.2e, values %.2e\n", lp_diff, v_diff);
    }
    return (lp_diff < 1e-5 && v_diff < 1e-5) ? 0 : 1;
  });
}
