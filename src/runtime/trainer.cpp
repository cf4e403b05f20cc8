#include "megadsl/require_valid.hpp"
#include "megadsl/runtime/trainer.hpp"
#include "trainer_impl.hpp"
#include "megadsl/runtime/squared_sum.hpp"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "megadsl/batching.hpp"
#include "megadsl/parallel/agreement.hpp"
#include "megadsl/runtime/offload.hpp"


#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <stdexcept>

namespace megadsl {

namespace {
// Every tensor of a rollout batch, in one list: f(tensor) for each defined one, in place.
template <class F>
rollout_batch each_tensor(rollout_batch b, F f) {
  for (at::Tensor* t : {&b.input_ids, &b.attention_mask, &b.loss_mask, &b.old_log_probs, &b.advantages, &b.ref_log_probs,
                        &b.old_values, &b.returns, &b.rollout_is_weights, &b.routed_experts, &b.temperature})
    if (t->defined()) *t = f(*t);
  for (auto& [name, t] : b.extra)
    if (t.defined()) t = f(t);
  return b;
}

// The global batch's fields by name, for the ranks' agreement check.
named_tensors fields_of(const rollout_batch& b) {
  named_tensors out{{"input_ids", b.input_ids},
                    {"attention_mask", b.attention_mask},
                    {"loss_mask", b.loss_mask},
                    {"old_log_probs", b.old_log_probs},
                    {"advantages", b.advantages},
                    {"ref_log_probs", b.ref_log_probs},
                    {"old_values", b.old_values},
                    {"returns", b.returns},
                    {"routed_experts", b.routed_experts},
                    {"rollout_is_weights", b.rollout_is_weights},
                    {"temperature", b.temperature}};
  for (const auto& [name, t] : b.extra) out.emplace_back(name, t);
  return out;
}
}  // namespace

rollout_batch slice_rows(const rollout_batch& b, std::int64_t begin, std::int64_t end) {
  return each_tensor(b, [&](const at::Tensor& t) { return t.narrow(0, begin, end - begin); });
}

trainer::trainer(model_hooks model, std::vector<named_parameter>& params, const parallel_groups& groups, bool actor,
                 const optimizer_config& opt, const actor_loss_config& actor_cfg,
                 const critic_loss_config& critic_cfg)
    : impl_(std::make_unique<detail::trainer_impl>()) {
  auto& s = *impl_;
  s.model = std::move(model);
  s.params = &params;
  s.groups = &groups;
  s.actor = actor;
  s.opt = opt;
  check(actor_cfg);
  check(critic_cfg);
  s.actor_cfg = actor_cfg;
  s.critic_cfg = critic_cfg;
  // Megatron's default: weight decay on matrices, none on biases and norm weights; or on all.
  std::vector<at::Tensor> decayed, plain;
  if (opt.distributed) s.slices = detail::slices_of(params, groups);
  for (std::size_t i = 0; i < params.size(); ++i)
    (opt.decay_on == weight_decay_scope::all || params[i].tensor.dim() >= 2 ? decayed : plain)
        .push_back(s.optimized(i));
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(opt.lr).betas({opt.beta1, opt.beta2}).eps(opt.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  param_groups.emplace_back(decayed, options(opt.weight_decay));
  if (!plain.empty()) param_groups.emplace_back(plain, options(0.0));
  s.adamw = std::make_unique<torch::optim::AdamW>(param_groups, torch::optim::AdamWOptions(opt.lr));
}

trainer::~trainer() = default;
trainer::trainer(trainer&&) noexcept = default;
trainer& trainer::operator=(trainer&&) noexcept = default;
std::int64_t trainer::steps_done() const { return impl_->steps; }
std::int64_t trainer::samples_done() const { return impl_->samples; }
std::int64_t trainer::steps_skipped() const { return impl_->skipped; }
void trainer::set_batch_checksum(bool on) { impl_->batch_checksum = on; }
void trainer::set_lr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw std::invalid_argument("megadsl: the learning rate must be a finite number >= 0, got " + std::to_string(lr));
  impl_->opt.lr = lr;
  impl_->opt.lr_at = nullptr;
}
double trainer::lr() const { return impl_->opt.lr_at ? impl_->opt.lr_at(impl_->samples) : impl_->opt.lr; }
void trainer::set_weight_decay(double wd) {
  if (!(wd >= 0) || !std::isfinite(wd))
    throw std::invalid_argument("megadsl: the weight decay must be a finite number >= 0, got " + std::to_string(wd));
  impl_->opt.weight_decay = wd;
  impl_->opt.weight_decay_at = nullptr;
}
double trainer::weight_decay() const {
  return impl_->opt.weight_decay_at ? impl_->opt.weight_decay_at(impl_->samples) : impl_->opt.weight_decay;
}

namespace {
std::vector<at::Tensor> moments_of(torch::optim::AdamW& adamw) {
  std::vector<at::Tensor> out;
  for (const auto& [key, st] : adamw.state()) {
    const auto& a = static_cast<const torch::optim::AdamWParamState&>(*st);
    out.push_back(a.exp_avg());
    out.push_back(a.exp_avg_sq());
  }
  return out;
}
}  // namespace

std::int64_t trainer::optimizer_bytes() const { return storage_bytes(moments_of(*impl_->adamw)); }

void trainer::offload_optimizer() {
  if (!impl_->optimizer_offload.offloaded()) impl_->optimizer_offload.offload(moments_of(*impl_->adamw));
}

void trainer::reload_optimizer() { impl_->optimizer_offload.reload(); }

namespace {

// AdamW's moments on the device for a scope: brought back when offloaded (the host copies are the
// state) and offloaded again after it, so a checkpoint can be written or read between phases.
class moments_on_device {
 public:
  explicit moments_on_device(detail::trainer_impl& s) : s_(s), offloaded_(s.optimizer_offload.offloaded()) {
    if (offloaded_) s_.optimizer_offload.reload();
  }
  ~moments_on_device() {
    if (offloaded_) s_.optimizer_offload.offload(moments_of(*s_.adamw));
  }
  moments_on_device(const moments_on_device&) = delete;
  moments_on_device& operator=(const moments_on_device&) = delete;

