// Context parallelism's activation memory and time on this CPU (prints, asserts nothing): one
// forward + backward of a long packed sequence per cp group (remove-padding, fp32) on 4 local
// ranks at cp 1 (dp 4), cp 2 (dp 2) and cp 4 (dp 1), Ulysses (a2a) and the ring. Per rank: the peak of the tensor memory the
// step adds above the model's parameters (LibTorch's CPU allocator, counted), next to what
// `megadsl plan` predicts for the layout's activations (formulas.hpp, fp32 doubles its 16-bit
// count), the step's time, and the bytes the rank sent over cp (comm_stats::cp_bytes: the
// attention's all-to-alls or ring passes, and the head's gathers of its per-token outputs) next to
// plan's count of the attention's (formulas.hpp cp_all_to_all_bytes, cp_ring_bytes).
//
//   ./build/bench/bench_context_parallel_memory [--ranks 4] [--seq 8192]
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "megadsl/formulas.hpp"
#include "megadsl/megadsl.hpp"
#include "megadsl/models/llama.hpp"
#include "counting_allocator.hpp"

namespace md = megadsl;

namespace {

// 8 kv heads: cp up to 8 gets whole groups (rule cp_splits_kv_groups).
struct bench_llama : md::llama<md::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 8, .ffn = 1408,
                                         .vocab = 32000, .max_positions = 65536}> {
  static constexpr std::string_view name = "bench-llama-4x512";
};

double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

struct figures {
  std::int64_t cp = 1, tokens_per_rank = 0;
  const char* kind = "a2a";
  double peak = 0, predicted = 0, seconds = 0;
  double cp_sent = 0, cp_planned = 0;  // bytes over cp in the step, measured and plan's
};

template <md::layout L>
figures measure(md::distributed& dist, md::bench::counting_allocator& counting, std::int64_t seq) {
  auto groups = md::parallel_groups::build(dist, L);
  md::parallel_model<md::causal_lm<bench_llama, L>> model(groups);
  at::manual_seed(7);  // the same sequences on every rank: each dp replica takes its row
  const at::Tensor all = at::randint(3, bench_llama::shape.vocab.get(), {groups.grid.dp, seq}, at::kLong);
  const at::Tensor ids = all.narrow(0, groups.me.dp, 1);
  const std::vector<md::batch> mbs{{.input_ids = ids, .attention_mask = at::ones_like(ids)}};
  const md::loss_function loss = [](const md::model_output& out, std::int64_t) { return -out.log_probs.sum(); };
  model.forward_backward(mbs, loss);  // warm-up: gradients exist from here on
  groups.world->barrier();
  const auto held = static_cast<double>(counting.current());
  counting.reset_peak();
  md::global_comm_stats().reset();
  const auto start = std::chrono::steady_clock::now();
  model.forward_backward(mbs, loss);
  figures f;
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  f.peak = static_cast<double>(counting.peak()) - held;
  f.cp_sent = static_cast<double>(md::global_comm_stats().cp_bytes.load());
  f.cp = L.cp.get();
  f.tokens_per_rank = seq / f.cp;
  f.predicted = 2.0 * md::activation_bytes_first_stage(model.config().s, model.config().l, seq, 1, false, 1);
  f.kind = md::cp_ring(L) ? "ring" : L.cp.get() > 1 ? "a2a" : "-";
  f.cp_planned = md::cp_ring(L) ? md::cp_ring_bytes(model.config().s, model.config().l, f.tokens_per_rank, 4)
                                : md::cp_all_to_all_bytes(model.config().s, model.config().l, f.tokens_per_rank, 4);
  groups.world->barrier();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t seq = 8192;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--seq") == 0) seq = std::atoll(argv[i + 1]);
  ::setenv("MEGADSL_MALLOC_TUNING", "0", 1);  // freed blocks go back: the measurements stay apart
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    static md::bench::counting_allocator counting(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    const figures f[] = {measure<md::layout{.rmpad = true}>(dist, counting, seq),
                         measure<md::layout{.rmpad = true, .cp = 2}>(dist, counting, seq),
                         measure<md::layout{.rmpad = true, .cp = 4}>(dist, counting, seq),
                         measure<md::layout{.rmpad = true, .cp = 2, .cp_comm = md::cp_comm_kind::ring}>(dist, counting, seq),
                         measure<md::layout{.rmpad = true, .cp = 4, .cp_comm = md::cp_comm_kind::ring}>(dist, counting, seq)};
    if (dist.rank() == 0) {
      std::printf("context parallelism, %s (fp32, remove-padding), one sequence of %lld tokens per cp group, "
                  "forward + backward (rank 0)\n",
                  std::string(bench_llama::name).c_str(), static_cast<long long>(seq));
      std::printf("  %3s %5s %15s %20s %17s %10s %13s %10s %16s %14s\n", "cp", "kind", "tokens/rank", "peak activations GiB",
                  "plan predicts GiB", "peak/plan", "vs cp 1", "step s", "sent over cp MB", "plan's MB");
      for (const figures& x : f)
        std::printf("  %3lld %5s %15lld %20.3f %17.3f %10.3f %13.3f %10.3f %16.3f %14.3f\n", static_cast<long long>(x.cp), x.kind,
                    static_cast<long long>(x.tokens_per_rank), gib(x.peak), gib(x.predicted), x.peak / x.predicted,
                    x.peak / f[0].peak, x.seconds, x.cp_sent / 1e6, x.cp_planned / 1e6);
    }
    return 0;
  });
}
