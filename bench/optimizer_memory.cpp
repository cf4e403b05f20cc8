// The distributed optimizer's memory on this CPU (prints, asserts nothing): a 160M-parameter
// Llama-shaped actor at dp 4 (4 local ranks, fp32), training steps with the replicated optimizer and
// with the distributed one (Megatron's: AdamW's moments sharded over dp, the gradients
// reduce-scattered in buckets, the parameters all-gathered in buckets). Per rank: AdamW's state
// bytes (trainer::optimizer_bytes), and the peak of a training step's tensor memory (every byte
// LibTorch's CPU allocator holds, counted by a wrapper around it, as CUDA's max_memory_allocated
// counts on a GPU) next to what `megadsl plan` predicts for this layout (formulas.hpp: weights +
// gradients + Adam at 4 + 4 + 8 / shards bytes per parameter, plus the first stage's activations,
// doubled for fp32 compute); and the step's peak resident memory (VmHWM) above the process before
// the model was built, which also holds what malloc kept of freed blocks.
//
//   ./build/bench/bench_optimizer_memory [--ranks 4] [--seq 256] [--micro-batch 1] [--bucket-elements 16777216]
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <unistd.h>

#include "megadsl/formulas.hpp"
#include "megadsl/megadsl.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/runtime/trainer.hpp"
#include "counting_allocator.hpp"

namespace md = megadsl;

namespace {

struct bench_llama : md::llama<md::shape{.hidden = 1024, .layers = 8, .heads = 16, .kv_heads = 8, .ffn = 2816,
                                         .vocab = 32000, .max_positions = 4096}> {
  static constexpr std::string_view name = "bench-llama-160m";
};
constexpr md::layout L{};  // tp 1, pp 1: every rank is a dp rank

double resident_bytes() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// The peak resident set since the last reset (VmHWM), and its reset to the current set.
double peak_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      double kb = 0;
      in >> kb;
      return kb * 1024.0;
    }
    std::getline(in, key);
  }
  return 0;
}
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  std::int64_t seq = 256, micro_batch = 1, bucket = md::optimizer_config{}.grad_bucket_elements;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--bucket-elements") == 0) bucket = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--seq") == 0) seq = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--micro-batch") == 0) micro_batch = std::atoll(argv[i + 1]);
  }
  // Freed blocks go back to the system (no heap retention, src/runtime/cpu_allocator.hpp), so that the two
  // measurements in one process do not see each other's memory.
  ::setenv("MEGADSL_MALLOC_TUNING", "0", 1);
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    static md::bench::counting_allocator counting(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    auto groups = md::parallel_groups::build(dist, L);
    const std::int64_t dp = groups.dp->size();
    // Every rank trains on its micro-batch of the global batch (dp micro-batches of seq tokens).
    const std::int64_t rows = dp * micro_batch;
    at::manual_seed(7);  // the same global batch on every rank
    const at::Tensor ids = at::randint(3, bench_llama::shape.vocab.get(), {rows, seq}, at::TensorOptions().dtype(at::kLong));
    md::rollout_batch rb{.input_ids = ids, .attention_mask = at::ones_like(ids)};
    rb.loss_mask = at::ones({rows, seq});
    rb.old_log_probs = at::full({rows, seq}, -10.0);
    rb.advantages = at::randn({rows, seq});

    struct figures { double state, peak, resident, predicted; };
    auto measure = [&](bool distributed) {
      groups.world->barrier();
      const double before = resident_bytes();
      const auto held_before = static_cast<double>(counting.current());
      figures f{};
      {
        md::parallel_model<md::causal_lm<bench_llama, L>> model(groups);
        md::trainer t = md::make_trainer(model, groups, md::optimizer_config{.lr = 1e-5, .distributed = distributed, .grad_bucket_elements = bucket});
        t.step(rb, 1);  // AdamW's state exists from here on
        groups.world->barrier();
        reset_peak();
        counting.reset_peak();
        t.step(rb, 1);
        f.resident = peak_resident_bytes() - before;
        f.peak = static_cast<double>(counting.peak()) - held_before;
        f.state = static_cast<double>(t.optimizer_bytes());
        const md::rank_memory m = md::training_memory(model.config().s, model.config().l, md::head_info{}, md::precision::fp32, 0,
                                                      distributed ? dp : 1);
        const double activations =
            md::activation_peak_bytes(model.config().s, model.config().l, seq, micro_batch, false, 4, 1);
        f.predicted = m.total_bytes + activations;
      }
      return f;
    };
    const figures replicated = measure(false);
    const figures sharded = measure(true);
    if (dist.rank() == 0) {
      std::printf("optimizer memory, %s (fp32), dp %lld, %lld x %lld tokens per rank, buckets of %lld elements, one step "
                  "(rank 0)\n",
                  std::string(bench_llama::name).c_str(), static_cast<long long>(dp), static_cast<long long>(micro_batch),
                  static_cast<long long>(seq), static_cast<long long>(bucket));
      std::printf("  %-26s %14s %18s %17s %10s %17s\n", "optimizer", "Adam state GiB", "peak tensors GiB",
                  "plan predicts GiB", "peak/plan", "peak resident GiB");
      for (const auto& [name, f] : {std::pair{"replicated", replicated}, std::pair{"distributed (Megatron's)", sharded}})
        std::printf("  %-26s %14.3f %18.3f %17.3f %10.3f %17.3f\n", name, gib(f.state), gib(f.peak), gib(f.predicted),
                    f.peak / f.predicted, gib(f.resident));
      std::printf("  Adam state distributed / replicated: %.4f (1/dp = %.4f)\n", sharded.state / replicated.state,
                  1.0 / static_cast<double>(dp));
    }
    return 0;
  });
}
