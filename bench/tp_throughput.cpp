// Tensor-parallel throughput on this CPU (prints, asserts nothing): forward and forward+backward
// tokens/s for tp 1 and 2, padded and remove-padding, on a batch with 50% padding; and the bytes
// each rank sends per step (ring algorithms) next to the analytical count (formulas.hpp).
//
//   ./build/bench/bench_tp_throughput [--ranks 2] [--iters 5]
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "megadsl/megadsl.hpp"
#include "megadsl/models/tiny.hpp"  // md::tiny_llama

namespace md = megadsl;
using model = md::tiny_llama;

namespace {

struct measured {
  double fwd_tok_s, fwdbwd_tok_s;
  std::int64_t calls, bytes;
};

// 8 rows of 256 positions, lengths spread so that half the positions are padding.
md::batch half_padded() {
  const std::int64_t b = 8, s = 256;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor ids = at::randint(0, model::shape.vocab, {b, s}, gen, at::kLong);
  at::Tensor mask = at::zeros({b, s}, at::kLong);
  const std::int64_t lengths[b] = {32, 64, 96, 128, 128, 160, 192, 224};  // mean 128 = 50%
  for (std::int64_t r = 0; r < b; ++r) mask[r].narrow(0, 0, lengths[r]).fill_(1);
  return {.input_ids = ids, .attention_mask = mask};
}

template <md::layout L>
measured run(md::distributed& dist, int iters) {
  auto groups = md::parallel_groups::build(dist, L);
  md::parallel_model<md::causal_lm<model, L>> m(groups);
  const md::batch b = half_padded();
  const double tokens = b.attention_mask.sum().item<double>();
  m.forward(b).log_probs.sum().backward();  // warm-up
  using clock = std::chrono::steady_clock;
  groups.tp->barrier();
  auto t0 = clock::now();
  for (int i = 0; i < iters; ++i) {
    c10::NoGradGuard no_grad;
    m.forward(b);
  }
  const double fwd = std::chrono::duration<double>(clock::now() - t0).count() / iters;
  md::global_comm_stats().reset();
  t0 = clock::now();
  for (int i = 0; i < iters; ++i) {
    m.forward(b).log_probs.sum().backward();
    m.finalize_grads();
  }
  const double both = std::chrono::duration<double>(clock::now() - t0).count() / iters;
  return {tokens / fwd, tokens / both, md::global_comm_stats().calls / iters, md::global_comm_stats().bytes / iters};
}

// Bytes one tp rank sends per forward+backward step (formulas.hpp, ring algorithms).
// rows: the real stream (b*s padded, nnz packed); stream: rounded up to a multiple of tp under SP.
double analytical_bytes(const md::layout& l, std::int64_t rows, std::int64_t world) {
  const std::int64_t stream = l.sp.get() ? (rows + l.tp.get() - 1) / l.tp.get() * l.tp.get() : rows;
  return md::actor_step_comm_bytes(model::shape, l, stream, rows, world / l.tp.get());
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  return md::run_ranks(argc, argv, 2, [&](md::distributed& dist) {
    if (dist.world() != 2) {
      std::fprintf(stderr, "run with --ranks 2\n");
      return 2;
    }
    const md::batch b = half_padded();
    const std::int64_t tokens = b.attention_mask.sum().item<std::int64_t>(), positions = b.input_ids.numel();
    struct row {
      const char* name;
      md::layout l;
      measured m;
      std::int64_t stream;
    };
    row rows[] = {
        {"tp 1, padded", md::layout{.tp = 1}, run<md::layout{.tp = 1}>(dist, iters), positions},
        {"tp 1, rmpad", md::layout{.tp = 1, .rmpad = true}, run<md::layout{.tp = 1, .rmpad = true}>(dist, iters), tokens},
        {"tp 2, padded", md::layout{.tp = 2}, run<md::layout{.tp = 2}>(dist, iters), positions},
        {"tp 2, rmpad", md::layout{.tp = 2, .rmpad = true}, run<md::layout{.tp = 2, .rmpad = true}>(dist, iters), tokens},
        {"tp 2, sp, rmpad", md::layout{.tp = 2, .sp = true, .rmpad = true},
         run<md::layout{.tp = 2, .sp = true, .rmpad = true}>(dist, iters), tokens},
    };
    if (dist.rank() == 0) {
      std::printf("megadsl tp throughput: %s (hidden %lld, %lld layers, vocab %lld), batch 8 x 256 with %lld real tokens (%.0f%% padding)\n",
                  std::string(model::name).c_str(), static_cast<long long>(model::shape.hidden.get()),
                  static_cast<long long>(model::shape.layers.get()), static_cast<long long>(model::shape.vocab.get()),
                  static_cast<long long>(tokens), 100.0 * (1.0 - static_cast<double>(tokens) / static_cast<double>(positions)));
      std::printf("2 ranks on this machine (tp 1 runs as dp 2: two independent replicas), fp32, %d iterations\n\n", iters);
      std::printf("%-18s %12s %14s %12s %14s %16s\n", "layout", "fwd tok/s", "fwd+bwd tok/s", "collectives", "bytes/step", "analytical bytes");
      for (const row& r : rows)
        std::printf("%-18s %12.0f %14.0f %12lld %14lld %16.0f\n", r.name, r.m.fwd_tok_s, r.m.fwdbwd_tok_s,
                    static_cast<long long>(r.m.calls), static_cast<long long>(r.m.bytes),
                    analytical_bytes(r.l, r.stream, dist.world()));
      std::printf("\nrmpad / padded, fwd+bwd: tp 1 %.2fx, tp 2 %.2fx\n", rows[1].m.fwdbwd_tok_s / rows[0].m.fwdbwd_tok_s,
                  rows[3].m.fwdbwd_tok_s / rows[2].m.fwdbwd_tok_s);
    }
    return 0;
  });
}
