// The model on CUDA: the same numbers as on the CPU (fp32), bf16 through the fused kernels
// (SDPA for the padded path, the variable-length flash kernel for remove-padding), HF parity on
// the GPU, and tensor parallelism over NCCL. Runs only where a GPU is (cuda_main.cpp skips).
#include "../catch_torch.hpp"

#include <c10/core/GradMode.h>

#include <cstdlib>
#include <filesystem>
#include <limits>

#include "megadsl/hf_config.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/layers/fused_ops.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/layers/vocab_parallel.hpp"
#include "../mp/mp_support.hpp"

namespace megadsl::test {
namespace {

// The fixtures: where this build's tree has them, or $MEGADSL_FIXTURES (a prebuilt binary run from
// another checkout, as on the lent GPU machine).
std::filesystem::path fixtures_dir() {
  if (const char* dir = std::getenv("MEGADSL_FIXTURES"); dir != nullptr && *dir != '\0') return dir;
  return MEGADSL_FIXTURES;
}

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

// The variable-length flash kernel with a window (its left window) and with chunks (sequences cut
// into pieces) against the masked fp32 path on the CPU, on the same bf16 inputs: outputs and the
// gradients of q, k and v. Each must be nearer the masked result of its own size than of one more,
// so an off-by-one in the window or in the cuts cannot pass for bf16 rounding.
TEST_CASE("varlen flash: windows and chunks equal the masked attention, forward and backward", "[cuda]") {
  const at::Device device = local_device(true);
  const std::vector<std::int64_t> cu{0, 37, 200, 300};
  const std::int64_t tokens = 300, groups = 2, per_group = 2, d = 64;
  at::manual_seed(5);
  const at::Tensor q0 = at::randn({tokens, groups, per_group, d}).to(at::kBFloat16);
  const at::Tensor k0 = at::randn({tokens, groups, d}).to(at::kBFloat16);
  const at::Tensor v0 = at::randn({tokens, groups, d}).to(at::kBFloat16);
  const at::Tensor g0 = at::randn({tokens, groups * per_group * d});
  struct result {
    at::Tensor out, dq, dk, dv;
  };
  auto run = [&](const attention_math& m, at::Device on, at::ScalarType type) {
    at::Tensor q = q0.to(on, type).requires_grad_(), k = k0.to(on, type).requires_grad_(),
               v = v0.to(on, type).requires_grad_();
    const at::Tensor out = attention_varlen(q, k, v, cu, m);
    (out.to(at::kFloat) * g0.to(on)).sum().backward();
    return result{out.detach().cpu().to(at::kFloat), q.grad().cpu().to(at::kFloat), k.grad().cpu().to(at::kFloat),
                  v.grad().cpu().to(at::kFloat)};
  };
  auto rel = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>() / b.abs().max().item<double>(); };
  for (const auto& [window, chunk] : {std::pair<std::int64_t, std::int64_t>{16, 0}, {0, 48}, {24, 48}}) {
    INFO("window " << window << ", chunk " << chunk);
    const result flash = run({.window = window, .chunk = chunk}, device, at::kBFloat16);
    const result exact = run({.window = window, .chunk = chunk}, at::kCPU, at::kFloat);
    const result wider = run({.window = window ? window + 1 : 0, .chunk = chunk ? chunk + 1 : 0}, at::kCPU, at::kFloat);
    for (const auto& [name, f, e, w] : {std::tuple<const char*, at::Tensor, at::Tensor, at::Tensor>{"out", flash.out, exact.out, wider.out},
                                        {"dq", flash.dq, exact.dq, wider.dq}, {"dk", flash.dk, exact.dk, wider.dk},
                                        {"dv", flash.dv, exact.dv, wider.dv}}) {
      INFO(name << ": flash vs masked " << rel(f, e) << ", vs one wider " << rel(f, w));
      CHECK(rel(f, e) <= 0.03);
      CHECK(rel(f, e) < 0.25 * rel(f, w));
    }
  }
}

// The fused kernels (fused_ops.hpp) against the composed ops on the same 16-bit inputs: each side
// computes in fp32, so they differ by summation order and the outputs' one rounding.
struct fused_switch {
  explicit fused_switch(bool on) : was(set_fused_kernels(on)) {}
  ~fused_switch() { set_fused_kernels(was); }
  bool was;
};

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.cpu().to(at::kDouble), y = b.cpu().to(at::kDouble);
  return (x - y).abs().max().item<double>() / std::max(1e-30, y.abs().max().item<double>());
}

