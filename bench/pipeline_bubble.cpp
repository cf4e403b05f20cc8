// Pipeline schedules on this CPU (prints, asserts nothing): per-rank idle fraction (time blocked
// in point-to-point receives / step time) next to the bubble formulas (p-1)/m for 1F1B and
// (p-1)/(v*m) interleaved, and tokens/s per layout, for one forward+backward step.
//
//   ./build/bench/bench_pipeline_bubble [--ranks 4] [--iters 3]
//
// Four ranks share this machine's cores, so stages also wait for the CPU: read the idle fraction
// as an upper bound of the schedule's bubble.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "megadsl/megadsl.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/schedule.hpp"

namespace md = megadsl;

namespace {

struct tiny8 : md::llama<md::shape{.hidden = 256, .layers = 8, .heads = 8, .kv_heads = 2, .ffn = 688,
                                   .vocab = 1000, .max_positions = 512}> {
  static constexpr std::string_view name = "tiny8";
};

std::vector<md::batch> microbatches(std::int64_t m) {
  std::vector<md::batch> out;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  for (std::int64_t i = 0; i < m; ++i)
    out.push_back({.input_ids = at::randint(0, 1000, {4, 64}, gen, at::kLong), .attention_mask = at::ones({4, 64}, at::kLong)});
  return out;
}

template <md::layout L>
void measure(md::distributed& dist, std::int64_t m, int iters) {
  auto groups = md::parallel_groups::build(dist, L);
  md::parallel_model<md::causal_lm<tiny8, L>> model(groups);
  const auto mbs = microbatches(m);
  const md::loss_function loss = [](const md::model_output& o, std::int64_t) { return -o.log_probs.sum() / 1000.0; };
  model.forward_backward(mbs, loss);  // warm-up
  groups.pp->barrier();
  md::global_comm_stats().reset();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) model.forward_backward(mbs, loss);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double idle = static_cast<double>(md::global_comm_stats().recv_wait_ns) * 1e-9 / seconds;
  at::Tensor all = groups.world->all_gather(at::full({1}, idle, at::kDouble), 0);
  if (dist.rank() == 0) {
    const auto kind = md::select_schedule(L.pp.get(), L.vpp.get());
    const double bubble = md::bubble_fraction(kind, L.pp.get(), m, L.vpp.get());  // bubble / compute time
    const double share = md::idle_fraction(kind, L.pp.get(), m, L.vpp.get());    // bubble / wall time
    std::printf("pp %lld vpp %lld m %3lld   bubble %.3f  idle share %.3f   measured idle per rank:",
                static_cast<long long>(L.pp.get()), static_cast<long long>(L.vpp.get()), static_cast<long long>(m),
                bubble, share);
    for (std::int64_t r = 0; r < all.size(0); ++r) std::printf(" %.3f", all[r].item<double>());
    const double tokens = static_cast<double>(m) * 4 * 64 * iters;
    std::printf("   %7.0f tok/s\n", tokens / seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 3;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    if (dist.world() != 4) {
      std::fprintf(stderr, "run with --ranks 4\n");
      return 2;
    }
    if (dist.rank() == 0)
      std::printf("megadsl pipeline bubble: tiny8 (hidden 256, 8 layers), micro-batches of 4 x 64 tokens, fp32, 4 ranks\n"
                  "bubble = (p-1)/m (1F1B) or (p-1)/(v m) (interleaved), relative to compute time; idle share = bubble/(1+bubble)\n"
                  "of the step, to compare with the measured time blocked in pipeline receives / step time\n"
                  "(pp 2 runs as two pipelines, dp 2)\n\n");
    measure<md::layout{.pp = 4}>(dist, 4, iters);
    measure<md::layout{.pp = 4}>(dist, 8, iters);
    measure<md::layout{.pp = 4}>(dist, 16, iters);
    measure<md::layout{.pp = 4, .vpp = 2}>(dist, 8, iters);
    measure<md::layout{.pp = 4, .vpp = 2}>(dist, 16, iters);
    measure<md::layout{.pp = 2}>(dist, 8, iters);
    measure<md::layout{.pp = 2, .vpp = 2}>(dist, 8, iters);
    return 0;
  });
}
