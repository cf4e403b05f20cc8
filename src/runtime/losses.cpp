// verl's PPO losses (runtime/losses.hpp), line for line with verl 0.9's core_algos.py: the same
// clamps, the same masked sums (NaN outside the mask dropped), the same metrics.
#include "megadsl/runtime/losses.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace megadsl {

namespace {

constexpr std::array<std::pair<std::string_view, policy_loss_mode>, 5> policy_names{{
    {"vanilla", policy_loss_mode::vanilla},
    {"gspo", policy_loss_mode::gspo},
    {"gpg", policy_loss_mode::gpg},
    {"clip_cov", policy_loss_mode::clip_cov},
    {"kl_cov", policy_loss_mode::kl_cov},
}};
constexpr std::array<std::pair<std::string_view, loss_agg_mode>, 5> agg_names{{
    {"token-mean", loss_agg_mode::token_mean},
    {"token-sum", loss_agg_mode::token_sum},
    {"seq-mean-token-sum", loss_agg_mode::seq_mean_token_sum},
    {"seq-mean-token-mean", loss_agg_mode::seq_mean_token_mean},
    {"seq-mean-token-sum-norm", loss_agg_mode::seq_mean_token_sum_norm},
}};
constexpr std::array<std::pair<std::string_view, kl_type>, 7> kl_names{{
    {"k1", kl_type::k1},
    {"kl", kl_type::k1},
    {"abs", kl_type::abs},
    {"k2", kl_type::k2},
    {"mse", kl_type::k2},
    {"k3", kl_type::k3},
    {"low_var_kl", kl_type::k3},
}};

template <class Table, class T>
bool parse(const Table& table, std::string_view name, T& out) {
  for (const auto& [n, v] : table)
    if (n == name) return out = v, true;
  return false;
}

template <class Table, class T>
std::string_view name_in(const Table& table, T v) {
  for (const auto& [n, x] : table)
    if (x == v) return n;
  return "?";
}

// verl_F.masked_sum / masked_mean: values outside the mask count as 0, NaN included.
at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask) {
  return (at::where(mask.to(at::kBool), values, at::zeros({}, values.options())) * mask).sum();
}
at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask, std::int64_t dim) {
  return (at::where(mask.to(at::kBool), values, at::zeros({}, values.options())) * mask).sum(dim);
}
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask) {
  return masked_sum(values, mask) / (mask.sum() + 1e-8);
}

double value(const at::Tensor& t) { return t.detach().to(at::kDouble).item<double>(); }

}  // namespace

bool policy_loss_from_name(std::string_view name, policy_loss_mode& out) { return parse(policy_names, name, out); }
bool loss_agg_from_name(std::string_view name, loss_agg_mode& out) { return parse(agg_names, name, out); }
bool kl_from_name(std::string_view name, kl_type& out, bool& straight_through) {
  straight_through = !name.empty() && name.back() == '+';
  if (straight_through) name.remove_suffix(1);
  return parse(kl_names, name, out);
}
std::string_view name_of(policy_loss_mode m) { return name_in(policy_names, m); }
std::string_view name_of(loss_agg_mode m) { return name_in(agg_names, m); }
std::string_view name_of(kl_type k) { return name_in(kl_names, k); }

void check(const actor_loss_config& c) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("megadsl: actor loss: " + what); };
  if (!(c.clip_ratio_c > 1.0))
    bad("clip_ratio_c = " + std::to_string(c.clip_ratio_c) + " must be greater than 1 (dual-clip's bound, verl's default 3)");
  if (c.agg == loss_agg_mode::seq_mean_token_sum_norm && !(c.loss_scale_factor > 0))
    bad("loss_agg_mode seq-mean-token-sum-norm divides by loss_scale_factor, which is not set; set it to the "
        "response length verl divides by (its response tensors' width)");
  if (c.policy_loss == policy_loss_mode::clip_cov && !(c.clip_cov_ratio > 0))
    bad("clip_cov_ratio must be positive");
  if (c.policy_loss == policy_loss_mode::kl_cov && !(c.kl_cov_ratio > 0)) bad("kl_cov_ratio must be positive");
  if (!(c.temperature > 0)) bad("temperature must be positive");
}

void check(const critic_loss_config& c) {
  if (c.agg == loss_agg_mode::seq_mean_token_sum_norm && !(c.loss_scale_factor > 0))
    throw std::invalid_argument("megadsl: critic loss: loss_agg_mode seq-mean-token-sum-norm divides by "
                                "loss_scale_factor, which is not set");
}