TEST_CASE("fused kernels: log-probs and entropy over the vocabulary, and their gradient", "[cuda]") {
  const at::Device device = local_device(true);
  // width 1008 (packs of 8) and 1001 (the scalar path); valid columns ending inside a pack (1003);
  // a shard of padding columns; labels out of range.
  for (const auto& [width, start, true_vocab] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1008, 0, 1000},
                                                 {1001, 0, 1001}, {1008, 0, 1003}, {1008, 1008, 2000}, {1008, 2016, 2000}}) {
    INFO("width " << width << " start " << start << " true vocab " << true_vocab);
    at::manual_seed(3);
    const at::Tensor logits0 = (at::randn({37, width}) * 4).to(device, at::kBFloat16);
    at::Tensor labels = at::randint(start - 20, start + width + 20, {37}, at::TensorOptions().dtype(at::kLong)).to(device);
    const vocab_shard shard{.start = start, .true_vocab = true_vocab};
    const at::Tensor g_logp = at::randn({37}).to(device), g_h = at::randn({37}).to(device);
    std::array<at::Tensor, 3> out[2];  // logp, entropy, grad: composed, fused
    for (const bool fused : {false, true}) {
      const fused_switch sw(fused);
      at::Tensor logits = logits0.clone().requires_grad_(true);
      const logprob_entropy r = vocab_parallel_logprob_entropy(logits, labels, shard, nullptr, true);
      ((r.log_probs * g_logp).sum() + (r.entropy * g_h).sum()).backward();
      out[fused] = {r.log_probs.detach(), r.entropy.detach(), logits.grad()};
    }
    if (start < true_vocab) {  // (a shard of padding alone has no log-prob: inf or NaN, by side)
      CHECK(rel_diff(out[1][0], out[0][0]) <= 1e-5);
      CHECK(rel_diff(out[1][1], out[0][1]) <= 1e-5);
    }
    CHECK(out[1][2].scalar_type() == at::kBFloat16);
    CHECK(rel_diff(out[1][2], out[0][2]) <= 1e-2);  // both bf16: one rounding apart at most
    if (width > true_vocab - start)
      CHECK(out[1][2].narrow(1, std::max<std::int64_t>(0, true_vocab - start), width - std::max<std::int64_t>(0, true_vocab - start))
                .abs().max().item<double>() == 0);
  }
  // Without the entropy, and a NaN logit: its row's log-prob is NaN, as the composed ops give it.
  at::manual_seed(4);
  at::Tensor logits = (at::randn({5, 1001}) * 4).to(device, at::kBFloat16);
  logits[2][3] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor labels = at::randint(0, 1001, {5}, at::TensorOptions().dtype(at::kLong)).to(device);
  logprob_entropy r[2];
  for (const bool fused : {false, true}) {
    const fused_switch sw(fused);
    r[fused] = vocab_parallel_logprob_entropy(logits, labels, {.start = 0, .true_vocab = 1001}, nullptr, false);
  }
  CHECK(!r[1].entropy.defined());
  const at::Tensor nan_row = r[1].log_probs.isnan().cpu();
  CHECK((nan_row[2].item<bool>() && nan_row.sum().item<std::int64_t>() == 1));
  CHECK(rel_diff(r[1].log_probs.index({at::tensor({0, 1, 3, 4}).to(device)}),
                 r[0].log_probs.index({at::tensor({0, 1, 3, 4}).to(device)})) <= 1e-5);
}