 private:
  detail::trainer_impl& s_;
  bool offloaded_;
};

}  // namespace

training_state trainer::export_state() const {
  const moments_on_device on_device(*impl_);
  const auto& s = *impl_;
  training_state out{.steps = s.steps, .samples = s.samples};
  auto& state = s.adamw->state();
  const named_parameter* first = nullptr;
  for (std::size_t i = 0; i < s.params->size(); ++i) {
    const named_parameter& p = (*s.params)[i];
    const auto it = state.find(s.optimized(i).unsafeGetTensorImpl());
    const auto* st = it == state.end() ? nullptr : static_cast<const torch::optim::AdamWParamState*>(it->second.get());
    const std::int64_t step = st == nullptr ? 0 : st->step();
    if (first == nullptr) {
      first = &p;
      out.adam_step = step;
    } else if (step != out.adam_step) {
      throw std::logic_error("megadsl: AdamW has taken " + std::to_string(out.adam_step) + " steps for " + first->name +
                             " but " + std::to_string(step) + " for " + p.name +
                             "; a training state holds one step count for every parameter");
    }
    if (st != nullptr && !s.slices.empty()) {  // whole, from every rank's slice (a collective)
      out.exp_avg.push_back(detail::whole_moment(st->exp_avg().detach(), s.slices[i], p.tensor));
      out.exp_avg_sq.push_back(detail::whole_moment(st->exp_avg_sq().detach(), s.slices[i], p.tensor));
    } else if (st != nullptr) {
      out.exp_avg.push_back(st->exp_avg().detach().clone());
      out.exp_avg_sq.push_back(st->exp_avg_sq().detach().clone());
    }
  }
  return out;
}

void trainer::import_state(const training_state& state) {
  const moments_on_device on_device(*impl_);  // the imported moments are offloaded again after
  auto& s = *impl_;
  const std::size_t n = s.params->size();
  const bool moments = !state.exp_avg.empty() || !state.exp_avg_sq.empty();
  if (moments && (state.exp_avg.size() != n || state.exp_avg_sq.size() != n))
    throw std::invalid_argument("megadsl: the training state has " + std::to_string(state.exp_avg.size()) + " and " +
                                std::to_string(state.exp_avg_sq.size()) + " AdamW moments for " + std::to_string(n) +
                                " parameters; expected one of each per parameter");
  if (moments && state.adam_step < 1)
    throw std::invalid_argument("megadsl: the training state has AdamW moments but a step count of " +
                                std::to_string(state.adam_step) + "; expected at least 1");
  for (std::size_t i = 0; moments && i < n; ++i) {
    const auto& p = (*s.params)[i];
    for (const at::Tensor* m : {&state.exp_avg[i], &state.exp_avg_sq[i]})
      if (!m->defined() || m->sizes() != p.tensor.sizes())
        throw std::invalid_argument("megadsl: the AdamW moment of " + p.name + " has shape " +
                                    (m->defined() ? c10::str(m->sizes()) : std::string("(undefined)")) +
                                    ", expected the parameter's " + c10::str(p.tensor.sizes()));
  }
  auto& opt_state = s.adamw->state();
  opt_state.clear();
  for (std::size_t i = 0; moments && i < n; ++i) {
    const at::Tensor& p = s.optimized(i);  // the parameter, or this rank's slice of it
    // A whole moment as the parameter holds it, or this rank's slice of its elements.
    const auto mine = [&](const at::Tensor& m) {
      const at::Tensor t = m.detach().to(p.device(), p.scalar_type());
      if (s.slices.empty()) return t.clone(at::MemoryFormat::Contiguous);
      return t.reshape({-1}).narrow(0, s.slices[i].offset, s.slices[i].size).clone();
    };
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(state.adam_step);
    st->exp_avg(mine(state.exp_avg[i]));
    st->exp_avg_sq(mine(state.exp_avg_sq[i]));
    opt_state[p.unsafeGetTensorImpl()] = std::move(st);
  }
  s.steps = state.steps;
  s.samples = state.samples;
}

namespace {

// What the ranks of a training step must agree on besides its batch: the optimizer's settings and
// rate, the loss's, how the batch is split; `split` the micro-batching's own fields.
field_list step_fields(const detail::trainer_impl& s, double lr, double wd, const step_options& o, field_list split) {
  const optimizer_config& c = s.opt;
  field_list f{{"lr", number_text(lr)},
               {"weight_decay", number_text(wd)},
               {"weight_decay_on", c.decay_on == weight_decay_scope::all ? "all" : "matrices"},
               {"beta1", number_text(c.beta1)},
               {"beta2", number_text(c.beta2)},
               {"eps", number_text(c.eps)},
               {"clip_grad", number_text(c.clip_grad)},
               {"distributed optimizer", c.distributed ? "true" : "false"},
               {"dp_local", o.dp_local ? "true" : "false"},
               {"loss", o.loss ? "the caller's" : s.actor ? "the actor's" : "the critic's"}};
  const auto opt = [](const std::optional<double>& v) { return v ? number_text(*v) : std::string("clip_ratio"); };
  if (s.actor) {
    const actor_loss_config& a = s.actor_cfg;
    field_list more{{"policy_loss", std::string(name_of(a.policy_loss))},
                    {"clip_ratio", number_text(a.clip_ratio)},
                    {"clip_ratio_low", opt(a.clip_ratio_low)},
                    {"clip_ratio_high", opt(a.clip_ratio_high)},
                    {"clip_ratio_c", number_text(a.clip_ratio_c)},
                    {"loss_agg_mode", std::string(name_of(a.agg))},
                    {"loss_scale_factor", number_text(a.loss_scale_factor)},
                    {"entropy_coeff", number_text(a.entropy_coeff)},
                    {"kl_coeff", number_text(a.kl_coeff)},
                    {"kl", std::string(name_of(a.kl)) + (a.kl_straight_through ? "+" : "")},
                    {"clip_cov", number_text(a.clip_cov_ratio) + "," + number_text(a.clip_cov_lb) + "," + number_text(a.clip_cov_ub)},
                    {"kl_cov", number_text(a.kl_cov_ratio) + "," + number_text(a.ppo_kl_coef)},
                    {"temperature", number_text(a.temperature)}};
    f.insert(f.end(), more.begin(), more.end());
  } else {
    f.emplace_back("value_clip", number_text(s.critic_cfg.value_clip));
    f.emplace_back("loss_agg_mode", std::string(name_of(s.critic_cfg.agg)));
    f.emplace_back("loss_scale_factor", number_text(s.critic_cfg.loss_scale_factor));
  }
  f.insert(f.end(), split.begin(), split.end());
  return f;
}

rollout_batch select_rows(const rollout_batch& b, const std::vector<std::int64_t>& rows) {
  const at::Tensor index = at::tensor(rows, at::kLong);
  return each_tensor(b, [&](const at::Tensor& t) { return t.index_select(0, index); });
}

}  // namespace

step_metrics trainer::step(const rollout_batch& global, std::int64_t microbatches, const step_options& o) {
  auto& s = *impl_;
  agree_on_batch(*s.groups->world, batch_call::train_step, o.dp_local ? s.groups->me.dp : -1, {fields_of(global)},
                 s.batch_checksum, step_fields(s, lr(), weight_decay(), o, {{"microbatches", std::to_string(microbatches)}}));
  const std::int64_t rows = global.input_ids.size(0);
  // dp-local rows are this rank's own; else its share of the global batch.
  const std::int64_t dp = o.dp_local ? 1 : s.groups->dp->size(), dp_rank = o.dp_local ? 0 : s.groups->dp->rank();
  if (microbatches < 1)
    throw std::invalid_argument("megadsl: microbatches = " + std::to_string(microbatches) + " must be at least 1");
  if (rows < dp)
    throw std::invalid_argument("megadsl: the global batch has " + std::to_string(rows) + " sequence(s), fewer than the " +
                                std::to_string(dp) + " dp ranks that each train on their share; give at least " +
                                std::to_string(dp) + " sequences (a multiple of dp)");
  if (rows < dp * microbatches)
    throw std::invalid_argument(
        "megadsl: " + std::to_string(microbatches) + " micro-batches do not fit " +
        (dp > 1 ? "the " + std::to_string(rows / dp) + " sequence(s) of each of the " + std::to_string(dp) +
                      " dp ranks (global batch " + std::to_string(rows) + ")"
                : "the " + std::to_string(rows) + " sequence(s) of the batch") +
        ": every micro-batch needs at least one sequence; use at most " + std::to_string(std::max<std::int64_t>(rows / dp, 1)) +
        " micro-batches, or a larger batch");
  require_valid(shape{}, layout{}, run_facts{.world = dp, .global_batch = rows, .micro_batch = rows / dp / microbatches});
  if (rows % (dp * microbatches) != 0)
    throw std::invalid_argument("megadsl: global batch " + std::to_string(rows) + " is not divisible by dp " +
                                std::to_string(dp) + " * microbatches " + std::to_string(microbatches));
  const rollout_batch mine = slice_rows(global, dp_rank * rows / dp, (dp_rank + 1) * rows / dp);
  const std::int64_t per_micro = rows / dp / microbatches;
  std::vector<rollout_batch> parts;
  for (std::int64_t i = 0; i < microbatches; ++i) parts.push_back(slice_rows(mine, i * per_micro, (i + 1) * per_micro));
  return run(global, std::move(parts), o);
}

step_metrics trainer::step(const rollout_batch& global, const micro_batch_options& options, const step_options& o) {
  const parallel_groups& g = *impl_->groups;
  agree_on_batch(*g.world, batch_call::train_step, o.dp_local ? g.me.dp : -1, {fields_of(global)}, impl_->batch_checksum,
                 step_fields(*impl_, lr(), weight_decay(), o,
                             {{"max_token_len", std::to_string(options.max_token_len)},
                              {"num_micro_batches", std::to_string(options.num_micro_batches)},
                              {"min_num_micro_batch", std::to_string(options.min_num_micro_batch)},
                              {"divisible_by", std::to_string(options.divisible_by)},
                              {"balance_order", options.balance_order ? "true" : "false"}}));
  // dp-local rows: this rank's own, balanced by the dispatcher; else the global batch's share.
  const std::int64_t dp = o.dp_local ? 1 : g.dp->size(), dp_rank = o.dp_local ? 0 : g.dp->rank();
  const at::Tensor lengths = global.attention_mask.sum(1).to(at::kLong).contiguous();
  const std::vector<std::int64_t> seqlens(lengths.data_ptr<std::int64_t>(), lengths.data_ptr<std::int64_t>() + lengths.numel());
  // verl: balance the workload over dp ranks (Karmarkar-Karp, equal sizes), then split this rank's
  // rows into micro-batches within the token budget. Every rank of a pipeline derives the same.
  const partition_list ranks = balance_data_parallel(seqlens, dp);
  const std::vector<std::int64_t>& my_rows = ranks[static_cast<std::size_t>(dp_rank)];
  auto lengths_of = [&](const std::vector<std::int64_t>& rows) {
    std::vector<std::int64_t> out;
    for (std::int64_t r : rows) out.push_back(seqlens[static_cast<std::size_t>(r)]);
    return out;
  };
  const std::vector<std::int64_t> my_lengths = lengths_of(my_rows);
  // The same number of micro-batches on every dp rank (verl's same_micro_num_in_dp): the most any
  // rank needs, which each rank derives alike from the global batch. A mixture's all-to-alls meet
  // across dp ranks in every micro-batch, so a rank with one more would wait for the others forever.
  micro_batch_options same = options;
  if (same.num_micro_batches == 0)
    for (const auto& rows : ranks) same.num_micro_batches = std::max(same.num_micro_batches, micro_batch_count(lengths_of(rows), options));
  if (o.dp_local && options.num_micro_batches == 0) {  // the other dp ranks' rows are theirs: ask them
    at::Tensor most = at::full({1}, same.num_micro_batches, at::kLong);
    g.dp->all_reduce(most, reduce_op::max);
    same.num_micro_batches = most.item<std::int64_t>();
  }
  const micro_batches mbs = rearrange_micro_batches(my_lengths, same);
  std::vector<rollout_batch> parts;
  for (const auto& part : mbs.indices) {
    std::vector<std::int64_t> rows;
    for (std::int64_t i : part) rows.push_back(my_rows[static_cast<std::size_t>(i)]);
    parts.push_back(select_rows(global, rows));
  }
  return run(global, std::move(parts), o);
}

namespace {

rollout_batch on_device(const rollout_batch& b, const at::Device& device) {
  return each_tensor(b, [&](const at::Tensor& t) { return t.device() != device ? t.to(device) : t; });
}

}  // namespace

namespace {

// The metrics the losses report (losses.hpp), in one fixed order on every rank; `true`: summed
// over micro-batches and dp ranks (a share of the global batch's loss), `false`: averaged.
constexpr std::pair<const char*, bool> loss_metrics[] = {
    {"actor/pg_loss", true},          {"actor/pg_clipfrac", false},  {"actor/ppo_kl", false},
    {"actor/pg_clipfrac_lower", false}, {"actor/entropy_loss", true}, {"actor/kl_loss", true},
    {"critic/vf_loss", true},         {"critic/vf_clipfrac", false},
};
constexpr std::size_t metric_count = sizeof loss_metrics / sizeof loss_metrics[0];

// A custom loss's metrics (summed over this rank's `microbatches` on the last stage) averaged over
// the micro-batches and dp ranks, on every rank: the last stage sends its names and sums over the
// pipeline, then the dp ranks add theirs (they must report the same names).
std::map<std::string, double> mean_over_ranks(const std::map<std::string, double>& sums, double microbatches,
                                              const parallel_groups& g) {
  const comm_group& pp = *g.pp;
  const int last = pp.size() - 1;
  std::string names;
  for (const auto& [k, v] : sums) names += k + '\n';
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(names.size()), at::kLong);
  pp.broadcast(length, last);
  at::Tensor text = at::zeros({std::max<std::int64_t>(1, length.item<std::int64_t>())}, at::kByte);
  if (pp.rank() == last && !names.empty()) std::memcpy(text.data_ptr(), names.data(), names.size());
  pp.broadcast(text, last);
  names.assign(static_cast<const char*>(text.data_ptr()), static_cast<std::size_t>(length.item<std::int64_t>()));
  std::vector<std::string> keys;
  for (std::size_t at = 0, end; (end = names.find('\n', at)) != std::string::npos; at = end + 1)
    keys.push_back(names.substr(at, end - at));
  at::Tensor values = at::zeros({static_cast<std::int64_t>(keys.size()) + 1}, at::kDouble);
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (const auto it = sums.find(keys[i]); it != sums.end()) values[static_cast<std::int64_t>(i)] = it->second;
  pp.broadcast(values, last);
  // The dp ranks must agree on the names: compare their count first (a mismatch would fail the sum).
  at::Tensor count = at::full({2}, static_cast<std::int64_t>(keys.size()), at::kLong);
  count[1] = -count[1];
  g.dp->all_reduce(count, reduce_op::max);
  if (count[0].item<std::int64_t>() != -count[1].item<std::int64_t>())
    throw std::invalid_argument("megadsl: the custom loss reported different metrics on different dp ranks; report the "
                                "same names for every micro-batch");
  values[static_cast<std::int64_t>(keys.size())] = microbatches;
  g.dp->all_reduce(values);
  std::map<std::string, double> out;
  const double n = values[static_cast<std::int64_t>(keys.size())].item<double>();
  for (std::size_t i = 0; i < keys.size(); ++i) out[keys[i]] = values[static_cast<std::int64_t>(i)].item<double>() / std::max(n, 1.0);
  return out;
}

}  // namespace

