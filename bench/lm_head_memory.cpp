// The LM head's extra memory in training, whole against chunked over the tokens (issue 49; prints,
// asserts nothing): one forward + backward of log-probs and entropy for T tokens at Qwen's 151,936
// vocabulary (tp 1, fp32, a 64-wide hidden so that only the head's own tensors count). Per run: the
// peak of the tensor memory the step adds above its inputs (LibTorch's CPU allocator, counted), the
// time, and where both run the largest difference of the chunked head's log-probs, entropy and
// gradients from the whole head's. The whole head is run only where its (T, V) logits fit
// (--whole-max tokens).
//
//   ./build/bench/bench_lm_head_memory [--tokens 4096,16384,65536] [--whole-max 4096] [--chunk 0]
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "megadsl/formulas.hpp"
#include "megadsl/layers/vocab_parallel.hpp"
#include "counting_allocator.hpp"

namespace md = megadsl;

namespace {

constexpr std::int64_t vocab = 151936, hidden = 64;

double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

struct result {
  double peak = 0, seconds = 0;
  at::Tensor logp, entropy, grad_h, grad_w;
};

result run(md::bench::counting_allocator& mem, const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& labels,
           std::int64_t chunk) {
  const at::Tensor h = h0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  const std::int64_t before = mem.current();
  mem.reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  const md::vocab_shard shard{0, vocab};
  const md::logprob_entropy le =
      chunk == 0 ? md::vocab_parallel_logprob_entropy(md::head_logits(h, w, {}, 0, h.size(0), false), labels, shard, nullptr)
                 : md::chunked_head_logprob_entropy(h, w, labels, {}, shard, nullptr, true, false, chunk);
  (le.log_probs.sum() * -1.0 + le.entropy.sum() * 0.01).backward();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The step's extra peak less the gradients it hands back (the size of h and w, in any head).
  const double grads = static_cast<double>((h.numel() + w.numel()) * 4);
  return {static_cast<double>(mem.peak() - before) - grads, seconds, le.log_probs.detach(), le.entropy.detach(), h.grad(),
          w.grad()};
}

double diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

int main(int argc, char** argv) {
  static md::bench::counting_allocator counting(c10::GetDefaultCPUAllocator());
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  std::vector<std::int64_t> tokens{4096, 16384, 65536};
  std::int64_t whole_max = 4096, chunk_arg = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tokens") == 0) {
      tokens.clear();
      std::stringstream in(argv[i + 1]);
      for (std::string t; std::getline(in, t, ',');) tokens.push_back(std::stoll(t));
    } else if (std::strcmp(argv[i], "--whole-max") == 0) {
      whole_max = std::stoll(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--chunk") == 0) {
      chunk_arg = std::stoll(argv[i + 1]);
    }
  }
  // The training default (formulas.hpp): 2^25 logits a chunk.
  const std::int64_t chunk = chunk_arg > 0 ? chunk_arg : md::lm_head_chunk_elements / vocab;
  std::printf("LM head, vocab %lld, hidden %lld, fp32, tp 1: extra peak of one forward + backward (log-probs + entropy)\n",
              static_cast<long long>(vocab), static_cast<long long>(hidden));
  std::printf("%8s  %-16s  %12s  %9s  %9s  %s\n", "tokens", "head", "extra GiB", "plan GiB", "seconds", "max |chunked - whole|");
  for (const std::int64_t t : tokens) {
    at::manual_seed(0);
    const at::Tensor h = at::randn({t, hidden}), w = at::randn({vocab, hidden}) * 0.1;
    const at::Tensor labels = at::randint(0, vocab, {t}, at::kLong);
    const result c = run(counting, h, w, labels, chunk);
    std::printf("%8lld  chunked (%5lld)  %12.3f  %9.3f  %9.2f\n", static_cast<long long>(t), static_cast<long long>(chunk),
                gib(c.peak), gib(md::lm_head_peak_bytes(t, vocab, chunk)), c.seconds);
    if (t <= whole_max) {
      const result o = run(counting, h, w, labels, 0);
      std::printf("%8lld  %-16s  %12.3f  %9.3f  %9.2f  log-probs %.2e, entropy %.2e, grad h %.2e, grad w %.2e\n",
                  static_cast<long long>(t), "whole", gib(o.peak), gib(md::lm_head_peak_bytes(t, vocab, -1)), o.seconds,
                  diff(c.logp, o.logp),
                  diff(c.entropy, o.entropy), diff(c.grad_h, o.grad_h), diff(c.grad_w, o.grad_w));
    } else {
      std::printf("%8lld  %-16s  %12s  %9.3f  %9s  (not run: its logits alone are %.1f GiB)\n", static_cast<long long>(t),
                  "whole (T x V)", "-", gib(md::lm_head_peak_bytes(t, vocab, -1)), "-", gib(static_cast<double>(t) * vocab * 4));
    }
  }
  return 0;
}
