// megadsl's side of bench/gpu_throughput.py as a C++ program (the library alone, no Python module):
// one HF checkpoint and one batch, on one CUDA GPU (or the CPU, to check the program).
//
//   bench_gpu_step MODEL_DIR BATCH.safetensors OUT_DIR [--iters N] [--device cuda|cpu]
//                  [--parity PARITY.safetensors] [--profile] [--ab] [--variants LIST]
//
// BATCH and PARITY hold `input_ids` and `attention_mask` (b, s) int64. bf16 compute over fp32
// parameters (verl's mixed precision), in each of the variants of LIST (default padded,rmpad;
// --ab adds rmpad-unfused):
//   padded              SDPA with the key mask
//   rmpad               remove-padding: the variable-length flash kernel on CUDA
//   rmpad-unfused       rmpad with the fused kernels off (layers/fused_ops.hpp): what they save
//   rmpad-full          rmpad with layout recompute full (each layer keeps its input only)
//   rmpad-full-offload  and those inputs in pinned host memory (model_options::offload_activations)
//   rmpad-invariant     rmpad with layout invariant (layers/invariant.hpp): what it costs
//   rmpad-whole-head    rmpad with the LM head's logits whole in training (head_chunk_tokens -1),
//                       where the default chunks them (formulas.hpp lm_head_training_chunk)
// and the works
//   fwd       log-probs + entropy, no grad (not for the recompute variants: nothing to keep)
//   fwd+bwd   a PPO-style loss over log-probs and entropy (side_by_side.py's ppo_loss), its
//             backward and finalize_grads (the gradients as a trainer's step has them)
// each the median over --iters steps after two warm-up steps (the invariant variant: at most 2
// steps after one), with the allocator's peak bytes; a variant that runs out of device memory or
// fails is a row that says so (a "note", no time), and the next variant runs. Rows go to stdout and
// OUT_DIR/megadsl_steps.json, written after each row. --parity writes
// OUT_DIR/megadsl_logprobs.safetensors: the log-probs of PARITY's batch in fp32, bf16 padded and
// bf16 remove-padding. --profile writes OUT_DIR/megadsl_trace.json, a Kineto trace (with input
// shapes) of one rmpad fwd+bwd step.
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "megadsl/hf_config.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/layers/fused_ops.hpp"
#include "megadsl/models/checkpoint_model.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace fs = std::filesystem;
using namespace megadsl;

namespace {

struct options {
  fs::path model, batch_file, out;
  int iters = 5;
  bool cuda = true, profile = false, ab = false;
  fs::path parity;
  std::string variants;
};

struct variant {
  std::string name;
  bool rmpad = true, fused = true, offload = false, invariant = false;
  recompute_kind recompute = recompute_kind::none;
  std::int64_t head_chunk_tokens = 0;  // model_options::head_chunk_tokens
};

variant variant_named(const std::string& name) {
  for (const variant& v : {variant{.name = "padded", .rmpad = false}, variant{.name = "rmpad"},
                           variant{.name = "rmpad-unfused", .fused = false},
                           variant{.name = "rmpad-full", .recompute = recompute_kind::full},
                           variant{.name = "rmpad-full-offload", .offload = true, .recompute = recompute_kind::full},
                           variant{.name = "rmpad-invariant", .invariant = true},
                           variant{.name = "rmpad-whole-head", .head_chunk_tokens = -1}})
    if (v.name == name) return v;
  throw std::invalid_argument("--variants: no variant " + name +
                              " (padded, rmpad, rmpad-unfused, rmpad-full, rmpad-full-offload, rmpad-invariant, rmpad-whole-head)");
}

void sync(const at::Device& d) {
  if (d.is_cuda()) at::accelerator::synchronizeDevice(d.index());
}

std::int64_t peak_bytes(const at::Device& d) {
  if (!d.is_cuda()) return 0;
  return at::accelerator::getDeviceStats(d.index()).allocated_bytes[0].peak;  // [0]: all pools
}

void reset_peak(const at::Device& d) {
  if (d.is_cuda()) at::accelerator::resetPeakStats(d.index());
}

// The same objective as bench/side_by_side.py's ppo_loss (which gpu_throughput.py uses).
at::Tensor ppo_loss(const model_output& o) {
  const at::Tensor& lp = o.log_probs;
  const at::Tensor m = o.valid.to(lp.scalar_type());
  const at::Tensor adv = at::linspace(-1, 1, lp.numel(), lp.options()).view(lp.sizes());
  const at::Tensor ratio = at::exp(lp - lp.detach());
  const at::Tensor pg = at::maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2));
  return (pg * m).sum() / m.sum() - 1e-3 * (o.entropy * m).sum() / m.sum();
}