at::Tensor aggregate(const at::Tensor& loss_mat, const at::Tensor& mask, loss_agg_mode mode, const loss_norm& norm,
                     double loss_scale_factor) {
  switch (mode) {
    case loss_agg_mode::token_mean: return masked_sum(loss_mat, mask) / norm.tokens;
    case loss_agg_mode::token_sum: return masked_sum(loss_mat, mask);
    case loss_agg_mode::seq_mean_token_sum:
    case loss_agg_mode::seq_mean_token_sum_norm: {
      const at::Tensor seq_losses = (loss_mat * mask).sum(-1);
      const at::Tensor seq_mask = (mask.sum(-1) > 0).to(loss_mat.scalar_type());
      at::Tensor loss = masked_sum(seq_losses, seq_mask) / norm.sequences;
      if (mode == loss_agg_mode::seq_mean_token_sum_norm) loss = loss / loss_scale_factor;
      return loss;
    }
    case loss_agg_mode::seq_mean_token_mean: {
      const at::Tensor tokens = mask.sum(-1);
      const at::Tensor seq_losses = (loss_mat * mask).sum(-1) / (tokens + 1e-8);
      return masked_sum(seq_losses, (tokens > 0).to(loss_mat.scalar_type())) / norm.sequences;
    }
  }
  throw std::invalid_argument("megadsl: unknown loss_agg_mode");
}

at::Tensor kl_penalty(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, kl_type k, bool straight_through) {
  at::Tensor forward;
  switch (k) {
    case kl_type::k1: forward = log_prob - ref_log_prob; break;
    case kl_type::abs: forward = (log_prob - ref_log_prob).abs(); break;
    case kl_type::k2: forward = 0.5 * (log_prob - ref_log_prob).square(); break;
    case kl_type::k3: {
      const at::Tensor kl = at::clamp(ref_log_prob - log_prob, -20, 20);
      forward = at::clamp(at::exp(kl) - kl - 1, -10, 10);
      break;
    }
  }
  if (!straight_through || k == kl_type::k2) return forward;
  // The value of `k`, the gradient of k2 (an unbiased gradient of the KL).
  const at::Tensor backward = 0.5 * (log_prob - ref_log_prob).square();
  return backward - backward.detach() + forward.detach();
}

loss_result policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
                        const at::Tensor& mask_in, const actor_loss_config& c, const loss_norm& norm,
                        const at::Tensor& rollout_is_weights) {
  const at::Tensor mask = mask_in.to(log_prob.scalar_type());
  const double low = c.clip_ratio_low.value_or(c.clip_ratio), high = c.clip_ratio_high.value_or(c.clip_ratio);
  const at::Tensor& a = advantages;
  loss_result r;
  at::Tensor pg_losses;
  auto weighted = [&](at::Tensor l) { return rollout_is_weights.defined() ? l * rollout_is_weights : l; };
  switch (c.policy_loss) {
    case policy_loss_mode::vanilla: {
      const at::Tensor neg_kl = at::clamp(log_prob - old_log_prob, -20.0, 20.0);
      const at::Tensor ratio = at::exp(neg_kl);
      const at::Tensor pg1 = -a * ratio;
      const at::Tensor pg2 = -a * at::clamp(ratio, 1 - low, 1 + high);
      const at::Tensor clipped1 = at::maximum(pg1, pg2);
      const at::Tensor pg3 = -a * c.clip_ratio_c;
      const at::Tensor clipped2 = at::minimum(pg3, clipped1);
      const at::Tensor negative = a < 0;
      pg_losses = weighted(at::where(negative, clipped2, clipped1));
      c10::NoGradGuard no_grad;
      r.metrics["actor/pg_clipfrac"] = value(masked_mean(at::gt(pg2, pg1).to(mask.scalar_type()), mask));
      r.metrics["actor/ppo_kl"] = value(masked_mean(-neg_kl, mask));
      r.metrics["actor/pg_clipfrac_lower"] =
          value(masked_mean((at::gt(clipped1, pg3) * negative.to(mask.scalar_type())), mask));
      break;
    }
    case policy_loss_mode::gspo: {
      const at::Tensor neg_kl = log_prob - old_log_prob;
      const at::Tensor lengths = mask.sum(-1).clamp_min(1);
      const at::Tensor seq_kl = (neg_kl * mask).sum(-1) / lengths;
      // s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)], in log space, clamped above at 10.
      const at::Tensor log_ratio = at::clamp_max(log_prob - log_prob.detach() + seq_kl.detach().unsqueeze(-1), 10.0);
      const at::Tensor ratio = at::exp(log_ratio);
      const at::Tensor pg1 = -a * ratio;
      const at::Tensor pg2 = -a * at::clamp(ratio, 1 - low, 1 + high);
      pg_losses = weighted(at::maximum(pg1, pg2));
      c10::NoGradGuard no_grad;
      r.metrics["actor/pg_clipfrac"] = value(masked_mean(at::gt(pg2, pg1).to(mask.scalar_type()), mask));
      r.metrics["actor/ppo_kl"] = value(masked_mean(-neg_kl, mask));
      r.metrics["actor/pg_clipfrac_lower"] = 0.0;
      break;
    }
    case policy_loss_mode::gpg:
      pg_losses = weighted(-log_prob * a);
      break;
    case policy_loss_mode::clip_cov: {
      const at::Tensor neg_kl = log_prob - old_log_prob;
      const at::Tensor ratio = at::exp(neg_kl);
      const at::Tensor pg1 = -a * ratio;
      const at::Tensor pg2 = -a * at::clamp(ratio, 1 - low, 1 + high);
      at::Tensor corr = at::ones_like(a);
      {
        c10::NoGradGuard no_grad;
        const at::Tensor valid = mask > 0;
        const at::Tensor clip_by_origin = at::gt(pg2, pg1) & valid;
        at::Tensor cov = (a - masked_mean(a, mask)) * (log_prob.detach() - masked_mean(log_prob.detach(), mask));
        cov.masked_fill_(~valid, -INFINITY);
        cov.masked_fill_(clip_by_origin, -INFINITY);
        const auto clip_num = std::max<std::int64_t>(static_cast<std::int64_t>(c.clip_cov_ratio * value(mask.sum())), 1);
        at::Tensor idx = at::nonzero((cov < c.clip_cov_ub) & (cov > c.clip_cov_lb) & valid);  // (n, 2)
        if (idx.size(0) > 0) {
          const at::Tensor perm = at::randperm(idx.size(0), at::kLong);  // verl's: the global generator
          idx = idx.index_select(0, perm.narrow(0, 0, std::min(clip_num, idx.size(0))).to(idx.device()));
          corr.index_put_({idx.select(1, 0), idx.select(1, 1)}, 0);
        }
        r.metrics["actor/pg_clipfrac"] = value(masked_mean((corr == 0).to(mask.scalar_type()), mask));
        r.metrics["actor/ppo_kl"] = value(masked_mean(-neg_kl, mask));
      }
      pg_losses = weighted(at::maximum(pg1, pg2) * corr);
      break;
    }
    case policy_loss_mode::kl_cov: {
      const at::Tensor neg_kl = log_prob - old_log_prob;
      const at::Tensor ratio = at::exp(neg_kl);
      const at::Tensor pg1 = -a * ratio;
      const at::Tensor pg_kl = -a * ratio + c.ppo_kl_coef * neg_kl.abs();
      at::Tensor replace = at::zeros_like(mask, at::kBool);
      {
        c10::NoGradGuard no_grad;
        const at::Tensor valid = (mask > 0).reshape(-1);
        const at::Tensor valid_idx = at::nonzero(valid).reshape(-1);
        const at::Tensor adv = a.detach().reshape(-1).index_select(0, valid_idx).cpu();
        const at::Tensor logp = log_prob.detach().reshape(-1).index_select(0, valid_idx).cpu();
        const std::int64_t n = adv.size(0);
        if (n > 0) {
          const at::Tensor cov = (adv - adv.mean()) * (logp - logp.mean());
          const std::int64_t k = std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(n) * c.kl_cov_ratio));
          const at::Tensor top = std::get<1>(at::topk(cov, k, 0, /*largest=*/true));
          replace.view(-1).index_fill_(0, valid_idx.index_select(0, top.to(valid_idx.device())), true);
        }
        r.metrics["actor/ppo_kl"] = value(masked_mean(neg_kl.abs(), mask));
      }
      pg_losses = weighted(at::where(replace, pg_kl, pg1));
      break;
    }
  }
  r.loss = aggregate(pg_losses, mask, c.agg, norm, c.loss_scale_factor);
  r.metrics["actor/pg_loss"] = value(r.loss);
  return r;
}

