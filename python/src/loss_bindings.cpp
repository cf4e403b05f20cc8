// verl's losses from Python (runtime/losses.hpp): the options Model.trainer() takes, and the loss
// functions themselves on torch tensors (megadsl.policy_loss, actor_loss, value_loss, kl_penalty),
// the ones the trainer runs per micro-batch.
#include <torch/extension.h>

#include <string>

#include "bindings.hpp"
#include "megadsl/lr_schedule.hpp"
#include "megadsl/runtime/losses.hpp"

namespace py = pybind11;

namespace megadsl::python {

namespace {

constexpr const char* optimizer_keys =
    "lr, clip_grad, weight_decay, weight_decay_on, beta1, beta2, eps, lr_decay_style, min_lr, lr_warmup_init, lr_warmup_samples, "
    "lr_decay_samples, lr_wsd_decay_samples, lr_wsd_decay_style, use_distributed_optimizer";
constexpr const char* loss_keys =
    "policy_loss, clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode, loss_scale_factor, "
    "entropy_coeff, kl_coeff, kl, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio, ppo_kl_coef, temperature, "
    "value_clip";

std::string text_of(const py::handle& v) { return py::str(v); }

}  // namespace

loss_options loss_options_of(const py::kwargs& kwargs, const char* where, bool with_optimizer) {
  loss_options o;
  lr_schedule_config schedule;  // Megatron's OptimizerParamScheduler, in samples
  bool scheduled = false;
  for (auto [k, v] : kwargs) {
    const std::string key = py::str(k);
    auto number = [&] {
      try {
        return v.cast<double>();
      } catch (const py::cast_error&) {
        throw py::type_error(std::string("megadsl: ") + where + ": " + key + " must be a number, got " + text_of(v));
      }
    };
    auto name = [&] {
      if (!py::isinstance<py::str>(v))
        throw py::type_error(std::string("megadsl: ") + where + ": " + key + " must be a string, got " + text_of(v));
      return v.cast<std::string>();
    };
    actor_loss_config& a = o.actor;
    if (with_optimizer && key == "lr") o.opt.lr = number();
    else if (with_optimizer && key == "clip_grad") o.opt.clip_grad = number();
    else if (with_optimizer && key == "weight_decay") o.opt.weight_decay = number();
    else if (with_optimizer && key == "weight_decay_on") {  // Megatron's "matrices" (default) or torch's "all"
      const std::string n = name();
      if (n != "matrices" && n != "all")
        throw py::value_error(std::string("megadsl: ") + where + ": weight_decay_on is \"matrices\" (Megatron: no " +
                              "decay on biases and norms) or \"all\" (every parameter, as torch's AdamW), got \"" +
                              n + "\"");
      o.opt.decay_on = n == "all" ? weight_decay_scope::all : weight_decay_scope::matrices;
    }
    else if (with_optimizer && key == "beta1") o.opt.beta1 = number();
    else if (with_optimizer && key == "beta2") o.opt.beta2 = number();
    else if (with_optimizer && key == "eps") o.opt.eps = number();
    else if (with_optimizer && key == "use_distributed_optimizer") {  // verl's name; on by default
      if (!py::isinstance<py::bool_>(v))
        throw py::type_error(std::string("megadsl: ") + where + ": use_distributed_optimizer must be True or False, got " + text_of(v));
      o.opt.distributed = v.cast<bool>();
    }
    else if (with_optimizer && key == "lr_decay_style") {
      const std::string n = name();
      bool found = false;
      for (auto style : {lr_decay_style::constant, lr_decay_style::linear, lr_decay_style::cosine,
                         lr_decay_style::inverse_square_root, lr_decay_style::wsd})
        if (name_of(style) == n || (style == lr_decay_style::wsd && n == "wsd")) schedule.decay_style = style, found = true;
      if (!found)
        throw py::value_error(std::string("megadsl: ") + where + ": lr_decay_style \"" + n +
                              "\" is not one of Megatron's constant, linear, cosine, inverse-square-root, WSD");
      scheduled = true;
    } else if (with_optimizer && key == "lr_wsd_decay_style") {
      const std::string n = name();
      bool found = false;
      for (auto style : {wsd_decay_style::linear, wsd_decay_style::cosine, wsd_decay_style::exponential,
                         wsd_decay_style::minus_sqrt})
        if (name_of(style) == n) schedule.wsd_style = style, found = true;
      if (!found)
        throw py::value_error(std::string("megadsl: ") + where + ": lr_wsd_decay_style \"" + n +
                              "\" is not one of linear, cosine, exponential, minus_sqrt");
      scheduled = true;
    } else if (with_optimizer && key == "min_lr") schedule.min_lr = number(), scheduled = true;
    else if (with_optimizer && key == "lr_warmup_init") schedule.init_lr = number(), scheduled = true;
    else if (with_optimizer && key == "lr_warmup_samples") schedule.lr_warmup_steps = number(), scheduled = true;
    else if (with_optimizer && key == "lr_decay_samples")
      schedule.lr_decay_steps = static_cast<std::int64_t>(number()), scheduled = true;
    else if (with_optimizer && key == "lr_wsd_decay_samples")
      schedule.wsd_decay_steps = static_cast<std::int64_t>(number()), scheduled = true;
    else if (key == "policy_loss") {
      const std::string n = name();
      if (!policy_loss_from_name(n, a.policy_loss))
        throw py::value_error(std::string("megadsl: ") + where + ": policy_loss \"" + n +
                              "\" is not one of verl's vanilla, gspo, gpg, clip_cov, kl_cov");
    } else if (key == "clip_ratio") a.clip_ratio = number();
    else if (key == "clip_ratio_low") a.clip_ratio_low = v.is_none() ? std::optional<double>() : number();
    else if (key == "clip_ratio_high") a.clip_ratio_high = v.is_none() ? std::optional<double>() : number();
    else if (key == "clip_ratio_c") a.clip_ratio_c = number();
    else if (key == "loss_agg_mode") {
      const std::string n = name();
      if (!loss_agg_from_name(n, a.agg))
        throw py::value_error(std::string("megadsl: ") + where + ": loss_agg_mode \"" + n +
                              "\" is not one of token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, "
                              "seq-mean-token-sum-norm");
      o.critic.agg = a.agg;
    } else if (key == "loss_scale_factor") {
      a.loss_scale_factor = v.is_none() ? 0.0 : number();
      o.critic.loss_scale_factor = a.loss_scale_factor;
    } else if (key == "entropy_coeff") a.entropy_coeff = number();
    else if (key == "kl_coeff") a.kl_coeff = number();
    else if (key == "kl") {
      const std::string n = name();
      if (!kl_from_name(n, a.kl, a.kl_straight_through))
        throw py::value_error(std::string("megadsl: ") + where + ": kl \"" + n +
                              "\" is not one of verl's k1 (kl), abs, k2 (mse), k3 (low_var_kl), each with an optional + "
                              "(straight-through)");
    } else if (key == "clip_cov_ratio") a.clip_cov_ratio = number();
    else if (key == "clip_cov_lb") a.clip_cov_lb = number();
    else if (key == "clip_cov_ub") a.clip_cov_ub = number();
    else if (key == "kl_cov_ratio") a.kl_cov_ratio = number();
    else if (key == "ppo_kl_coef") a.ppo_kl_coef = number();
    else if (key == "temperature") a.temperature = number();
    else if (key == "value_clip") o.critic.value_clip = number();
    else
      throw py::type_error(std::string("megadsl: ") + where + "() got an unexpected keyword argument '" + key +
                           "'; it takes " + (with_optimizer ? std::string(optimizer_keys) + ", " : std::string()) +
                           loss_keys);
  }
  try {
    check(o.actor);
    check(o.critic);
    if (scheduled) {
      // Megatron's scheduler from lr (its max_lr) and the keywords; the trainer asks it for the rate
      // at the samples consumed so far (its step() counts samples, as Megatron's does).
      schedule.max_lr = o.opt.lr;
      const optimizer_param_scheduler check_now(schedule);  // Megatron's asserts, one line each
      o.opt.lr_at = [schedule](std::int64_t samples) {
        optimizer_param_scheduler s(schedule);
        s.step(samples);
        return s.lr();
      };
    }
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  return o;
}

void bind_losses(py::module_& m) {
  auto norm_of = [](const at::Tensor& mask, std::optional<double> tokens, std::optional<double> sequences) {
    // Without the global counts, the micro-batch is the whole batch (verl without global_batch_info).
    return loss_norm{.tokens = tokens.value_or(mask.sum().item<double>()),
                     .sequences = sequences.value_or((mask.sum(-1) > 0).sum().item<double>())};
  };
  auto result = [](const loss_result& r) { return py::make_tuple(r.loss, r.metrics); };
  m.def(
      "policy_loss",
      [=](const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
          const at::Tensor& response_mask, std::optional<at::Tensor> rollout_is_weights,
          std::optional<double> batch_num_tokens, std::optional<double> global_batch_size, const py::kwargs& kwargs) {
        const loss_options o = loss_options_of(kwargs, "policy_loss", false);
        return result(policy_loss(old_log_prob, log_prob, advantages, response_mask, o.actor,
                                  norm_of(response_mask, batch_num_tokens, global_batch_size),
                                  rollout_is_weights.value_or(at::Tensor())));
      },
      py::arg("old_log_prob"), py::arg("log_prob"), py::arg("advantages"), py::arg("response_mask"), py::kw_only(),
      py::arg("rollout_is_weights") = py::none(), py::arg("batch_num_tokens") = py::none(),
      py::arg("global_batch_size") = py::none(),
      R"(verl's policy loss of `policy_loss` (vanilla with dual-clip, gspo, gpg, clip_cov, kl_cov): returns
(loss, metrics) with verl's metric names. Keywords as Model.trainer() takes them (clip_ratio,
clip_ratio_low/high, clip_ratio_c, loss_agg_mode, loss_scale_factor, ...); batch_num_tokens and
global_batch_size are the global batch's counts (default: this batch's).)");
  m.def(
      "actor_loss",
      [=](const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
          const at::Tensor& response_mask, std::optional<at::Tensor> entropy, std::optional<at::Tensor> ref_log_prob,
          std::optional<at::Tensor> rollout_is_weights, std::optional<double> batch_num_tokens,
          std::optional<double> global_batch_size, const py::kwargs& kwargs) {
        const loss_options o = loss_options_of(kwargs, "actor_loss", false);
        return result(actor_loss(old_log_prob, log_prob, advantages, response_mask, entropy.value_or(at::Tensor()),
                                 ref_log_prob.value_or(at::Tensor()), rollout_is_weights.value_or(at::Tensor()), o.actor,
                                 norm_of(response_mask, batch_num_tokens, global_batch_size)));
      },
      py::arg("old_log_prob"), py::arg("log_prob"), py::arg("advantages"), py::arg("response_mask"), py::kw_only(),
      py::arg("entropy") = py::none(), py::arg("ref_log_prob") = py::none(), py::arg("rollout_is_weights") = py::none(),
      py::arg("batch_num_tokens") = py::none(), py::arg("global_batch_size") = py::none(),
      "verl's ppo_loss: the policy loss - entropy_coeff * entropy + kl_coeff * KL, aggregated alike; (loss, metrics).");
  m.def(
      "value_loss",
      [=](const at::Tensor& vpreds, const at::Tensor& returns, const at::Tensor& values, const at::Tensor& response_mask,
          std::optional<double> batch_num_tokens, std::optional<double> global_batch_size, const py::kwargs& kwargs) {
        const loss_options o = loss_options_of(kwargs, "value_loss", false);
        return result(megadsl::value_loss(vpreds, values, returns, response_mask, o.critic,
                                          norm_of(response_mask, batch_num_tokens, global_batch_size)));
      },
      py::arg("vpreds"), py::arg("returns"), py::arg("values"), py::arg("response_mask"), py::kw_only(),
      py::arg("batch_num_tokens") = py::none(), py::arg("global_batch_size") = py::none(),
      "verl's compute_value_loss (value_clip, loss_agg_mode as keywords): (loss, metrics with critic/vf_clipfrac).");
  m.def(
      "kl_penalty",
      [](const at::Tensor& log_prob, const at::Tensor& ref_log_prob, const std::string& kind) {
        kl_type k{};
        bool straight = false;
        if (!kl_from_name(kind, k, straight))
          throw py::value_error("megadsl: kl_penalty: \"" + kind + "\" is not one of k1, kl, abs, k2, mse, k3, low_var_kl (+)");
        return kl_penalty(log_prob, ref_log_prob, k, straight);
      },
      py::arg("log_prob"), py::arg("ref_log_prob"), py::arg("kl_penalty"), "verl's kl_penalty, per token.");
}

}  // namespace megadsl::python
