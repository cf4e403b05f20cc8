// verl's PPO losses, natively (verl 0.9 `trainer/ppo/core_algos.py` and `workers/utils/losses.py`):
// the policy losses (vanilla with dual-clip and asymmetric clip, gspo, gpg, clip_cov, kl_cov),
// every loss_agg_mode, rollout importance-sampling weights, the KL penalties with verl's clamps
// and straight-through variants, the entropy bonus, the clipped value loss, and the metrics verl
// logs under its own names. Each matches verl's function on the same tensors (tested against
// verl's own code, python/tests/test_verl_losses.py).
//
// Tensors are (b, s) over the whole sequence; `mask` marks the positions the loss trains (verl's
// response_mask). Aggregation divides by the *global* batch's counts (loss_norm), so the
// micro-batches' losses add up over micro-batches and dp ranks to the loss of the whole batch,
// whatever the split (verl's global_batch_info, with megadsl's gradient sum over dp in place of
// DDP's mean times dp_size).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace megadsl {

enum class policy_loss_mode : std::int8_t { vanilla, gspo, gpg, clip_cov, kl_cov };
enum class loss_agg_mode : std::int8_t { token_mean, token_sum, seq_mean_token_sum, seq_mean_token_mean, seq_mean_token_sum_norm };
// verl's kl_penalty types: k1 ("kl"), abs, k2 ("mse"), k3 ("low_var_kl", clamped as verl does).
enum class kl_type : std::int8_t { k1, abs, k2, k3 };

// verl's names: "vanilla", "gspo", ...; "token-mean", "seq-mean-token-sum", ...; "k1"/"kl", "abs",
// "k2"/"mse", "k3"/"low_var_kl" with an optional "+" (straight-through k2 gradient). Each parser
// returns false for a name it does not know.
bool policy_loss_from_name(std::string_view name, policy_loss_mode& out);
bool loss_agg_from_name(std::string_view name, loss_agg_mode& out);
bool kl_from_name(std::string_view name, kl_type& out, bool& straight_through);
std::string_view name_of(policy_loss_mode m);
std::string_view name_of(loss_agg_mode m);
std::string_view name_of(kl_type k);

// The actor's loss: policy loss + kl_coeff * KL - entropy_coeff * entropy, each aggregated alike.
struct actor_loss_config {
  policy_loss_mode policy_loss = policy_loss_mode::vanilla;
  double clip_ratio = 0.2;                 // ratio clipped to [1 - low, 1 + high]
  std::optional<double> clip_ratio_low;    // default: clip_ratio
  std::optional<double> clip_ratio_high;   // default: clip_ratio (DAPO's clip-higher sets it above)
  double clip_ratio_c = 3.0;               // dual-clip's bound for negative advantages (> 1), verl's default
  loss_agg_mode agg = loss_agg_mode::token_mean;
  double loss_scale_factor = 0;            // seq-mean-token-sum-norm's divisor (verl: the response length)
  double entropy_coeff = 0.0;              // loss -= entropy_coeff * entropy
  double kl_coeff = 0.0;                   // loss += kl_coeff * KL(policy || reference) (verl's use_kl_loss)
  kl_type kl = kl_type::k3;
  bool kl_straight_through = false;        // "k3+": k3's value, k2's gradient
  double clip_cov_ratio = 0.0002, clip_cov_lb = 1.0, clip_cov_ub = 5.0;  // clip_cov
  double kl_cov_ratio = 0.0002, ppo_kl_coef = 1.0;                        // kl_cov
  double temperature = 1.0;                // logits / temperature in the update's forward
};

struct critic_loss_config {
  double value_clip = 0.5;  // v clipped to old_value +- value_clip
  loss_agg_mode agg = loss_agg_mode::token_mean;
  double loss_scale_factor = 0;
};

// The global batch's counts a micro-batch's loss is divided by: loss tokens, and sequences with
// at least one loss token.
struct loss_norm {
  double tokens = 1;
  double sequences = 1;
};

// A micro-batch's loss (a scalar with the graph) and its metrics under verl's names: "actor/pg_loss",
// "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy_loss",
// "actor/kl_loss" (with kl_coeff), "critic/vf_loss", "critic/vf_clipfrac". The loss entries add up
// over micro-batches and dp ranks (like the loss); the fractions and ppo_kl are the micro-batch's
// means (verl averages them over micro-batches).
struct loss_result {
  at::Tensor loss;
  std::map<std::string, double> metrics;
};

// verl's agg_loss over the global counts.
at::Tensor aggregate(const at::Tensor& loss_mat, const at::Tensor& mask, loss_agg_mode mode, const loss_norm& norm,
                     double loss_scale_factor = 0);
// verl's kl_penalty.
at::Tensor kl_penalty(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, kl_type k, bool straight_through);

// verl's policy loss of `mode` (without entropy and KL terms); `rollout_is_weights` may be undefined.
loss_result policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
                        const at::Tensor& mask, const actor_loss_config& c, const loss_norm& norm,
                        const at::Tensor& rollout_is_weights = {});

// The whole actor loss of verl's ppo_loss: policy loss - entropy_coeff * entropy + kl_coeff * KL.
// `entropy` and `ref_log_prob` may be undefined when their coefficient is 0.
loss_result actor_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
                       const at::Tensor& mask, const at::Tensor& entropy, const at::Tensor& ref_log_prob,
                       const at::Tensor& rollout_is_weights, const actor_loss_config& c, const loss_norm& norm);

// verl's compute_value_loss: 0.5 * agg(max((v - R)^2, (clip(v, old +- c) - R)^2)).
loss_result value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                       const at::Tensor& mask, const critic_loss_config& c, const loss_norm& norm);

// Throws std::invalid_argument naming the field when a configuration is unusable (clip_ratio_c <=
// 1, seq-mean-token-sum-norm without loss_scale_factor, a covariance ratio <= 0, ...).
void check(const actor_loss_config& c);
void check(const critic_loss_config& c);

}  // namespace megadsl
