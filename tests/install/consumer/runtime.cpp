#include <ATen/ATen.h>
#include <megadsl/megadsl.hpp>
#include <megadsl/models/tiny.hpp>
#include <cstdio>
int main(int argc, char** argv) {
  return megadsl::run_ranks(argc, argv, 2, [](megadsl::distributed& d) {
    auto g = megadsl::parallel_groups::build(d, megadsl::layout{.tp = 2});
    megadsl::parallel_model<megadsl::causal_lm<megadsl::tiny_llama, megadsl::layout{.tp = 2}>> m(g);
    at::manual_seed(0);  // the same batch on both ranks of the tp group (they check that they agree)
    auto ids = at::randint(0, 1000, {2, 8}, at::kLong);
    auto out = m.forward({.input_ids = ids});
    if (d.rank() == 0) std::printf("ok %s\n", c10::str(out.log_probs.sizes()).c_str());
    return 0;
  });
}
