// On CUDA: invariant arithmetic (layout::invariant) gives a sequence's log-probs and entropy the
// same bits whatever else is in its batch, the padding side and padded or packed, on fixtures of
// several kinds of block, in fp32 and bf16 (the gated DeltaNet is refused there, by name); and activation offload (model_options::
// offload_activations) trains to the numbers of full recompute without it, its layer inputs having
// gone to the host.
#include "../catch_torch.hpp"

#include <c10/core/GradMode.h>

#include <cstdlib>
#include <filesystem>

#include "megadsl/hf_config.hpp"
#include "megadsl/layers/activation_offload.hpp"
#include "megadsl/models/checkpoint_model.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "../mp/mp_support.hpp"

namespace megadsl::test {
namespace {

std::filesystem::path fixtures_dir() {
  if (const char* dir = std::getenv("MEGADSL_FIXTURES"); dir != nullptr && *dir != '\0') return dir;
  return MEGADSL_FIXTURES;
}

// `rows` (each 1-D int64) padded to `width` on the left or the right.
batch padded(const std::vector<at::Tensor>& rows, std::int64_t width, bool left) {
  at::Tensor ids = at::zeros({static_cast<std::int64_t>(rows.size()), width}, at::kLong);
  at::Tensor mask = at::zeros_like(ids);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::int64_t n = rows[r].numel(), at = left ? width - n : 0;
    ids[static_cast<std::int64_t>(r)].narrow(0, at, n).copy_(rows[r]);
    mask[static_cast<std::int64_t>(r)].narrow(0, at, n).fill_(1);
  }
  return {.input_ids = ids, .attention_mask = mask};
}

struct outputs {
  at::Tensor log_probs, entropy;  // the target's n - 1 predicted positions, on the CPU
};

// The target (row `row` of b, n tokens) of one forward.
outputs target_of(const model_output& o, std::int64_t row, std::int64_t n, std::int64_t width, bool left) {
  const std::int64_t at = left ? width - n : 0;
  return {o.log_probs[row].narrow(0, at, n - 1).cpu(), o.entropy[row].narrow(0, at, n - 1).cpu()};
}

double differ(const at::Tensor& a, const at::Tensor& b) {
  return at::equal(a, b) ? 0.0 : (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

void check_invariant_on(const at::Device& device) {
  // A dense GQA model, a windowed one, a mixture, MLA, Gemma 2's soft-caps (its explicit core), the
  // gated DeltaNet.
  for (const char* name : {"llama-gqa", "mistral-window-tf5", "qwen3-moe-tf5", "deepseek-v3-tf5", "gemma2-tf5",
                           "qwen3-next-tf5"}) {
    const std::filesystem::path dir = fixtures_dir() / name;
    const hf_config cfg = read_hf_config(dir);
    if (device.is_cuda() && cfg.s.linear_layers.get() != 0) {  // refused there, by name
      auto single = parallel_groups::single();
      CHECK_THROWS_WITH((parallel_model<checkpoint_actor>(single, model_options{.device = device}, cfg.s,
                                                          layout{.rmpad = true, .invariant = true})),
                        Catch::Matchers::Contains("does not cover the gated DeltaNet"));
      continue;
    }
    const std::int64_t vocab = cfg.s.vocab.get();
    auto rng = at::make_generator<at::CPUGeneratorImpl>(11);
    const auto tokens = [&](std::int64_t n) { return at::randint(1, vocab, {n}, rng, at::kLong); };
    const at::Tensor target = tokens(37);
    std::vector<at::Tensor> others;
    for (const std::int64_t n : {5, 64, 1, 130, 23, 300, 2}) others.push_back(tokens(n));
    for (const auto compute : {std::optional<at::ScalarType>{}, std::optional<at::ScalarType>{at::kBFloat16}}) {
      std::optional<outputs> alone;
      for (const bool rmpad : {false, true}) {
        auto single = parallel_groups::single();
        model_options mo{.compute_dtype = compute, .device = device};
        mo.attention_window = cfg.attention_window;
        parallel_model<checkpoint_actor> model(single, mo, cfg.s, layout{.rmpad = rmpad, .invariant = true});
        load_hf(model, single, dir);
        const c10::NoGradGuard no_grad;
        const auto run = [&](const std::vector<at::Tensor>& rows, std::int64_t row, bool left) {
          std::int64_t width = 0;
          for (const at::Tensor& r : rows) width = std::max(width, r.numel());
          return target_of(model.forward(padded(rows, width, left)), row, target.numel(), width, left);
        };
        if (!alone) alone = run({target}, 0, true);
        std::vector<at::Tensor> three{others[0], target, others[1]}, many{others};
        many.insert(many.begin() + 3, target);
        for (const auto& [what, got] : {std::pair<const char*, outputs>{"alone", run({target}, 0, false)},
                                        {"among 3, left-padded", run(three, 1, true)},
                                        {"among 3, right-padded", run(three, 1, false)},
                                        {"among 8, left-padded", run(many, 3, true)},
                                        {"among 8, right-padded", run(many, 3, false)}}) {
          INFO(name << (compute ? " bf16" : " fp32") << (rmpad ? " packed" : " padded") << ": " << what
                    << " against alone, left-padded, padded");
          CHECK(differ(got.log_probs, alone->log_probs) == 0.0);
          CHECK(differ(got.entropy, alone->entropy) == 0.0);
        }
      }
    }
  }
}

void check_offload_on(const at::Device& device) {
  constexpr layout L{.rmpad = true, .recompute = recompute_kind::full};
  auto single = parallel_groups::single();
  model_options plain{.test_init = true, .device = device};
  model_options offloaded = plain;
  offloaded.offload_activations = true;
  parallel_model<causal_lm<tiny8, L>> a(single, plain);
  parallel_model<causal_lm<tiny8, L>> b(single, offloaded);
  const padded_batch pb = make_batch(tiny8::shape.vocab, true);
  const batch in{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output oa = a.forward(in);
  const std::int64_t before = activation_offload_bytes();
  const model_output ob = b.forward(in);
  // Each of the 8 layers' inputs: the packed rows by the hidden size, fp32.
  const std::int64_t rows = pb.mask.sum().item<std::int64_t>();
  CHECK(activation_offload_bytes() - before == 8 * rows * tiny8::shape.hidden.get() * 4);
  CHECK(at::equal(oa.log_probs.cpu(), ob.log_probs.cpu()));
  probe_loss(oa, true).backward();
  probe_loss(ob, true).backward();
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    INFO("gradient of " << a.parameters()[i].name);
    const at::Tensor ga = a.parameters()[i].tensor.grad().cpu(), gb = b.parameters()[i].tensor.grad().cpu();
    CHECK(max_abs_diff(ga, gb) <= 1e-5 * std::max(1.0, ga.abs().max().item<double>()));
  }
}

}  // namespace

TEST_CASE("invariant arithmetic on CUDA: a sequence's outputs are the same bits in any batch, padded or packed", "[cuda]") {
  check_invariant_on(local_device(true));
}

TEST_CASE("activation offload on CUDA: full recompute's gradients, its layer inputs through the host", "[cuda]") {
  check_offload_on(local_device(true));
}

// The same checks on the CPU (hidden: `cuda_tests --need-gpus 0 "[cpu]"`), where invariant
// arithmetic is tested at large by python/tests/test_invariant.py: what tells a failure on CUDA from
// a mistake in the test.
TEST_CASE("invariant arithmetic and activation offload: the CUDA checks on the CPU", "[.cpu]") {
  check_invariant_on(at::kCPU);
  check_offload_on(at::kCPU);
}

}  // namespace megadsl::test