loss_result actor_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
                       const at::Tensor& mask_in, const at::Tensor& entropy, const at::Tensor& ref_log_prob,
                       const at::Tensor& rollout_is_weights, const actor_loss_config& c, const loss_norm& norm) {
  loss_result r = policy_loss(old_log_prob, log_prob, advantages, mask_in, c, norm, rollout_is_weights);
  const at::Tensor mask = mask_in.to(log_prob.scalar_type());
  if (entropy.defined()) {
    const at::Tensor e = aggregate(entropy, mask, c.agg, norm, c.loss_scale_factor);
    r.metrics["actor/entropy_loss"] = value(e);
    if (c.entropy_coeff != 0.0) r.loss = r.loss - c.entropy_coeff * e;
  }
  if (c.kl_coeff != 0.0) {
    if (!ref_log_prob.defined()) throw std::invalid_argument("megadsl: kl_coeff > 0 needs ref_log_probs");
    const at::Tensor kl = aggregate(kl_penalty(log_prob, ref_log_prob, c.kl, c.kl_straight_through), mask, c.agg, norm,
                                    c.loss_scale_factor);
    r.metrics["actor/kl_loss"] = value(kl);
    r.loss = r.loss + kl * c.kl_coeff;
  }
  return r;
}

loss_result value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                       const at::Tensor& mask_in, const critic_loss_config& c, const loss_norm& norm) {
  const at::Tensor mask = mask_in.to(values.scalar_type());
  const at::Tensor clipped = at::max(at::min(values, old_values + c.value_clip), old_values - c.value_clip);
  const at::Tensor vf1 = (values - returns).pow(2), vf2 = (clipped - returns).pow(2);
  loss_result r;
  r.loss = 0.5 * aggregate(at::max(vf1, vf2), mask, c.agg, norm, c.loss_scale_factor);
  c10::NoGradGuard no_grad;
  r.metrics["critic/vf_loss"] = value(r.loss);
  r.metrics["critic/vf_clipfrac"] = value(masked_mean(at::gt(vf2, vf1).to(mask.scalar_type()), mask));
  return r;
}

}  // namespace megadsl