using model_t = parallel_model<checkpoint_actor>;

struct loaded {
  parallel_groups groups = parallel_groups::single();
  std::unique_ptr<model_t> model;
};

std::unique_ptr<loaded> load(const options& o, const variant& v, std::optional<at::ScalarType> compute) {
  auto l = std::make_unique<loaded>();
  const hf_config cfg = read_hf_config(o.model);
  model_options mo;
  mo.device = local_device(o.cuda);
  mo.compute_dtype = compute;
  mo.attention_window = cfg.attention_window;
  mo.batch_checksum = false;
  mo.offload_activations = v.offload;
  mo.head_chunk_tokens = v.head_chunk_tokens;
  l->model = std::make_unique<model_t>(l->groups, mo, cfg.s,
                                       layout{.rmpad = v.rmpad, .recompute = v.recompute, .invariant = v.invariant});
  load_hf(*l->model, l->groups, o.model);
  return l;
}

void fwd(model_t& m, const batch& b) {
  c10::NoGradGuard no_grad;
  (void)m.forward(b);
}

void fwd_bwd(model_t& m, const batch& b) {
  for (auto& p : m.parameters()) p.tensor.mutable_grad() = at::Tensor();
  const model_output out = m.forward(b);
  ppo_loss(out).backward();
  m.finalize_grads();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: bench_gpu_step MODEL_DIR BATCH.safetensors OUT_DIR [--iters N] [--device cuda|cpu] "
                         "[--parity PARITY.safetensors] [--profile] [--ab] [--variants LIST]\n");
    return 2;
  }
  options o{.model = argv[1], .batch_file = argv[2], .out = argv[3]};
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) o.iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--device" && i + 1 < argc) o.cuda = std::strcmp(argv[++i], "cuda") == 0;
    else if (a == "--parity" && i + 1 < argc) o.parity = argv[++i];
    else if (a == "--profile") o.profile = true;
    else if (a == "--ab") o.ab = true;
    else if (a == "--variants" && i + 1 < argc) o.variants = argv[++i];
    else {
      std::fprintf(stderr, "bench_gpu_step: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    fs::create_directories(o.out);
    const at::Device device = local_device(o.cuda);
    const safetensors_file bf = safetensors_file::open(o.batch_file);
    const batch b{.input_ids = bf.read("input_ids", at::kLong).to(device),
                  .attention_mask = bf.read("attention_mask", at::kLong).to(device)};
    const std::int64_t tokens = b.attention_mask.sum().item<std::int64_t>();
    std::vector<std::string> names;
    {
      std::string list = !o.variants.empty() ? o.variants : o.ab ? "padded,rmpad,rmpad-unfused" : "padded,rmpad";
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t end = std::min(list.find(',', at), list.size());
        if (end > at) names.push_back(list.substr(at, end - at));
        at = end + 1;
      }
    }
    std::string json = "[";
    for (const std::string& name : names) {
      const variant v = variant_named(name);
      std::unique_ptr<loaded> l;
      const auto row = [&](const char* work, double sec, double peak, const std::string& note) {
        if (note.empty())
          std::printf("megadsl %-18s %-8s %9.1f ms %12.0f tok/s  peak %6.1f GiB\n", v.name.c_str(), work, sec * 1e3,
                      static_cast<double>(tokens) / sec, peak);
        else
          std::printf("megadsl %-18s %-8s %s\n", v.name.c_str(), work, note.c_str());
        std::fflush(stdout);
        char r[512];
        if (note.empty())
          std::snprintf(r, sizeof r, "%s{\"layout\": \"%s\", \"work\": \"%s\", \"step_s\": %.6f, \"peak_gib\": %.3f, \"tokens\": %lld}",
                        json.size() > 1 ? ", " : "", v.name.c_str(), work, sec, peak, static_cast<long long>(tokens));
        else  // a row without a time (gpu_throughput.py prints its note)
          std::snprintf(r, sizeof r, "%s{\"layout\": \"%s\", \"work\": \"%s\", \"note\": \"%s\", \"tokens\": %lld}",
                        json.size() > 1 ? ", " : "", v.name.c_str(), work, note.c_str(), static_cast<long long>(tokens));
        json += r;
        std::ofstream(o.out / "megadsl_steps.json") << json << "]\n";  // rows so far, should a later one end the run
      };
      // A variant's failure is its row; the variants after it still run.
      const auto failed = [](const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n')).substr(0, 200);
        for (char& c : what)
          if (c == '"' || c == '\\') c = '\'';
        return what;
      };
      try {
        const auto t0 = std::chrono::steady_clock::now();
        l = load(o, v, at::kBFloat16);
        std::printf("megadsl %-18s loaded in %.1f s\n", v.name.c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      } catch (const c10::OutOfMemoryError&) {
        row("load", 0, 0, "out of device memory while loading");
        continue;
      } catch (const std::exception& e) {
        row("load", 0, 0, "failed: " + failed(e));
        continue;
      }
      set_fused_kernels(v.fused);
      const bool recompute = v.recompute != recompute_kind::none;
      for (const bool backward : {false, true}) {
        if (recompute && !backward) continue;
        const char* work = backward ? "fwd+bwd" : "fwd";
        const auto step = [&] { backward ? fwd_bwd(*l->model, b) : fwd(*l->model, b); };
        const int warmup = v.invariant ? 1 : 2, iters = v.invariant ? std::min(o.iters, 2) : o.iters;
        try {
          for (int i = 0; i < warmup; ++i) step();
          sync(device);
          reset_peak(device);
          std::vector<double> times;
          for (int i = 0; i < iters; ++i) {
            const auto s0 = std::chrono::steady_clock::now();
            step();
            sync(device);
            times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
          }
          row(work, median(times), static_cast<double>(peak_bytes(device)) / (1 << 30), "");
        } catch (const c10::OutOfMemoryError&) {
          for (auto& p : l->model->parameters()) p.tensor.mutable_grad() = at::Tensor();
          row(work, 0, 0, "out of device memory");
        } catch (const std::exception& e) {
          for (auto& p : l->model->parameters()) p.tensor.mutable_grad() = at::Tensor();
          row(work, 0, 0, "failed: " + failed(e));
        }
      }
      set_fused_kernels(true);
      if (v.name == "rmpad" && o.profile) {
        using namespace torch::autograd::profiler;
        const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/false);
        std::set<torch::profiler::impl::ActivityType> acts{torch::profiler::impl::ActivityType::CPU};
        if (device.is_cuda()) acts.insert(torch::profiler::impl::ActivityType::CUDA);
        prepareProfiler(config, acts);
        enableProfiler(config, acts);
        fwd_bwd(*l->model, b);
        sync(device);
        const auto result = disableProfiler();
        result->save((o.out / "megadsl_trace.json").string());
        std::printf("megadsl: profile of one rmpad fwd+bwd step in %s\n", (o.out / "megadsl_trace.json").c_str());
      }
      l.reset();
      if (device.is_cuda()) at::accelerator::emptyCache();
    }
    json += "]\n";
    std::ofstream(o.out / "megadsl_steps.json") << json;
    if (!o.parity.empty()) {
      const safetensors_file pf = safetensors_file::open(o.parity);
      const batch p{.input_ids = pf.read("input_ids", at::kLong).to(device),
                    .attention_mask = pf.read("attention_mask", at::kLong).to(device)};
      std::vector<std::pair<std::string, at::Tensor>> lps;
      c10::NoGradGuard no_grad;
      for (const auto& [name, rmpad, compute] :
           {std::tuple<const char*, bool, std::optional<at::ScalarType>>{"fp32", false, std::nullopt},
            {"bf16_padded", false, at::kBFloat16},
            {"bf16_rmpad", true, at::kBFloat16}}) {
        auto l = load(o, variant{.name = name, .rmpad = rmpad}, compute);
        lps.emplace_back(name, l->model->forward(p).log_probs.to(at::kFloat).cpu());
      }
      write_safetensors(o.out / "megadsl_logprobs.safetensors", lps);
      std::printf("megadsl: parity log-probs in %s\n", (o.out / "megadsl_logprobs.safetensors").c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