step_metrics trainer::run(const rollout_batch& given, std::vector<rollout_batch> parts, const step_options& o) {
  auto& s = *impl_;
  if (s.optimizer_offload.offloaded())
    throw std::logic_error("megadsl: trainer.step: the optimizer state is offloaded to host memory; call reload_optimizer() (Python: Trainer.reload()) first");
  const custom_loss& custom = o.loss;
  const auto start = std::chrono::steady_clock::now();
  // The global batch's counts: loss tokens, rows with any, rows, real tokens. Every rank sees the
  // whole batch, so no collective is needed, unless each dp rank holds only its own rows.
  // A custom loss may come without a loss_mask: then the real tokens are what it normalises by.
  const at::Tensor per_row = (given.loss_mask.defined() ? given.loss_mask : given.attention_mask).sum(1);
  at::Tensor totals = at::tensor({per_row.sum().item<double>(), (per_row > 0).sum().item<double>(),
                                  static_cast<double>(given.input_ids.size(0)), given.attention_mask.sum().item<double>()},
                                 at::kDouble);
  if (o.dp_local) s.groups->dp->all_reduce(totals);
  const loss_norm counts{.tokens = std::max(1.0, totals[0].item<double>()), .sequences = std::max(1.0, totals[1].item<double>())};
  std::vector<batch> inputs;
  for (const rollout_batch& part : parts)
    inputs.push_back({.input_ids = part.input_ids, .attention_mask = part.attention_mask, .routed_experts = part.routed_experts,
                      .temperature = part.temperature});
  // Metrics of the micro-batches this rank's last stage computed: sums and counts per entry.
  at::Tensor sums = at::zeros({2, static_cast<std::int64_t>(metric_count)}, at::kDouble);
  std::map<std::string, double> custom_sums;  // a custom loss's metrics, summed over micro-batches
  const loss_function loss = [&](const model_output& out, std::int64_t index) {
    // The rollout usually lives on the CPU; the outputs on the model's device.
    const rollout_batch mb = on_device(parts[static_cast<std::size_t>(index)], out.valid.device());
    const loss_result r =
        custom ? custom(out, mb, counts)
        : s.actor ? actor_loss(mb.old_log_probs, out.log_probs, mb.advantages, mb.loss_mask, out.entropy, mb.ref_log_probs,
                             mb.rollout_is_weights, s.actor_cfg, counts)
                : value_loss(out.values, mb.old_values, mb.returns, mb.loss_mask, s.critic_cfg, counts);
    if (custom) {
      for (const auto& [name, v] : r.metrics) custom_sums[name] += v;
    } else {
      for (std::size_t i = 0; i < metric_count; ++i)
        if (const auto it = r.metrics.find(loss_metrics[i].first); it != r.metrics.end()) {
          sums[0][static_cast<std::int64_t>(i)] += it->second;
          sums[1][static_cast<std::int64_t>(i)] += 1;
        }
    }
    return r.loss;
  };
  // step() checked the batch these micro-batches come from: forward_backward need not again.
  const forward_options options{.temperature = s.actor ? s.actor_cfg.temperature : 1.0, .batch_checked = true};
  if (given.temperature.defined() && options.temperature != 1.0)
    throw std::invalid_argument("megadsl: the batch gives per-row temperatures and the actor loss's temperature is " +
                                std::to_string(options.temperature) + "; give one or the other");

  s.zero_grads();
  double total = s.model.forward_backward(inputs, loss, options);
  at::Tensor total_t = at::full({1}, total, at::kDouble);
  s.groups->dp->all_reduce(total_t);  // each dp rank summed its share of the global loss
  // The last stage's metrics to every stage, then over the dp ranks (tp ranks hold the same).
  s.groups->pp->all_reduce(sums);
  s.groups->dp->all_reduce(sums);
  std::map<std::string, double> custom_means;
  if (custom) custom_means = mean_over_ranks(custom_sums, static_cast<double>(parts.size()), *s.groups);
  // Megatron's distributed optimizer: the gradients reduce-scattered over dp, each rank summing
  // only its slices; otherwise all-reduced.
  const bool scatter = s.scatters();
  s.model.finalize(!scatter);
  if (scatter) s.scatter_grads(s.opt.grad_bucket_elements);
  const double norm = scatter ? s.slice_norm() : s.model.grad_norm();
  const double loss_value = total_t.item<double>();
  step_metrics m;
  m.loss = loss_value;
  for (std::size_t i = 0; i < metric_count; ++i) {
    const double sum = sums[0][static_cast<std::int64_t>(i)].item<double>(), n = sums[1][static_cast<std::int64_t>(i)].item<double>();
    if (n > 0) m.losses[loss_metrics[i].first] = loss_metrics[i].second ? sum : sum / n;
  }
  for (const auto& [name, v] : custom_means) m.losses[name] = v;
  m.grad_norm = norm;
  m.tokens = static_cast<std::int64_t>(totals[3].item<double>());
  if (s.model.aux_loss) m.moe_aux_loss = s.model.aux_loss();
  // Megatron's rule: a step whose gradient norm (or loss) is not finite is not applied. The norm
  // and the loss are the same on every rank, so every rank skips alike; the schedule's counters
  // stay, as Megatron's scheduler does not advance on a skipped iteration.
  if (!std::isfinite(norm) || !std::isfinite(loss_value)) {
    s.zero_grads();
    ++s.skipped;
    m.skipped = true;
    m.lr = lr();
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return m;
  }
  if (s.opt.clip_grad > 0 && norm > s.opt.clip_grad) {
    const double coeff = s.opt.clip_grad / (norm + 1e-6);
    for (auto& p : *s.params)
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().mul_(coeff);
    if (scatter)
      for (auto& sl : s.slices)
        if (sl.view.grad().defined() && sl.group != nullptr) sl.view.mutable_grad().mul_(coeff);
  }
  const double rate = lr();
  const double wd = s.opt.weight_decay_at ? s.opt.weight_decay_at(s.samples) : s.opt.weight_decay;
  auto& groups = s.adamw->param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(groups[g].options());
    o.lr(rate);
    if (g == 0) o.weight_decay(wd);
  }
  s.optimizer_step();
  ++s.steps;
  s.samples += static_cast<std::int64_t>(totals[2].item<double>());

  m.lr = rate;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.tokens_per_second = static_cast<double>(m.tokens) / std::max(m.seconds, 1e-9);
  return m;
}

}  // namespace megadsl