// The training head in chunks of rows (chunked_head_logprob_entropy) through the fused kernels: the
// composed chunks' log-probs and entropy, and gradients of h and w within one bf16 rounding; the
// whole fused head's too (w's gradient summed over the chunks in fp32).
TEST_CASE("fused kernels in the chunked LM head: the composed chunks' and the whole head's numbers", "[cuda]") {
  const at::Device device = local_device(true);
  at::manual_seed(5);
  const at::Tensor h0 = at::randn({37, 64}).to(device, at::kBFloat16), w0 = (at::randn({1008, 64}) * 0.2).to(device, at::kBFloat16);
  const at::Tensor labels = at::randint(0, 1000, {37}, at::TensorOptions().dtype(at::kLong)).to(device);
  const at::Tensor g_logp = at::randn({37}).to(device), g_h = at::randn({37}).to(device);
  const vocab_shard shard{.start = 0, .true_vocab = 1000};
  std::array<at::Tensor, 4> out[3];  // logp, entropy, grad h, grad w: composed chunks, fused chunks, fused whole
  for (int c = 0; c < 3; ++c) {
    const fused_switch sw(c > 0);
    at::Tensor h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    const logprob_entropy r = c < 2 ? chunked_head_logprob_entropy(h, w, labels, {}, shard, nullptr, true, false, 8)
                                    : vocab_parallel_logprob_entropy(at::linear(h, w), labels, shard, nullptr, true);
    ((r.log_probs * g_logp).sum() + (r.entropy * g_h).sum()).backward();
    out[c] = {r.log_probs.detach(), r.entropy.detach(), h.grad(), w.grad()};
  }
  for (const int c : {1, 2}) {
    INFO((c == 1 ? "fused chunks" : "fused whole") << " against the composed chunks");
    // The same bf16 logits in chunks (one GEMM per chunk either way); the whole head's GEMM of all
    // rows may round some logits the other way.
    const double same_logits = c == 1 ? 1e-5 : 1e-2;
    CHECK(rel_diff(out[c][0], out[0][0]) <= same_logits);
    CHECK(rel_diff(out[c][1], out[0][1]) <= same_logits);
    CHECK(out[c][2].scalar_type() == at::kBFloat16);
    CHECK(rel_diff(out[c][2], out[0][2]) <= 2e-2);
    CHECK(rel_diff(out[c][3], out[0][3]) <= 2e-2);
  }
}

// RoPE's kernel against the composed ops on the same bf16 inputs, on a view of a fused projection
// (q of [q | k | v] per kv group: rows with gaps), full and partial rotary, halves and interleaved
// pairs: within one bf16 rounding of them, forward and backward, and on average no further from
// fp32 (it rounds once where they round up to three times; the mean, since the max is a handful
// of elements in the top binade either way).
TEST_CASE("fused kernels: RoPE forward and backward on views of the projections", "[cuda]") {
  const at::Device device = local_device(true);
  const std::int64_t tokens = 300, groups = 2, per_group = 3, d = 64;
  at::manual_seed(6);
  const at::Tensor qkv0 = at::randn({tokens, groups, per_group + 2, d}).to(device, at::kBFloat16);
  const at::Tensor grad = at::randn({tokens, groups, per_group, d}).to(device);
  const at::Tensor positions = at::cat({at::arange(100), at::arange(200)}).to(device);  // two packed sequences
  for (const std::int64_t rotated : {d, d / 2}) {
    for (const bool interleaved : {false, true}) {
      INFO("rotated " << rotated << " of " << d << (interleaved ? ", interleaved" : ""));
      const at::Tensor inv = 1.0 / at::pow(10000.0, at::arange(0, rotated, 2, at::TensorOptions().dtype(at::kFloat)) / rotated);
      const at::Tensor freqs = positions.to(at::kFloat).unsqueeze(1) * inv.to(device).unsqueeze(0);
      const rope_tables t{at::cat({freqs, freqs}, -1).cos(), at::cat({freqs, freqs}, -1).sin()};
      std::array<at::Tensor, 2> out[3];  // composed bf16, fused bf16, composed fp32: (output, dx)
      for (const int run : {0, 1, 2}) {
        const fused_switch sw(run == 1);
        at::Tensor qkv = (run == 2 ? qkv0.to(at::kFloat) : qkv0.clone()).requires_grad_(true);
        const at::Tensor q = qkv.narrow(2, 0, per_group);  // (T, G, Q, d), rows with gaps
        const at::Tensor o = apply_rope(q, t, interleaved);
        (o.to(at::kFloat) * grad).sum().backward();
        out[run] = {o.detach().to(at::kFloat), qkv.grad().narrow(2, 0, per_group).to(at::kFloat)};
      }
      auto mean_error = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().mean().item<double>(); };
      for (int i = 0; i < 2; ++i) {
        INFO((i == 0 ? "output" : "gradient") << ": fused vs composed " << rel_diff(out[1][i], out[0][i])
                                              << ", mean error from fp32: fused " << mean_error(out[1][i], out[2][i])
                                              << ", composed " << mean_error(out[0][i], out[2][i]));
        CHECK(rel_diff(out[1][i], out[0][i]) <= 1e-2);
        CHECK(mean_error(out[1][i], out[2][i]) <= mean_error(out[0][i], out[2][i]));
      }
    }
  }
}

