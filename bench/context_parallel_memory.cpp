// Context parallelism's activation memory and time on this CPU (prints, asserts nothing): one
// forward + backward of one long sequence (remove-padding, fp32) on 4 local ranks at cp 1 (dp 4),
// cp 2 (dp 2) and cp 4 (dp 1), Ulysses (a2a), the ring, and at cp 4 both (a2a+ring: all-to-all
// pairs around a ring of 2), on a tiny-hidden Llama (h 128, 2
// layers, 4 heads, vocabulary 2048) so that 64k tokens fit this machine. Only the first dp
// replica's cp group takes the long sequence (the others a short one), so that its ranks' figures
// are the layout's. Per rank 0: the peak of the tensor memory the step adds above the model's
// parameters and gradients (LibTorch's CPU allocator, counted), next to what `megadsl plan`
// predicts (formulas.hpp activation_peak_bytes: the layers without scores, the final norm, the LM
// head's extra, the ring's tiles), the step's time, and the bytes the rank sent over cp
// (comm_stats::cp_bytes: the attention's all-to-alls or ring passes, and the head's gathers of its
// per-token outputs) next to plan's count of the attention's (formulas.hpp cp_all_to_all_bytes,
// cp_ring_bytes).
//
//   ./build/bench/bench_context_parallel_memory [--seq 4096] [--cases cp1,a2a2,a2a4,ring2,ring4,a2a2ring2]
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "megadsl/formulas.hpp"
#include "megadsl/megadsl.hpp"
#include "megadsl/models/llama.hpp"
#include "counting_allocator.hpp"

namespace md = megadsl;

namespace {

// 4 kv heads: cp up to 4 gets whole groups (rule cp_splits_kv_groups). Tiny, so that the s^2
// attention of a 64k sequence runs in minutes on one CPU thread a rank.
struct bench_llama : md::llama<md::shape{.hidden = 128, .layers = 2, .heads = 4, .kv_heads = 4, .ffn = 352,
                                         .vocab = 2048, .max_positions = 131072}> {
  static constexpr std::string_view name = "bench-llama-2x128";
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
  at::manual_seed(7);  // the same tokens on every rank of a cp group
  const auto batch_of = [](std::int64_t tokens) {
    const at::Tensor ids = at::randint(3, bench_llama::shape.vocab.get(), {1, tokens}, at::kLong);
    return std::vector<md::batch>{{.input_ids = ids, .attention_mask = at::ones_like(ids)}};
  };
  const std::int64_t shortest = 16 * L.cp.get();  // the warm-up's, and the other dp replicas'
  const md::loss_function loss = [](const md::model_output& out, std::int64_t) { return -out.log_probs.sum(); };
  model.forward_backward(batch_of(shortest), loss);  // warm-up: gradients exist from here on
  const auto mbs = batch_of(groups.me.dp == 0 ? seq : shortest);
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
  f.predicted = md::activation_peak_bytes(model.config().s, model.config().l, seq, 1, false, 4);
  f.kind = L.cp.get() > 1 ? md::name_of(L.cp_comm.get()).data() : "-";
  // Under a2a+ring both: the all-to-alls within the pairs and the blocks around the rings.
  f.cp_planned = md::cp_ring_bytes(model.config().s, model.config().l, f.tokens_per_rank, 4) +
                 md::cp_all_to_all_bytes(model.config().s, model.config().l, f.tokens_per_rank, 4);
  groups.world->barrier();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t seq = 4096;
  std::string cases = "cp1,a2a2,a2a4,ring2,ring4,a2a2ring2";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--seq") == 0) seq = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--cases") == 0) cases = argv[i + 1];
  }
  const auto asked = [&](const char* c) { return ("," + cases + ",").find("," + std::string(c) + ",") != std::string::npos; };
  ::setenv("MEGADSL_MALLOC_TUNING", "0", 1);  // freed blocks go back: the measurements stay apart
  // At 64k tokens cp 1's rank 0 runs minutes alone while the others wait in the gradients' reduction.
  ::setenv("MEGADSL_TIMEOUT_S", "1800", 0);
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    static md::bench::counting_allocator counting(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    std::vector<figures> f;
    if (asked("cp1")) f.push_back(measure<md::layout{.rmpad = true}>(dist, counting, seq));
    if (asked("a2a2")) f.push_back(measure<md::layout{.rmpad = true, .cp = 2}>(dist, counting, seq));
    if (asked("a2a4")) f.push_back(measure<md::layout{.rmpad = true, .cp = 4}>(dist, counting, seq));
    if (asked("ring2"))
      f.push_back(measure<md::layout{.rmpad = true, .cp = 2, .cp_comm = md::cp_comm_kind::ring}>(dist, counting, seq));
    if (asked("ring4"))
      f.push_back(measure<md::layout{.rmpad = true, .cp = 4, .cp_comm = md::cp_comm_kind::ring}>(dist, counting, seq));
    if (asked("a2a2ring2"))
      f.push_back(measure<md::layout{.rmpad = true, .cp = 4, .cp_comm = md::cp_comm_kind::a2a_ring, .cp_a2a = 2}>(
          dist, counting, seq));
    if (dist.rank() == 0 && !f.empty()) {
      std::printf("context parallelism, %s (fp32, remove-padding), one sequence of %lld tokens per cp group, "
                  "forward + backward (rank 0)\n",
                  std::string(bench_llama::name).c_str(), static_cast<long long>(seq));
      std::printf("  %3s %8s %12s %21s %18s %10s %9s %9s %16s %10s\n", "cp", "kind", "tokens/rank", "peak activations GiB",
                  "plan predicts GiB", "peak/plan", "vs first", "step s", "sent over cp MB", "plan's MB");
      for (const figures& x : f)
        std::printf("  %3lld %8s %12lld %21.3f %18.3f %10.3f %9.3f %9.1f %16.1f %10.1f\n", static_cast<long long>(x.cp), x.kind,
                    static_cast<long long>(x.tokens_per_rank), gib(x.peak), gib(x.predicted), x.peak / x.predicted,
                    x.peak / f.front().peak, x.seconds, x.cp_sent / 1e6, x.cp_planned / 1e6);
    }
    return 0;
  });
}
