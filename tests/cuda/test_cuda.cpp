// The model on CUDA: the same numbers as on the CPU (fp32), bf16 through the fused kernels
// (SDPA for the padded path, the variable-length flash kernel for remove-padding), HF parity on
// the GPU, and tensor parallelism over NCCL. Runs only where a GPU is (cuda_main.cpp skips).
#include "../catch_torch.hpp"

#include <c10/core/GradMode.h>

#include "megadsl/hf_config.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/io/safetensors.hpp"
#include "../mp/mp_support.hpp"

namespace megadsl::test {
namespace {

double masked(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  return ((a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)) * valid.cpu().to(at::kDouble)).abs().max().item<double>();
}

model_options on(at::Device device, std::optional<at::ScalarType> compute = std::nullopt) {
  return {.test_init = true, .compute_dtype = compute, .device = device};
}

template <layout L>
void check_cuda_equals_cpu(bool left_padding) {
  INFO("tp=1 rmpad=" << L.rmpad.get() << (left_padding ? " left" : " right"));
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny_llama, L>> cpu(single, on(at::kCPU));
  parallel_model<causal_lm<tiny_llama, L>> gpu(single, on(local_device(true)));
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, left_padding);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output c = cpu.forward(b), g = gpu.forward(b);
  CHECK(g.log_probs.is_cuda());
  CHECK(masked(c.log_probs, g.log_probs, c.valid) <= 1e-4);
  CHECK(masked(c.entropy, g.entropy, c.valid) <= 1e-4);
  probe_loss(c, true).backward();
  probe_loss(g, true).backward();
  for (std::size_t i = 0; i < cpu.parameters().size(); ++i) {
    const auto& pc = cpu.parameters()[i];
    const auto& pg = gpu.parameters()[i];
    INFO("gradient of " << pc.name);
    const double scale = std::max(1.0, pc.tensor.grad().abs().max().template item<double>());
    CHECK(max_abs_diff(pc.tensor.grad(), pg.tensor.grad().cpu()) <= 1e-4 * scale);
  }
}

}  // namespace

TEST_CASE("fp32 on CUDA equals fp32 on the CPU: outputs and every gradient", "[cuda]") {
  check_cuda_equals_cpu<layout{}>(true);
  check_cuda_equals_cpu<layout{.rmpad = true}>(false);
}

TEST_CASE("bf16 on CUDA: varlen flash (rmpad) and SDPA (padded) agree, and stay near fp32", "[cuda]") {
  const at::Device device = local_device(true);
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny_llama, layout{}>> padded(single, on(device, at::kBFloat16));
  parallel_model<causal_lm<tiny_llama, layout{.rmpad = true}>> packed(single, on(device, at::kBFloat16));
  parallel_model<causal_lm<tiny_llama, layout{}>> fp32(single, on(at::kCPU));
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, true);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output p = padded.forward(b), r = packed.forward(b), f = fp32.forward(b);
  CHECK(masked(p.log_probs, r.log_probs, f.valid) <= 0.02);
  CHECK(masked(f.log_probs, r.log_probs, f.valid) <= 0.02);
  probe_loss(r, true).backward();
  for (auto& prm : packed.parameters()) {
    INFO(prm.name);
    CHECK(prm.tensor.grad().scalar_type() == at::kFloat);
    CHECK(prm.tensor.grad().isfinite().all().template item<bool>());
  }
}

TEST_CASE("a batch already on the GPU gives what the same batch from the CPU gives, padded and packed", "[cuda]") {
  // The Python module and bench_gpu_step hand the model CUDA tensors: packing runs on their device.
  const at::Device device = local_device(true);
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny_llama, layout{}>> padded(single, on(device, at::kBFloat16));
  parallel_model<causal_lm<tiny_llama, layout{.rmpad = true}>> packed(single, on(device, at::kBFloat16));
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, true);
  const batch on_cpu{.input_ids = pb.ids, .attention_mask = pb.mask};
  const batch on_gpu{.input_ids = pb.ids.to(device), .attention_mask = pb.mask.to(device)};
  c10::NoGradGuard no_grad;
  const model_output a = padded.forward(on_cpu), b = padded.forward(on_gpu);
  const model_output c = packed.forward(on_cpu), d = packed.forward(on_gpu);
  CHECK(masked(a.log_probs, b.log_probs, a.valid) == 0);
  CHECK(masked(c.log_probs, d.log_probs, c.valid) == 0);
  CHECK(masked(c.entropy, d.entropy, c.valid) == 0);
}

struct any_llama : any_decoder<dynamic_shape> {
  static constexpr std::string_view name = "any-llama";
};

TEST_CASE("an HF checkpoint on CUDA matches transformers", "[cuda]") {
  const std::filesystem::path dir = std::filesystem::path(MEGADSL_FIXTURES) / "llama-gqa";
  const shape s = read_hf_config(dir).s;
  auto single = parallel_groups::single();
  parallel_model<causal_lm<any_llama, dynamic_layout>> model(single, {.device = local_device(true)}, s, layout{.rmpad = true});
  load_hf(model, single, dir);
  const safetensors_file ref = safetensors_file::open(dir / "reference.safetensors");
  const at::Tensor ids = ref.read("left.input_ids", at::kLong), mask = ref.read("left.attention_mask", at::kLong);
  const model_output out = model.forward({.input_ids = ids, .attention_mask = mask});
  CHECK(masked(ref.read("left.log_probs", at::kFloat), out.log_probs, out.valid) <= 1e-4);
}

TEST_CASE("a PPO step on CUDA (rollout on the CPU) equals one on the CPU", "[cuda]") {
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny8>> cpu(single, on(at::kCPU));
  parallel_model<causal_lm<tiny8>> gpu(single, on(local_device(true)));
  const optimizer_config opt{.lr = 1e-4, .eps = 1e-6};
  trainer tc = make_trainer(cpu, single, opt, {.entropy_coeff = 0.01});
  trainer tg = make_trainer(gpu, single, opt, {.entropy_coeff = 0.01});
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const step_metrics a = tc.step(rb, 2), b = tg.step(rb, 2);
  CHECK(std::abs(a.loss - b.loss) <= 1e-4 * std::max(1.0, std::abs(a.loss)));
  for (std::size_t i = 0; i < cpu.parameters().size(); ++i) {
    INFO(cpu.parameters()[i].name);
    CHECK(max_abs_diff(cpu.parameters()[i].tensor.detach(), gpu.parameters()[i].tensor.detach().cpu()) <= 1e-4);
  }
}

TEST_CASE("tp 2 over NCCL equals one GPU", "[nccl]") {
  constexpr layout L{.tp = 2, .sp = true, .rmpad = true};
  const at::Device device = local_device(true);
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny_llama>> ref(single, on(device));
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<tiny_llama, L>> model(groups, on(device));
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, true);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output r = ref.forward(b), o = model.forward(b);
  CHECK(masked(r.log_probs, o.log_probs, r.valid) <= 1e-4);
  probe_loss(o, true).backward();
  model.finalize_grads();
}

}  // namespace megadsl::test
