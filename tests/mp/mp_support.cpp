#include "mp_support.hpp"

#include <ATen/CPUGeneratorImpl.h>

namespace megadsl::test {

padded_batch make_batch(std::int64_t vocab, bool left_padding, std::uint64_t seed) {
  const std::int64_t b = 4, s = 12;
  const std::int64_t lengths[b] = {12, 7, 1, 9};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor ids = at::randint(0, vocab, {b, s}, gen, at::kLong);
  at::Tensor mask = at::zeros({b, s}, at::kLong);
  for (std::int64_t r = 0; r < b; ++r) {
    const std::int64_t start = left_padding ? s - lengths[r] : 0;
    mask[r].narrow(0, start, lengths[r]).fill_(1);
  }
  ids = ids.masked_fill(mask == 0, vocab - 1);  // a pad id, ignored by the model
  return {ids, mask};
}

std::map<std::string, at::Tensor> gather_hf_tensors(std::vector<named_parameter>& params,
                                                    const runtime_config& c, const comm_group* tp,
                                                    bool gradients) {
  std::map<std::string, at::Tensor> out;
  for (auto& p : params) {
    const at::Tensor local = gradients ? p.tensor.grad() : p.tensor;
    const auto hf = gather_hf(*p.plan, c.s, c.l, tp, local);
    for (std::size_t i = 0; i < hf.size(); ++i) {
      // A tied lm_head's copy on the last stage is the embedding's twin.
      // ({layer} and {expert} expanded with the parameter's own.)
      // (An expert's slice of a stacked HF tensor, gpt-oss's: "name[e]".)
      const std::string key = p.plan->tied ? std::string("model.embed_tokens.weight") : hf_key(*p.plan->row, static_cast<int>(i), p.at);
      out[key] = hf[i];
    }
  }
  return out;
}

at::Tensor probe_loss(const model_output& out, bool actor) {
  if (actor) {
    const at::Tensor w = at::linspace(0.5, 1.5, out.log_probs.numel(), out.log_probs.options()).view(out.log_probs.sizes());
    return (out.log_probs * w).sum() + 0.3 * (out.entropy * w.flip(0)).sum();
  }
  const at::Tensor w = at::linspace(-1.0, 1.0, out.values.numel(), out.values.options()).view(out.values.sizes());
  return (out.values * w).sum();
}

rollout_batch make_rollout(std::int64_t vocab) {
  const std::int64_t b = 8, s = 12;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  const std::int64_t lengths[b] = {12, 7, 3, 9, 12, 5, 10, 8};
  at::Tensor ids = at::randint(0, vocab, {b, s}, gen, at::kLong);
  at::Tensor mask = at::zeros({b, s}, at::kLong);
  for (std::int64_t r = 0; r < b; ++r) mask[r].narrow(0, s - lengths[r], lengths[r]).fill_(1);
  rollout_batch rb;
  rb.input_ids = ids.masked_fill(mask == 0, 0);
  rb.attention_mask = mask;
  // Train the log-probs of the last 5 tokens (the "response"): positions s-6 .. s-2.
  rb.loss_mask = at::zeros({b, s}, at::kFloat);
  rb.loss_mask.narrow(1, s - 6, 5).fill_(1);
  rb.loss_mask = rb.loss_mask * mask.to(at::kFloat);
  rb.old_log_probs = -6.5 + 0.3 * at::randn({b, s}, gen);
  rb.advantages = at::randn({b, s}, gen);
  rb.ref_log_probs = -6.5 + 0.3 * at::randn({b, s}, gen);
  rb.old_values = 0.1 * at::randn({b, s}, gen);
  rb.returns = at::randn({b, s}, gen);
  return rb;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs();  // broadcasts like the tests expect
  return d.numel() == 0 ? 0.0 : d.max().item<double>();                // two empty tensors agree
}

}  // namespace megadsl::test
