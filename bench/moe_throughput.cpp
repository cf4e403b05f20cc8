// Mixture-of-experts throughput on this CPU (prints, asserts nothing): forward and forward+backward
// tokens/s of a Qwen3-MoE-shaped actor with its experts on every rank (ep 1) and split over two
// ranks (ep 2), remove-padding, and the bytes each rank sends by all-to-all per step next to the
// analytical count for uniform routing (formulas.hpp moe_all_to_all_bytes).
//
//   ./build/bench/bench_moe_throughput [--ranks 2] [--iters 5]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "megadsl/megadsl.hpp"
#include "megadsl/models/qwen_moe.hpp"

namespace md = megadsl;

namespace {

// 4 layers, 16 experts of 256, top 4: the Qwen3-MoE composition at a size this CPU runs in seconds.
struct bench_moe : md::qwen3_moe<md::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 4, .ffn = 1024,
                                           .vocab = 32000, .head_dim = 64, .max_positions = 1024, .experts = 16,
                                           .top_k = 4, .expert_ffn = 256, .norm_topk = true}> {
  static constexpr std::string_view name = "bench-qwen3-moe";
};

struct measured {
  double fwd_tok_s, fwdbwd_tok_s;
  std::int64_t all_to_all_bytes;
};

// 8 rows of 256 positions, half of them padding; each rank draws its own rows (data parallel).
md::batch half_padded(std::int64_t rank) {
  const std::int64_t b = 8, s = 256;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5 + static_cast<std::uint64_t>(rank));
  at::Tensor ids = at::randint(0, bench_moe::shape.vocab, {b, s}, gen, at::kLong);
  at::Tensor mask = at::zeros({b, s}, at::kLong);
  const std::int64_t lengths[b] = {32, 64, 96, 128, 128, 160, 192, 224};
  for (std::int64_t r = 0; r < b; ++r) mask[r].narrow(0, 0, lengths[r]).fill_(1);
  return {.input_ids = ids, .attention_mask = mask};
}

template <md::layout L>
measured run(md::distributed& dist, int iters) {
  auto groups = md::parallel_groups::build(dist, L);
  md::parallel_model<md::causal_lm<bench_moe, L>> m(groups);
  const md::batch b = half_padded(dist.rank());
  const double tokens = b.attention_mask.sum().item<double>();
  m.forward(b).log_probs.sum().backward();  // warm-up
  using clock = std::chrono::steady_clock;
  groups.world->barrier();
  auto t0 = clock::now();
  for (int i = 0; i < iters; ++i) {
    c10::NoGradGuard no_grad;
    m.forward(b);
  }
  const double fwd = std::chrono::duration<double>(clock::now() - t0).count() / iters;
  groups.world->barrier();
  md::global_comm_stats().reset();
  t0 = clock::now();
  for (int i = 0; i < iters; ++i) {
    m.forward(b).log_probs.sum().backward();
    m.finalize_grads();
  }
  const double both = std::chrono::duration<double>(clock::now() - t0).count() / iters;
  return {tokens / fwd, tokens / both, md::global_comm_stats().all_to_all_bytes / iters};
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
    constexpr md::layout ep1{.rmpad = true}, ep2{.rmpad = true, .ep = 2};
    const measured a = run<ep1>(dist, iters), b = run<ep2>(dist, iters);
    const std::int64_t tokens = half_padded(dist.rank()).attention_mask.sum().item<std::int64_t>();
    if (dist.rank() == 0) {
      const auto& s = bench_moe::shape;
      std::printf("megadsl MoE throughput: %s (hidden %lld, %lld layers, %lld experts of %lld, top %lld, vocab %lld), "
                  "8 x 256 per rank with %lld real tokens, remove-padding\n",
                  std::string(bench_moe::name).c_str(), static_cast<long long>(s.hidden.get()),
                  static_cast<long long>(s.layers.get()), static_cast<long long>(s.experts.get()),
                  static_cast<long long>(s.expert_ffn.get()), static_cast<long long>(s.top_k.get()),
                  static_cast<long long>(s.vocab.get()), static_cast<long long>(tokens));
      std::printf("2 ranks on this machine (data parallel; ep 2 splits the experts over them), fp32, %d iterations\n\n", iters);
      std::printf("%-10s %12s %14s %20s %22s\n", "layout", "fwd tok/s", "fwd+bwd tok/s", "all-to-all B/step", "analytical (uniform)");
      std::printf("%-10s %12.0f %14.0f %20lld %22.0f\n", "ep 1", a.fwd_tok_s, a.fwdbwd_tok_s,
                  static_cast<long long>(a.all_to_all_bytes), md::moe_all_to_all_bytes(s, ep1, tokens, 4));
      std::printf("%-10s %12.0f %14.0f %20lld %22.0f\n", "ep 2", b.fwd_tok_s, b.fwdbwd_tok_s,
                  static_cast<long long>(b.all_to_all_bytes), md::moe_all_to_all_bytes(s, ep2, tokens, 4));
      std::printf("\nmeasured bytes include the per-expert counts (%lld int64 per layer and pass); the analytical count "
                  "assumes each of the top-%lld copies leaves the rank with probability (ep - 1) / ep\n",
                  static_cast<long long>(s.experts.get()), static_cast<long long>(s.top_k.get()));
    }
    return 0;
  });
}