TEST_CASE("fused kernels: SwiGLU forward and backward; a bf16 model with and without them", "[cuda]") {
  const at::Device device = local_device(true);
  for (const std::int64_t f : {96, 7}) {  // packs of 8, and the scalar path
    INFO("f " << f);
    at::manual_seed(5);
    const at::Tensor gu0 = (at::randn({50, 2 * f}) * 3).to(device, at::kBFloat16);
    const at::Tensor dy = at::randn({50, f}).to(device, at::kBFloat16);
    at::Tensor gu = gu0.clone().requires_grad_(true);
    const at::Tensor y = fused_swiglu(gu);
    y.backward(dy);
    at::Tensor ref = gu0.to(at::kFloat).requires_grad_(true);
    const auto halves = ref.chunk(2, -1);
    const at::Tensor yr = at::silu(halves[0]) * halves[1];
    yr.backward(dy.to(at::kFloat));
    CHECK(rel_diff(y, yr) <= 1e-2);
    CHECK(rel_diff(gu.grad(), ref.grad()) <= 1e-2);
  }
  // The whole model: bf16 with the fused kernels (SwiGLU, RMSNorm, log-probs) against bf16 without.
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny_llama, layout{.rmpad = true}>> model(single, on(device, at::kBFloat16));
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, true);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  model_output o[2];
  for (const bool fused : {false, true}) {
    const fused_switch sw(fused);
    for (auto& prm : model.parameters()) prm.tensor.mutable_grad() = at::Tensor();
    o[fused] = model.forward(b);
    probe_loss(o[fused], true).backward();
  }
  CHECK(masked(o[0].log_probs, o[1].log_probs, o[0].valid) <= 0.02);
  CHECK(masked(o[0].entropy, o[1].entropy, o[0].valid) <= 0.02);
  for (auto& prm : model.parameters()) {
    INFO(prm.name);
    CHECK(prm.tensor.grad().isfinite().all().template item<bool>());
  }
}

TEST_CASE("an HF checkpoint on CUDA matches transformers", "[cuda]") {
  const std::filesystem::path dir = fixtures_dir() / "llama-gqa";
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

// Over NCCL with a GPU per rank; on one GPU with MEGADSL_CUDA_COMM=gloo (host memory, Gloo).
TEST_CASE("tp 2 with SP and remove-padding equals one GPU", "[nccl]") {
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
  CHECK(masked(r.entropy, o.entropy, r.valid) <= 1e-4);
  probe_loss(o, true).backward();
  model.finalize_grads();

  // bf16 with the fused kernels over tp: the log-probs and entropy of vocabulary shards (their max
  // and sums all-reduced), SwiGLU and RMSNorm on each rank's part, the varlen flash kernel; within
  // bf16's tolerance of one GPU (a layout changes only the order of bf16 sums), gradients finite.
  parallel_model<causal_lm<tiny_llama>> ref16(single, on(device, at::kBFloat16));
  parallel_model<causal_lm<tiny_llama, L>> model16(groups, on(device, at::kBFloat16));
  const model_output r16 = ref16.forward(b), o16 = model16.forward(b);
  CHECK(masked(r16.log_probs, o16.log_probs, r16.valid) <= 0.02);
  CHECK(masked(r16.entropy, o16.entropy, r16.valid) <= 0.02);
  CHECK(masked(r.log_probs, r16.log_probs, r.valid) > 0);  // bf16 really: not the fp32 path
  probe_loss(o16, true).backward();
  model16.finalize_grads();
  for (auto& prm : model16.parameters()) {
    INFO(prm.name);
    CHECK(prm.tensor.grad().isfinite().all().template item<bool>());
  }
}

}  // namespace megadsl::test
