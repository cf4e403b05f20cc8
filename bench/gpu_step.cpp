// megadsl's side of bench/gpu_throughput.py as a C++ program (the library alone, no Python module):
// one HF checkpoint and one batch, on one CUDA GPU (or the CPU, to check the program).
//
//   bench_gpu_step MODEL_DIR BATCH.safetensors OUT_DIR [--iters N] [--device cuda|cpu]
//                  [--parity PARITY.safetensors] [--profile] [--ab]
//
// BATCH and PARITY hold `input_ids` and `attention_mask` (b, s) int64. For the layouts padded
// (SDPA with the key mask) and remove-padding (the variable-length flash kernel on CUDA), bf16
// compute over fp32 parameters (verl's mixed precision):
//   fwd       log-probs + entropy, no grad
//   fwd+bwd   a PPO-style loss over log-probs and entropy (side_by_side.py's ppo_loss), its
//             backward and finalize_grads (the gradients as a trainer's step has them)
// each the median over --iters steps after two warm-up steps, with the allocator's peak bytes.
// Rows go to stdout and OUT_DIR/megadsl_steps.json. --parity writes OUT_DIR/megadsl_logprobs.
// safetensors: the log-probs of PARITY's batch in fp32, bf16 padded and bf16 remove-padding.
// --profile writes OUT_DIR/megadsl_trace.json, a Kineto trace (with input shapes) of one
// remove-padding fwd+bwd step. --ab adds remove-padding rows with the fused kernels off
// (layers/fused_ops.hpp), on the same machine in the same run: what they save.
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
};

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

std::unique_ptr<loaded> load(const options& o, bool rmpad, std::optional<at::ScalarType> compute) {
  auto l = std::make_unique<loaded>();
  const hf_config cfg = read_hf_config(o.model);
  model_options mo;
  mo.device = local_device(o.cuda);
  mo.compute_dtype = compute;
  mo.attention_window = cfg.attention_window;
  mo.batch_checksum = false;
  l->model = std::make_unique<model_t>(l->groups, mo, cfg.s, layout{.rmpad = rmpad});
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
                         "[--parity PARITY.safetensors] [--profile] [--ab]\n");
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
    std::string json = "[";
    for (const bool rmpad : {false, true}) {
      const auto t0 = std::chrono::steady_clock::now();
      auto l = load(o, rmpad, at::kBFloat16);
      const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<std::pair<bool, bool>> cases{{false, true}, {true, true}};  // (backward, fused)
      if (rmpad && o.ab) cases.insert(cases.end(), {{false, false}, {true, false}});
      for (const auto& [backward, fused] : cases) {
        set_fused_kernels(fused);
        const auto step = [&] { backward ? fwd_bwd(*l->model, b) : fwd(*l->model, b); };
        step();
        step();
        sync(device);
        reset_peak(device);
        std::vector<double> times;
        for (int i = 0; i < o.iters; ++i) {
          const auto s0 = std::chrono::steady_clock::now();
          step();
          sync(device);
          times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
        }
        const double sec = median(times);
        const double peak = static_cast<double>(peak_bytes(device)) / (1 << 30);
        const char* work = backward ? "fwd+bwd" : "fwd";
        const char* layout_name = !fused ? "rmpad-unfused" : rmpad ? "rmpad" : "padded";
        std::printf("megadsl %-13s %-8s %9.1f ms %12.0f tok/s  peak %6.1f GiB  (load %.1f s)\n", layout_name, work,
                    sec * 1e3, static_cast<double>(tokens) / sec, peak, load_s);
        std::fflush(stdout);
        char row[256];
        std::snprintf(row, sizeof row, "%s{\"layout\": \"%s\", \"work\": \"%s\", \"step_s\": %.6f, \"peak_gib\": %.3f, \"tokens\": %lld}",
                      json.size() > 1 ? ", " : "", layout_name, work, sec, peak, static_cast<long long>(tokens));
        json += row;
      }
      set_fused_kernels(true);
      if (rmpad && o.profile) {
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
        auto l = load(o, rmpad, compute);
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
