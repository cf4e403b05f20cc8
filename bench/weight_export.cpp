// Weight export for rollout sync on this CPU (prints, asserts nothing): a 160M-parameter Llama-shaped
// actor at tp 2 x pp 2 streams its weights in bf16 (runtime/weight_export.hpp) to every rank; the
// figures are GB/s of full tensors received per rank, next to a plain memcpy of the same bytes on
// the same rank, and the peak resident memory the stream adds beyond the model (sampled every
// millisecond), next to the bucket size.
//
//   ./build/bench/bench_weight_export [--ranks 4] [--bucket-mb 256]
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "megadsl/megadsl.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/runtime/weight_export.hpp"

namespace md = megadsl;

namespace {

struct bench_llama : md::llama<md::shape{.hidden = 1024, .layers = 8, .heads = 16, .kv_heads = 8, .ffn = 2816,
                                         .vocab = 32000, .max_positions = 4096}> {
  static constexpr std::string_view name = "bench-llama-160m";
};
constexpr md::layout L{.tp = 2, .pp = 2};

double resident_bytes() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

int main(int argc, char** argv) {
  double bucket_mb = 256;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--bucket-mb") == 0) bucket_mb = std::atof(argv[i + 1]);
  return md::run_ranks(argc, argv, 4, [&](md::distributed& dist) {
    auto groups = md::parallel_groups::build(dist, L);
    md::parallel_model<md::causal_lm<bench_llama, L>> model(groups);
    const md::export_options o{.dtype = at::kBFloat16, .bucket_bytes = static_cast<std::int64_t>(bucket_mb * (1 << 20))};
    using clock = std::chrono::steady_clock;

    // The stream: every bucket received and dropped, as a rollout engine copies it into its own.
    groups.world->barrier();
    const double before = resident_bytes();
    std::atomic<bool> sampling{true};
    std::atomic<double> peak{before};
    std::thread sampler([&] {
      while (sampling) {
        const double r = resident_bytes();
        if (r > peak) peak = r;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    const auto t0 = clock::now();
    md::weight_stream stream(model.parameters(), model.config(), groups, o);
    std::int64_t tensors = 0;
    try {
      for (auto bucket = stream.next(); !bucket.empty(); bucket = stream.next()) tensors += static_cast<std::int64_t>(bucket.size());
    } catch (...) {
      sampling = false;
      sampler.join();
      throw;
    }
    const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
    sampling = false;
    sampler.join();
    const double bytes = static_cast<double>(stream.bytes_sent());

    // The same bytes through one memcpy (clone of a buffer of that size), best of three.
    const at::Tensor src = at::ones({static_cast<std::int64_t>(bytes)}, at::kByte);
    double copy_s = 1e9;
    for (int i = 0; i < 3; ++i) {
      const auto c0 = clock::now();
      const at::Tensor dst = src.clone();
      copy_s = std::min(copy_s, std::chrono::duration<double>(clock::now() - c0).count());
    }
    groups.world->barrier();
    if (dist.rank() == 0) {
      std::printf("megadsl weight export: %s, %lld parameters, tp %lld x pp %lld, bf16, buckets of %.0f MB\n",
                  bench_llama::name.data(), static_cast<long long>(md::parameter_count(bench_llama::shape)),
                  static_cast<long long>(L.tp.get()), static_cast<long long>(L.pp.get()), bucket_mb);
      std::printf("  %lld tensors, %.1f MB received by every rank in %.3f s: %.2f GB/s\n", static_cast<long long>(tensors),
                  bytes / 1e6, seconds, bytes / seconds / 1e9);
      std::printf("  memcpy of the same bytes on this rank: %.3f s, %.2f GB/s (export / memcpy time: %.1fx)\n", copy_s,
                  bytes / copy_s / 1e9, seconds / copy_s);
      std::printf("  peak resident memory added by the stream: %.1f MB (bucket %.0f MB)\n", (peak - before) / 1e6, bucket_mb);
    }
    return 0;
  });
}
