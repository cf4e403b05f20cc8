// megadsl.Model and megadsl.Trainer: an HF checkpoint loaded into a layout on this process's
// ranks, its forward pass, checkpoints and the PPO training step. Tensors cross as at::Tensor
// (torch's own type: no copies); the GIL is released while the model computes or does I/O, since
// those are collectives that wait for the other ranks.
// Over 600 lines on purpose: Model and Trainer share the batch conversion and checks above them.
#include <torch/extension.h>
#include <pybind11/stl.h>

#include <cmath>
#include <pybind11/stl/filesystem.h>

#include <optional>
#include <string>

#include "bindings.hpp"
#include "dynamic_model.hpp"
#include "megadsl/layers/activation_offload.hpp"
#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/runtime/lora_io.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/runtime/weight_export.hpp"
#include "world.hpp"

namespace py = pybind11;

namespace megadsl::python {
namespace {

at::ScalarType dtype_of(const std::string& name, const char* what) {
  if (name == "fp32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "fp16" || name == "float16") return at::kHalf;
  throw py::value_error(std::string("megadsl: ") + what + " is \"fp32\", \"bf16\" or \"fp16\", got \"" + name + "\"");
}

// (b, s) token ids or mask on the model's device as int64; a copy only when it is not that already.
at::Tensor as_rows(const at::Tensor& t, const char* name, at::Device device, bool mask) {
  if (t.dim() != 2)
    throw py::value_error(std::string("megadsl: ") + name + " must be 2-D (batch, seq), it has " +
                          std::to_string(t.dim()) + " dimensions");
  if (t.numel() == 0) throw py::value_error(std::string("megadsl: ") + name + " is empty");
  if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/mask))
    throw py::value_error(std::string("megadsl: ") + name + " must hold integers" + (mask ? " or booleans" : "") +
                          ", it is " + std::string(c10::toString(t.scalar_type())));
  return t.to(device, at::kLong);
}

// A float tensor of the rollout batch, shaped like input_ids, on the model's device.
at::Tensor as_values(const at::Tensor& t, const char* name, at::Device device, const at::Tensor& ids) {
  if (!t.sizes().equals(ids.sizes()))
    throw py::value_error(std::string("megadsl: ") + name + " has shape " + c10::str(t.sizes()) +
                          " but input_ids has " + c10::str(ids.sizes()));
  return t.to(device);
}

std::int64_t vocab_of(const dynamic_model& m) { return m.config().s.vocab.get(); }

// A recorded routing to replay (router replay, R2/R3): (b, s, layers, top_k) integers, -1 where a
// position is routed live.
at::Tensor routing_of(const at::Tensor& t, const at::Tensor& ids, at::Device device) {
  if (t.dim() != 4 || t.size(0) != ids.size(0) || t.size(1) != ids.size(1) || at::isFloatingType(t.scalar_type()))
    throw py::value_error("megadsl: routed_experts has shape " + c10::str(t.sizes()) + " (" +
                          std::string(c10::toString(t.scalar_type())) + "); it is (batch, seq, layers, top_k) integers, as "
                          "forward(record_routing=True) returns it, batch and seq those of input_ids " +
                          c10::str(ids.sizes()));
  return t.to(device, at::kLong);
}

void check_ids(const dynamic_model& m, const at::Tensor& ids) {
  const std::int64_t lo = ids.min().item<std::int64_t>(), hi = ids.max().item<std::int64_t>(), v = vocab_of(m);
  if (lo < 0 || hi >= v)
    throw py::value_error("megadsl: input_ids hold " + std::to_string(lo < 0 ? lo : hi) +
                          ", outside the vocabulary (0 to " + std::to_string(v - 1) + ")");
}

batch batch_of(const dynamic_model& m, const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask) {
  const at::Device device = m.config().options.device;
  batch b;
  b.input_ids = as_rows(input_ids, "input_ids", device, false);
  check_ids(m, b.input_ids);
  if (attention_mask) {
    b.attention_mask = as_rows(*attention_mask, "attention_mask", device, true);
    if (!b.attention_mask.sizes().equals(b.input_ids.sizes()))
      throw py::value_error("megadsl: attention_mask has shape " + c10::str(b.attention_mask.sizes()) +
                            " but input_ids has " + c10::str(b.input_ids.sizes()));
  } else {
    b.attention_mask = at::ones_like(b.input_ids);
  }
  return b;
}

struct py_trainer {
  std::shared_ptr<dynamic_model> model;  // the trainer refers to it
  std::unique_ptr<trainer> t;
};

constexpr const char* rollout_fields =
    "input_ids, attention_mask, loss_mask, old_log_probs, advantages, ref_log_probs, rollout_is_weights, old_values, "
    "returns, routed_experts, temperature";

// `custom`: a custom loss reads the batch, so any other tensor field (with the batch's rows) is
// kept for it, and no field beyond the ids and the mask is required.
rollout_batch rollout_of(const dynamic_model& m, const py::dict& d, bool custom = false) {
  const at::Device device = m.config().options.device;
  const bool actor = m.config().head.actor;
  std::optional<at::Tensor> ids, mask;
  rollout_batch r;
  auto tensor = [](const py::handle& v, const std::string& key) {
    try {
      return v.cast<at::Tensor>();
    } catch (const py::cast_error&) {
      throw py::type_error("megadsl: batch[\"" + key + "\"] must be a torch.Tensor, got " +
                           std::string(py::str(py::type::of(v).attr("__name__"))));
    }
  };
  // Two passes: the ids first, the others are checked against their shape.
  for (auto [k, v] : d) {
    const std::string key = py::str(k);
    if (key == "input_ids") ids = tensor(v, key);
    else if (key == "attention_mask") mask = tensor(v, key);
  }
  if (!ids) throw py::key_error(std::string("megadsl: the batch has no input_ids; its fields are ") + rollout_fields);
  const batch b = batch_of(m, *ids, mask);
  r.input_ids = b.input_ids;
  r.attention_mask = b.attention_mask;
  for (auto [k, v] : d) {
    const std::string key = py::str(k);
    if (key == "input_ids" || key == "attention_mask") continue;
    at::Tensor* to = key == "loss_mask"       ? &r.loss_mask
                     : key == "old_log_probs" ? &r.old_log_probs
                     : key == "advantages"    ? &r.advantages
                     : key == "ref_log_probs" ? &r.ref_log_probs
                     : key == "rollout_is_weights" ? &r.rollout_is_weights
                     : key == "old_values"    ? &r.old_values
                     : key == "returns"       ? &r.returns
                                              : nullptr;
    if (key == "temperature") {  // each row's sampling temperature: (b,)
      const at::Tensor t = tensor(v, key);
      if (t.dim() != 1 || t.size(0) != r.input_ids.size(0))
        throw py::value_error("megadsl: batch[\"temperature\"] has shape " + c10::str(t.sizes()) + "; it is (" +
                              std::to_string(r.input_ids.size(0)) + ",), one temperature per row");
      r.temperature = t.to(at::kFloat);
      continue;
    }
    if (key == "routed_experts") {  // router replay: (b, s, layers, top_k) int64
      r.routed_experts = routing_of(tensor(v, key), r.input_ids, device);
      continue;
    }
    if (to == nullptr && custom) {
      const at::Tensor t = tensor(v, key);
      if (t.dim() == 0 || t.size(0) != r.input_ids.size(0))
        throw py::value_error("megadsl: batch[\"" + key + "\"] has shape " + c10::str(t.sizes()) + "; a field needs the batch's " +
                              std::to_string(r.input_ids.size(0)) + " rows first");
      r.extra[key] = t;  // moved to the model's device with its micro-batch
      continue;
    }
    if (to == nullptr)
      throw py::key_error("megadsl: unknown batch field \"" + key + "\"; the fields are " + rollout_fields +
                          " (a Trainer.step with loss_fn= takes any other field too)");
    *to = as_values(tensor(v, key), key.c_str(), device, r.input_ids);
  }
  if (custom) return r;
  auto need = [&](const at::Tensor& t, const char* key) {
    if (!t.defined())
      throw py::key_error(std::string("megadsl: the ") + (actor ? "actor" : "critic") + "'s batch needs " + key);
  };
  need(r.loss_mask, "loss_mask");
  if (actor) {
    need(r.old_log_probs, "old_log_probs");
    need(r.advantages, "advantages");
  } else {
    need(r.old_values, "old_values");
    need(r.returns, "returns");
  }
  return r;
}

// A Python loss as a custom_loss: called under the GIL from whichever thread runs the schedule.
custom_loss python_loss(const py::object& fn) {
  auto holder = std::make_shared<py::object>(fn);
  return [holder](const model_output& out, const rollout_batch& mb, const loss_norm& global) {
    py::gil_scoped_acquire gil;
    py::dict outputs, fields, counts;
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"log_probs", &out.log_probs},
                                  {"entropy", &out.entropy}, {"values", &out.values}, {"valid", &out.valid},
                                  {"logits", &out.logits}})
      if (t->defined()) outputs[name] = *t;
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"input_ids", &mb.input_ids},
                                  {"attention_mask", &mb.attention_mask}, {"loss_mask", &mb.loss_mask},
                                  {"old_log_probs", &mb.old_log_probs}, {"advantages", &mb.advantages},
                                  {"ref_log_probs", &mb.ref_log_probs}, {"rollout_is_weights", &mb.rollout_is_weights},
                                  {"old_values", &mb.old_values}, {"returns", &mb.returns}})
      if (t->defined()) fields[name] = *t;
    for (const auto& [name, t] : mb.extra) fields[py::str(name)] = t;
    counts["batch_num_tokens"] = global.tokens;
    counts["global_batch_size"] = global.sequences;
    const py::object r = (*holder)(outputs, fields, counts);
    loss_result result;
    py::object loss = r;
    if (py::isinstance<py::tuple>(r) && py::len(r) == 2) {
      loss = r[py::int_(0)];
      for (auto [k, v] : r[py::int_(1)].cast<py::dict>()) result.metrics[py::str(k)] = v.cast<double>();
    }
    try {
      result.loss = loss.cast<at::Tensor>();
    } catch (const py::cast_error&) {
      throw py::type_error("megadsl: Trainer.step: loss_fn must return a scalar torch.Tensor (or (loss, metrics)), got " +
                           std::string(py::str(py::type::of(loss).attr("__name__"))));
    }
    if (result.loss.numel() != 1)
      throw py::value_error("megadsl: Trainer.step: loss_fn returned a tensor of shape " + c10::str(result.loss.sizes()) +
                            "; it must return the micro-batch's scalar loss");
    return result;
  };
}

py::dict metrics_of(const step_metrics& m) {
  py::dict d;
  d["loss"] = m.loss;
  d["grad_norm"] = m.grad_norm;
  d["lr"] = m.lr;
  d["tokens"] = m.tokens;
  d["seconds"] = m.seconds;
  d["tokens_per_second"] = m.tokens_per_second;
  d["moe_aux_loss"] = m.moe_aux_loss;
  d["skipped"] = m.skipped;
  for (const auto& [name, v] : m.losses) d[py::str(name)] = v;  // verl's names: actor/pg_clipfrac, ...
  return d;
}

// Python's handle on a model: dropping the last one frees the model without the GIL (a Gloo worker
// thread may need it to drop a tensor Python also refers to, while the group's destructor waits for
// that thread). At exit, megadsl.shutdown() closes the models Python still holds, before the
// interpreter stops letting other threads take the GIL.
std::shared_ptr<dynamic_model> python_handle(std::shared_ptr<dynamic_model> m) {
  dynamic_model* raw = m.get();
  return std::shared_ptr<dynamic_model>(raw, [m = std::move(m)](dynamic_model*) mutable {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      m.reset();
    } else {
      m.reset();
    }
  });
}

std::string repr_of(const dynamic_model& m) {
  const runtime_config& c = m.config();
  const layout& l = c.l;
  std::string s = "megadsl.Model(" + m.source().string() + ", " + (c.head.actor ? "actor" : "critic") +
                  ", tp=" + std::to_string(l.tp.get()) + " pp=" + std::to_string(l.pp.get()) +
                  " vpp=" + std::to_string(l.vpp.get()) + " sp=" + (l.sp.get() ? "on" : "off") +
                  " rmpad=" + (l.rmpad.get() ? "on" : "off") + ", rank " + std::to_string(m.rank()) + " of " +
                  std::to_string(m.world_size()) + (m.closed() ? ", closed)" : ")");
  return s;
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<dynamic_model, std::shared_ptr<dynamic_model>> model(m, "Model", R"(An HF checkpoint (Llama, Mistral,
Qwen2) loaded into a parallel layout: this rank's shards, run over the job's process groups.
Build it with Model.from_hf(...) on every rank of the job.)");
  model.def_static(
      "from_hf",
      [](const std::filesystem::path& path, std::optional<layout> given, std::optional<std::int64_t> tp,
         std::optional<std::int64_t> pp, std::optional<std::int64_t> vpp, std::optional<bool> sp,
         std::optional<bool> rmpad, std::optional<std::int64_t> first_stage_layers,
         std::optional<std::int64_t> last_stage_layers, std::optional<std::int64_t> vocab_pad_multiple,
         std::optional<std::int64_t> ep, std::optional<std::string> recompute, std::optional<std::int64_t> cp,
         std::optional<bool> invariant, std::optional<std::string> cp_comm, std::optional<std::int64_t> cp_a2a, bool critic,
         bool value_bias, const std::string& dtype, const std::string& device, std::uint64_t seed,
         bool batch_checksum, double moe_aux_loss_coeff, bool moe_aux_loss_per_sequence, double moe_z_loss_coeff,
         double moe_expert_bias_update_rate, const py::object& dropout, std::int64_t head_chunk_tokens,
         bool offload_activations, const std::optional<std::filesystem::path>& lora_adapter, std::int64_t lora_rank, double lora_alpha,
         const py::object& lora_target_modules, const py::object& lora_target_parameters, double lora_dropout) {
        layout l = given.value_or(layout{});
        if (given && (tp || pp || vpp || sp || rmpad || first_stage_layers || last_stage_layers || vocab_pad_multiple || ep ||
                      recompute || cp || invariant || cp_comm || cp_a2a))
          throw py::value_error("megadsl.Model.from_hf: give layout= or the layout keywords (tp=, pp=, ...), not both");
        if (tp) l.tp = *tp;
        if (pp) l.pp = *pp;
        if (vpp) l.vpp = *vpp;
        if (sp) l.sp = *sp;
        if (rmpad) l.rmpad = *rmpad;
        if (first_stage_layers) l.first_stage_layers = *first_stage_layers;
        if (last_stage_layers) l.last_stage_layers = *last_stage_layers;
        if (vocab_pad_multiple) l.vocab_pad_multiple = *vocab_pad_multiple;
        if (ep) l.ep = *ep;
        if (cp) l.cp = *cp;
        if (cp_comm) l.cp_comm = cp_comm_of(*cp_comm);
        if (cp_a2a) l.cp_a2a = *cp_a2a;
        if (recompute) l.recompute = recompute_of(*recompute);
        if (invariant) l.invariant = *invariant;
        if (!critic && !value_bias)
          throw py::value_error("megadsl.Model.from_hf: value_bias=False goes with critic=True (the value head's bias)");
        hf_model_options o;
        o.l = l;
        o.head = {.actor = !critic, .value_bias = value_bias};
        o.options.seed = seed;
        o.options.batch_checksum = batch_checksum;
        if (moe_aux_loss_coeff < 0 || moe_z_loss_coeff < 0)
          throw py::value_error("megadsl.Model.from_hf: moe_aux_loss_coeff and moe_z_loss_coeff are >= 0 (0: off)");
        o.options.moe_aux_loss_coeff = moe_aux_loss_coeff;
        o.options.moe_aux_loss_per_sequence = moe_aux_loss_per_sequence;
        o.options.moe_z_loss_coeff = moe_z_loss_coeff;
        if (!(moe_expert_bias_update_rate >= 0))
          throw py::value_error("megadsl.Model.from_hf: moe_expert_bias_update_rate is >= 0 (0: the expert biases stay as loaded)");
        o.options.moe_expert_bias_update_rate = moe_expert_bias_update_rate;
        if (head_chunk_tokens < -1)
          throw py::value_error("megadsl.Model.from_hf: head_chunk_tokens is a chunk of tokens > 0, 0 (chunks where a "
                                "micro-batch's logits would pass 1 GiB) or -1 (never in training), got " +
                                std::to_string(head_chunk_tokens));
        o.options.head_chunk_tokens = head_chunk_tokens;
        o.options.offload_activations = offload_activations;
        if (lora_adapter) o.lora_adapter = *lora_adapter;
        if (lora_dropout != 0 && lora_rank == 0)
          throw py::value_error("megadsl.Model.from_hf: lora_dropout goes with lora_rank= (fresh adapters); a saved "
                                "adapter's adapter_config.json sets its own lora_dropout");
        if (lora_rank < 0) throw py::value_error("megadsl.Model.from_hf: lora_rank is > 0 (0: no fresh adapters), got " + std::to_string(lora_rank));
        if (lora_rank > 0) {
          if (lora_adapter)
            throw py::value_error("megadsl.Model.from_hf: give lora_adapter= (a saved adapter) or lora_rank= (fresh "
                                  "adapters), not both");
          if (!(lora_alpha > 0)) throw py::value_error("megadsl.Model.from_hf: lora_alpha is > 0");
          o.new_lora.rank = lora_rank;
          o.new_lora.alpha = lora_alpha;
          if (!(lora_dropout >= 0 && lora_dropout < 1))
            throw py::value_error("megadsl.Model.from_hf: lora_dropout is in [0, 1), got " + std::to_string(lora_dropout));
          o.new_lora.dropout = lora_dropout;
          std::vector<std::string> targets;
          if (lora_target_modules.is_none()) {
            // target_parameters alone
          } else if (py::isinstance<py::str>(lora_target_modules)) {
            targets.push_back(lora_target_modules.cast<std::string>());
            if (targets.back() != all_linear)
              throw py::value_error("megadsl.Model.from_hf: lora_target_modules is \"all-linear\" or a list of module "
                                    "names (\"q_proj\", ...), got the string \"" + targets.back() + "\"");
          } else if (py::isinstance<py::list>(lora_target_modules) || py::isinstance<py::tuple>(lora_target_modules)) {
            for (const py::handle t : lora_target_modules) {
              if (!py::isinstance<py::str>(t))
                throw py::value_error("megadsl.Model.from_hf: lora_target_modules holds " + py::repr(t).cast<std::string>() +
                                      ", not a module name");
              targets.push_back(t.cast<std::string>());
            }
          } else {
            throw py::value_error("megadsl.Model.from_hf: lora_target_modules is \"all-linear\" or a list of module names");
          }
          std::vector<std::string> parameters;  // PEFT's target_parameters: a mixture's experts
          if (!lora_target_parameters.is_none()) {
            if (!(py::isinstance<py::list>(lora_target_parameters) || py::isinstance<py::tuple>(lora_target_parameters)))
              throw py::value_error("megadsl.Model.from_hf: lora_target_parameters is a list of parameter names "
                                    "(\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\") or None");
            for (const py::handle t : lora_target_parameters) {
              if (!py::isinstance<py::str>(t) || t.cast<std::string>().empty() || t.cast<std::string>().size() >= max_lora_target_name)
                throw py::value_error("megadsl.Model.from_hf: lora_target_parameters holds " + py::repr(t).cast<std::string>() +
                                      ", not a parameter name");
              parameters.push_back(t.cast<std::string>());
            }
          }
          if ((targets.empty() && parameters.empty()) || targets.size() > static_cast<std::size_t>(max_lora_targets))
            throw py::value_error("megadsl.Model.from_hf: lora_target_modules names 1 to " + std::to_string(max_lora_targets) +
                                  " modules (or None with lora_target_parameters)");
          if (parameters.size() > static_cast<std::size_t>(max_lora_parameters))
            throw py::value_error("megadsl.Model.from_hf: lora_target_parameters names at most " +
                                  std::to_string(max_lora_parameters) + " parameters");
          for (const std::string& t : targets) {
            if (t.empty() || t.size() >= max_lora_target_name)
              throw py::value_error("megadsl.Model.from_hf: lora_target_modules names \"" + t + "\": empty or too long");
            o.new_lora.target(t);
          }
          for (const std::string& t : parameters) o.new_lora.target_parameter(t);
        }
        // Dropout: config.json's rates (None or True), none (False), or some of its keys at other rates.
        if (py::isinstance<py::bool_>(dropout)) {
          if (!dropout.cast<bool>()) o.options.dropout_chosen = true;  // all rates 0
        } else if (py::isinstance<py::dict>(dropout)) {
          std::vector<std::pair<std::string, double>> keys;
          for (const auto& [k, v] : dropout.cast<py::dict>()) {
            if (!py::isinstance<py::str>(k) || !(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)))
              throw py::value_error("megadsl.Model.from_hf: dropout={...} maps config.json's dropout keys to rates, got " +
                                    py::repr(dropout).cast<std::string>());
            keys.emplace_back(k.cast<std::string>(), v.cast<double>());
          }
          o.options.dropout = dropout_with(read_hf_config(path), keys);  // config_error: ConfigError
          o.options.dropout_chosen = true;
        } else if (!dropout.is_none()) {
          throw py::value_error("megadsl.Model.from_hf: dropout is None or True (config.json's rates), False (none) or "
                                "a dict of config.json's dropout keys and rates, got " + py::repr(dropout).cast<std::string>());
        }
        o.options.dtype = at::kFloat;  // parameters, gradients and AdamW in fp32
        const at::ScalarType compute = dtype_of(dtype, "dtype");
        if (compute == at::kHalf)
          throw py::value_error("megadsl.Model.from_hf: dtype is \"fp32\" or \"bf16\" (bf16 computes over fp32 parameters)");
        if (compute != at::kFloat) o.options.compute_dtype = compute;
        if (device != "cpu" && device != "cuda")
          throw py::value_error("megadsl.Model.from_hf: device is \"cpu\" or \"cuda\", got \"" + device + "\"");
        std::shared_ptr<distributed> world = world_or_single();
        py::gil_scoped_release release;
        o.options.device = local_device(device == "cuda");
        return python_handle(dynamic_model::from_hf(std::move(world), path, o));
      },
      py::arg("path"), py::kw_only(), py::arg("layout") = py::none(), py::arg("tp") = py::none(),
      py::arg("pp") = py::none(), py::arg("vpp") = py::none(), py::arg("sp") = py::none(),
      py::arg("rmpad") = py::none(), py::arg("first_stage_layers") = py::none(),
      py::arg("last_stage_layers") = py::none(), py::arg("vocab_pad_multiple") = py::none(),
      py::arg("ep") = py::none(), py::arg("recompute") = py::none(), py::arg("cp") = py::none(),
      py::arg("invariant") = py::none(), py::arg("cp_comm") = py::none(), py::arg("cp_a2a") = py::none(), py::arg("critic") = false, py::arg("value_bias") = true, py::arg("dtype") = "fp32", py::arg("device") = "cpu",
      py::arg("seed") = 1234, py::arg("batch_checksum") = true, py::arg("moe_aux_loss_coeff") = 0.0,
      py::arg("moe_aux_loss_per_sequence") = false, py::arg("moe_z_loss_coeff") = 0.0,
      py::arg("moe_expert_bias_update_rate") = 1e-3, py::arg("dropout") = py::none(), py::arg("head_chunk_tokens") = 0,
      py::arg("offload_activations") = false,
      py::arg("lora_adapter") = py::none(), py::arg("lora_rank") = 0, py::arg("lora_alpha") = 16.0,
      py::arg("lora_target_modules") = "all-linear", py::arg("lora_target_parameters") = py::none(),
      py::arg("lora_dropout") = 0.0,
      R"(Loads the HF checkpoint in `path` (a directory with config.json and safetensors) into the layout,
on every rank of the job megadsl.init() joined (a world of one process without it): each rank
reads only its own slices. critic=True builds the value model (value head from score.*, v_head.*,
...). dtype "bf16" computes in bf16 over fp32 parameters (mixed precision); device "cuda" uses
GPU LOCAL_RANK and NCCL. The ranks check that they build the same model and, before each forward
and training step, that they were given the same batch (shapes always; values too unless
batch_checksum=False); ranks that disagree all raise at once, naming what differs and where.
A mixture of experts adds Megatron's auxiliary losses in training when moe_aux_loss_coeff (the
load-balancing loss, per sequence with moe_aux_loss_per_sequence) or moe_z_loss_coeff is above 0;
Trainer.step reports their sum as metrics["moe_aux_loss"]. A router with an expert bias (DeepSeek-V3,
GLM-4.5) has it balanced by load after each step by moe_expert_bias_update_rate (0: left as loaded).
Dropout applies in training steps only (Trainer.step, forward_backward), at config.json's rates
(read_hf_config(path)["dropout"]; Seed-OSS's class defaults are 0.1); dropout=False trains without,
dropout={"attention_dropout": 0.0, ...} sets some of the family's dropout keys (as verl's
model.override_config does); save_hf writes the rates the model trains with. The masks are the
same in every layout. invariant=True (or Layout(invariant=True)): invariant arithmetic, a
sequence's log-probs, entropy, values and routing the same bits whatever its batch, padding,
micro-batching and layout (CPU and CUDA; slower: see the README). offload_activations=True (with
recompute="full"; verl's enable_activation_offload): the input each layer keeps for its rerun waits
in pinned host memory, prefetched back one layer ahead on a side stream; the numbers are unchanged. head_chunk_tokens: the LM head computes its
logits, log-probs and entropy this many tokens at a time in training too (forward and backward),
so a micro-batch's (tokens x vocab / tp) logits are never whole; 0 (default): in chunks of 2^25
logits where they would pass 1 GiB; -1: whole in training (faster while they fit). lora_adapter: a
PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) applied in every
forward, each rank holding its shards of the adapters (any layout but invariant arithmetic);
adapters on a mixture's routers, DoRA and other LoraConfig options that change the numbers are
refused. lora_rank / lora_alpha / lora_target_modules (verl's lora keys): fresh adapters as PEFT
initialises them (A Kaiming-uniform, B zero), the same in every layout; lora_target_parameters
(PEFT's target_parameters, e.g. ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]) adapts a
mixture's experts as PEFT does transformers' fused experts, each expert's adapter with its expert
under tp and ep (lora_target_modules=None: the experts alone). lora_dropout (PEFT's, on each
adapter's input in training steps only) draws its masks from the tokens, so the same in every
layout. With an
adapter the base is frozen and Model.trainer trains the adapters; save_lora writes them in PEFT's
format.)");

  model.def(
      "forward",
      [](dynamic_model& self, const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask,
         const py::object& temperature_arg, bool entropy, bool logits, bool record_routing,
         const std::optional<at::Tensor>& routed_experts, std::optional<std::int64_t> micro_batch_size) {
        // A number, or a (b,) tensor of per-row temperatures.
        double temperature = 1.0;
        at::Tensor row_temperatures;
        if (py::isinstance<py::float_>(temperature_arg) || py::isinstance<py::int_>(temperature_arg)) {
          temperature = temperature_arg.cast<double>();
        } else {
          try {
            row_temperatures = temperature_arg.cast<at::Tensor>();
          } catch (const py::cast_error&) {
            throw py::type_error("megadsl: temperature is a number or a (batch,) tensor of per-row temperatures");
          }
        }
        if (!(temperature > 0)) throw py::value_error("megadsl: temperature must be positive");
        if (logits && !self.config().head.actor) throw py::value_error("megadsl: logits=True goes with the actor; a critic has values");
        if (micro_batch_size && *micro_batch_size < 1) throw py::value_error("megadsl: micro_batch_size must be positive");
        batch b = batch_of(self, input_ids, attention_mask);
        if (routed_experts) b.routed_experts = routing_of(*routed_experts, b.input_ids, self.config().options.device);
        if (row_temperatures.defined()) b.temperature = row_temperatures;
        const forward_options fo{.temperature = temperature, .entropy = entropy, .return_logits = logits,
                                 .record_routing = record_routing};
        model_output out;
        {
          py::gil_scoped_release release;
          // Micro-batched inference: rows a chunk at a time (the outputs concatenated), so the
          // activations held are those of one chunk; at pp > 1 the chunks are pipelined over the
          // stages.
          const std::int64_t rows = b.input_ids.size(0), chunk = micro_batch_size.value_or(rows);
          if (chunk >= rows) {
            out = self.forward(b, fo);
          } else {
            std::vector<batch> micro;
            for (std::int64_t at = 0; at < rows; at += chunk) {
              const std::int64_t n = std::min(chunk, rows - at);
              batch part{.input_ids = b.input_ids.narrow(0, at, n), .attention_mask = b.attention_mask.narrow(0, at, n)};
              if (b.routed_experts.defined()) part.routed_experts = b.routed_experts.narrow(0, at, n);
              if (b.temperature.defined()) part.temperature = b.temperature.narrow(0, at, n);
              micro.push_back(std::move(part));
            }
            const std::vector<model_output> parts = self.forward(micro, fo);
            auto cat = [&](at::Tensor model_output::*field) {
              std::vector<at::Tensor> ts;
              for (const model_output& p : parts)
                if ((p.*field).defined()) ts.push_back(p.*field);
              return ts.empty() ? at::Tensor() : at::cat(ts, 0);
            };
            for (at::Tensor model_output::*field : {&model_output::log_probs, &model_output::entropy, &model_output::logits,
                                                    &model_output::values, &model_output::valid,
                                                    &model_output::routed_experts})
              out.*field = cat(field);
          }
        }
        py::dict d;
        if (record_routing && out.routed_experts.defined()) d["routed_experts"] = out.routed_experts;
        if (self.config().head.actor) {
          d["log_probs"] = out.log_probs;
          if (entropy && out.entropy.defined()) d["entropy"] = out.entropy;
          if (logits && out.logits.defined()) d["logits"] = out.logits;
        } else {
          d["values"] = out.values;
        }
        d["valid"] = out.valid.scalar_type() == at::kBool ? out.valid : out.valid.to(at::kBool);
        return d;
      },
      py::arg("input_ids"), py::arg("attention_mask") = py::none(), py::kw_only(), py::arg("temperature") = 1.0,
      py::arg("entropy") = true, py::arg("logits") = false, py::arg("record_routing") = false,
      py::arg("routed_experts") = py::none(), py::arg("micro_batch_size") = py::none(),
      R"(The whole batch's outputs on every rank, as a dict of tensors: actor log_probs (b, s) (log p of
the next token), entropy (b, s), logits (b, s, vocab) on request; critic values (b, s); valid (b, s)
bool. temperature: a number, or a (b,) tensor of each row's temperature. A mixture of experts:
record_routing=True adds routed_experts (b, s, layers, top_k), which a
later forward or Trainer.step replays (routed_experts=..., or the batch field): router replay.
micro_batch_size runs the rows that many at a time (less activation memory, the same outputs;
at pp > 1 the micro-batches are pipelined over the stages).
Collective: every rank of the job calls it with the same batch. With pp = 1 the outputs carry the
autograd graph when torch's grad mode is on (use torch.no_grad() for inference).)");

  model.def(
      "parameters",
      [](dynamic_model& self) {
        py::dict d;
        for (const named_parameter& p : self.parameters()) d[py::str(p.name)] = p.tensor;
        return d;
      },
      "This rank's parameter shards by megadsl name (layers.3.qkv.weight, ...): the live tensors, not copies.");
  model.def(
      "lora_parameters",
      [](dynamic_model& self) {
        if (self.closed() || self.lora() == nullptr)
          throw py::value_error("megadsl: lora_parameters: this model carries no LoRA adapter");
        py::dict d;
        for (const named_parameter& p : self.trainable_parameters()) d[py::str(p.name)] = p.tensor;
        return d;
      },
      "This rank's LoRA adapter shards, what its trainer updates (the live tensors): \"<HF module>.lora_A.weight\" "
      "for a matrix whole here, \"<HF module>.lora_B.weight@<first row>\" for a piece of one (B's rows of a "
      "column-parallel base, A's columns \"...lora_A.weight@<first column>\" of a row-parallel one).");
  model.def(
      "save_hf",
      [](dynamic_model& self, const std::filesystem::path& path, const std::string& dtype, std::optional<bool> merge_lora) {
        const at::ScalarType t = dtype_of(dtype, "dtype");
        if (!merge_lora && !self.closed() && self.lora() != nullptr)
          throw py::value_error("megadsl: save_hf: this model carries a LoRA adapter; pass merge_lora=True to write the "
                                "merged weights (W + scaling * B A) or merge_lora=False to write the base alone");
        py::gil_scoped_release release;
        self.save_hf(path, t, merge_lora.value_or(false));
      },
      py::arg("path"), py::arg("dtype") = "fp32", py::arg("merge_lora") = py::none(),
      "Collective: writes an HF checkpoint (HF names, true vocab, config.json) to `path`. A model loaded "
      "with a LoRA adapter needs merge_lora: True writes its bases with the adapters merged (PEFT's "
      "merge_and_unload, in fp32 before the cast to dtype), False the base alone.");
  model.def(
      "save_lora",
      [](dynamic_model& self, const std::filesystem::path& path) {
        py::gil_scoped_release release;
        self.save_lora(path);
      },
      py::arg("path"),
      "Collective: writes the model's LoRA adapters (trained or as loaded) in PEFT's format to `path` "
      "(adapter_config.json, adapter_model.safetensors; one file whatever the layout), which PEFT's "
      "PeftModel.from_pretrained and from_hf(lora_adapter=) load. Atomic: `path` holds the old adapter "
      "or the new one.");
  model.def(
      "export_lora",
      [](dynamic_model& self) {
        std::vector<std::pair<std::string, at::Tensor>> out;
        {
          py::gil_scoped_release release;
          out = self.export_lora();
        }
        return out;
      },
      "Collective: the LoRA adapters alone, whole, as (PEFT name, fp32 tensor) pairs on every rank "
      "(\"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\", ...: the state dict PEFT's "
      "get_peft_model_state_dict gives, which vLLM's LoRA loader takes with lora_config).");
  model.def_property(
      "lora_enabled",
      [](dynamic_model& self) { return !self.closed() && self.lora() != nullptr && self.lora()->enabled(); },
      [](dynamic_model& self, bool on) {
        if (self.closed() || self.lora() == nullptr)
          throw py::value_error("megadsl: lora_enabled: this model carries no LoRA adapter");
        const_cast<lora_set*>(self.lora())->set_enabled(on);
      },
      "Whether the forwards apply the LoRA adapters (False: the base alone, as PEFT's disable_adapter; "
      "verl's reference log-probs from the actor). Set it alike on every rank.");
  model.def_property_readonly(
      "lora_config",
      [](dynamic_model& self) -> py::object {
        if (self.closed() || self.lora() == nullptr) return py::none();
        return py::module_::import("json").attr("loads")(peft_config_json(self.lora()->settings()));
      },
      "The adapters' adapter_config.json as a dict (PEFT's LoraConfig keys: r, lora_alpha, target_modules, "
      "use_rslora, ...), or None without adapters.");
  model.def(
      "save_distributed",
      [](dynamic_model& self, const std::filesystem::path& path, py_trainer* t) {
        if (t != nullptr && t->model.get() != &self)
          throw py::value_error("megadsl: save_distributed: the trainer belongs to another model");
        py::gil_scoped_release release;
        self.save_distributed(path, t != nullptr ? t->t.get() : nullptr);
      },
      py::arg("path"), py::arg("trainer") = py::none(),
      "Collective: a layout-independent distributed checkpoint (with the trainer's AdamW state when given).");
  model.def(
      "load_distributed",
      [](dynamic_model& self, const std::filesystem::path& path, py_trainer* t) {
        if (t != nullptr && t->model.get() != &self)
          throw py::value_error("megadsl: load_distributed: the trainer belongs to another model");
        py::gil_scoped_release release;
        self.load_distributed(path, t != nullptr ? t->t.get() : nullptr);
      },
      py::arg("path"), py::arg("trainer") = py::none(),
      "Collective: loads a distributed checkpoint saved under any layout (resharded to this one).");
  model.def(
      "finalize_grads",
      [](dynamic_model& self) {
        py::gil_scoped_release release;
        self.finalize_grads();
      },
      "After a backward of your own: sums SP-partial, kv-replica, tied-embedding and dp gradients.");
  model.def(
      "grad_norm",
      [](dynamic_model& self) {
        py::gil_scoped_release release;
        return self.grad_norm();
      },
      "Global gradient 2-norm over tp and pp (each element once).");
  model.def(
      "trainer",
      [](const std::shared_ptr<dynamic_model>& self, const py::kwargs& kwargs) {
        const loss_options o = loss_options_of(kwargs, "Model.trainer", true);
        auto t = std::make_unique<py_trainer>();
        t->model = self;
        t->t = self->make_trainer(o.opt, o.actor, o.critic);
        return t;
      },
      R"(A trainer of this model with verl's losses: AdamW (lr=1e-5, clip_grad=1.0, weight_decay=0.01,
weight_decay_on="matrices" (Megatron's rule: no decay on biases and norms) or "all" (torch's AdamW over
every parameter, as verl's FSDP engine), beta1, beta2, eps; use_distributed_optimizer=True: Megatron's distributed optimizer, the moments sharded
over dp, the same numbers as the replicated one) and, for the actor, verl's policy loss (policy_loss="vanilla" | "gspo" | "gpg" |
"clip_cov" | "kl_cov"; clip_ratio=0.2, clip_ratio_low, clip_ratio_high, clip_ratio_c=3.0 (dual-clip),
loss_agg_mode="token-mean" | "token-sum" | "seq-mean-token-sum" | "seq-mean-token-mean" |
"seq-mean-token-sum-norm" (with loss_scale_factor), entropy_coeff, kl_coeff with kl="k3" (verl's
kl_loss_type: k1/kl, abs, k2/mse, k3/low_var_kl, + for straight-through), clip_cov_ratio,
clip_cov_lb, clip_cov_ub, kl_cov_ratio, ppo_kl_coef, temperature); for the critic, the clipped value
loss (value_clip=0.5, loss_agg_mode). An unknown keyword is a TypeError naming it.)");

  // The stream of export_weights (a generator over it is defined in megadsl/__init__.py).
  struct py_weight_stream {
    std::shared_ptr<dynamic_model> model;  // kept open while the stream lives
    weight_stream s;
  };
  py::class_<py_weight_stream>(m, "_WeightStream")
      .def("next_bucket",
           [](py_weight_stream& self) {
             if (self.model->closed())
               throw std::runtime_error("megadsl: export_weights: the Model was closed while its weights were streamed");
             hf_tensor_list bucket;
             {
               py::gil_scoped_release release;
               bucket = self.s.next();
             }
             py::list out;
             for (auto& [name, t] : bucket) out.append(py::make_tuple(name, t));
             return out;
           })
      .def_property_readonly("bytes_sent", [](const py_weight_stream& self) { return self.s.bytes_sent(); });
  model.def(
      "_weight_stream",
      [](const std::shared_ptr<dynamic_model>& self, const std::string& dtype, double bucket_mb, std::int64_t shard_tp,
         std::int64_t shard_rank, std::optional<bool> merge_lora) {
        if (self->closed()) throw std::runtime_error("megadsl: export_weights: this Model is closed");
        if (!merge_lora && self->lora() != nullptr)
          throw py::value_error("megadsl: export_weights: this model carries a LoRA adapter; pass merge_lora=True to send "
                                "the merged weights (W + scaling * B A) or merge_lora=False to send the base alone");
        if (merge_lora.value_or(false) && self->lora() == nullptr)
          throw py::value_error("megadsl: export_weights(merge_lora=True): this model carries no LoRA adapter");
        if (!(bucket_mb > 0) || !std::isfinite(bucket_mb))
          throw py::value_error("megadsl: export_weights: bucket_mb is the size of a bucket in MB, a finite number above "
                                "0, got " + std::string(py::str(py::float_(bucket_mb))));
        bucket_mb = std::min(bucket_mb, 1e12);  // a million TB: one bucket, within the byte count's range
        const export_options o{.dtype = dtype_of(dtype, "dtype"),
                               .bucket_bytes = static_cast<std::int64_t>(bucket_mb * (1 << 20)),
                               .shard_tp = shard_tp,
                               .shard_rank = shard_rank,
                               .names = self->hf_names(),
                               .merge = merge_lora.value_or(false) ? self->lora() : nullptr};
        return std::make_unique<py_weight_stream>(
            py_weight_stream{self, weight_stream(self->parameters(), self->config(), self->groups(), o)});
      },
      py::arg("dtype"), py::arg("bucket_mb"), py::arg("shard_tp"), py::arg("shard_rank"), py::arg("merge_lora") = py::none());

  model.def_property_readonly("layout", [](const dynamic_model& self) { return self.config().l; });
  model.def_property_readonly("critic", [](const dynamic_model& self) { return !self.config().head.actor; });
  model.def_property_readonly("vocab", [](const dynamic_model& self) { return vocab_of(self); });
  model.def_property_readonly("model_type", &dynamic_model::model_type);
  model.def_property_readonly(
      "dropout",
      [](const dynamic_model& self) { return dict_of(self.config().options.dropout); },
      "The dropout rates training steps apply: attention, residual, embedding (0: none).");
  model.def_property_readonly("path", [](const dynamic_model& self) { return self.source().string(); });
  model.def_property_readonly("rank", &dynamic_model::rank);
  model.def_property_readonly("world_size", &dynamic_model::world_size);
  model.def_property_readonly("tp_rank", [](const dynamic_model& self) { return self.coords().tp; });
  model.def_property_readonly("pp_rank", [](const dynamic_model& self) { return self.coords().pp; });
  model.def_property_readonly("dp_rank", [](const dynamic_model& self) { return self.coords().dp; });
  model.def_property_readonly("cp_rank", [](const dynamic_model& self) { return self.coords().cp; });
  model.def_property_readonly("dp_size", &dynamic_model::dp_size);
  model.def(
      "close",
      [](dynamic_model& self) {
        py::gil_scoped_release release;
        self.close();
      },
      R"(Frees this rank's shards and process groups now (every rank should close its model); the
model cannot be used afterwards. megadsl.shutdown() and exit close every model.)");
  model.def_property_readonly("closed", &dynamic_model::closed);
  model.def(
      "offload",
      [](dynamic_model& self, bool parameters, bool gradients) {
        if (self.closed()) throw std::runtime_error("megadsl: Model.offload: the model is closed");
        py::gil_scoped_release release;
        self.offload(parameters, gradients);
      },
      py::kw_only(), py::arg("parameters") = true, py::arg("gradients") = true,
      R"(Moves this rank's parameters and/or gradients to host memory (pinned, asynchronously on CUDA)
and frees their device storage, so that a colocated rollout engine gets the memory (verl's
param_offload, grad_offload); Model.reload() brings the same tensors back. forward and Trainer.step
raise while offloaded.)");
  model.def(
      "reload",
      [](dynamic_model& self) {
        if (self.closed()) throw std::runtime_error("megadsl: Model.reload: the model is closed");
        py::gil_scoped_release release;
        self.reload();
      },
      "Brings back what Model.offload moved to host memory (a no-op when nothing is offloaded).");
  model.def(
      "device_bytes",
      [](dynamic_model& self) {
        py::dict d;
        d["parameters"] = self.parameter_bytes();
        d["gradients"] = self.gradient_bytes();
        return d;
      },
      "Bytes of device storage this rank's parameters and gradients hold now (0 while offloaded).");
  model.def_property_readonly("device", [](const dynamic_model& self) { return self.config().options.device.str(); });
  model.def_property_readonly("offload_activations",
                              [](const dynamic_model& self) { return self.config().options.offload_activations; },
                              "whether the layers' kept inputs wait in host memory (from_hf(offload_activations=True))");
  m.def("activation_offload_bytes", &activation_offload_bytes,
        "bytes that activation offload has put in host memory in this process so far");
  model.def_property_readonly("load_notes", [](const dynamic_model& self) { return self.load_report().notes; },
                              "What loading the checkpoint reported (e.g. a value head that was initialised).");
  model.def("__repr__", &repr_of);

  py::class_<py_trainer>(m, "Trainer", "The PPO training step of a Model (Model.trainer(...)).")
      .def(
          "step",
          [](py_trainer& self, const py::dict& batch, std::int64_t microbatches, std::optional<std::int64_t> max_token_len,
             const py::object& loss_fn, bool dp_local, std::optional<std::int64_t> min_microbatches) {
            if (self.model->closed())
              throw std::runtime_error("megadsl: this Trainer's Model is closed (Model.close(), megadsl.shutdown() or exit)");
            const bool custom = !loss_fn.is_none();
            if (custom && !PyCallable_Check(loss_fn.ptr()))
              throw py::type_error("megadsl: Trainer.step: loss_fn must be callable (outputs, micro_batch, counts)");
            const rollout_batch r = rollout_of(*self.model, batch, custom);
            if (microbatches < 1) throw py::value_error("megadsl: microbatches must be positive");
            step_options so;
            so.dp_local = dp_local;
            if (custom) so.loss = python_loss(loss_fn);
            step_metrics out;
            {
              py::gil_scoped_release release;
              if (max_token_len) {
                micro_batch_options o;
                o.max_token_len = *max_token_len;
                if (min_microbatches && *min_microbatches < 1)
                  throw std::invalid_argument("megadsl: Trainer.step: min_microbatches must be positive");
                o.min_num_micro_batch = min_microbatches.value_or(self.model->config().l.pp.get());
                o.divisible_by = self.model->config().l.vpp.get() > 1 ? self.model->config().l.pp.get() : 1;
                out = self.t->step(r, o, so);
              } else {
                out = self.t->step(r, microbatches, so);
              }
            }
            return metrics_of(out);
          },
          py::arg("batch"), py::arg("microbatches") = 1, py::kw_only(), py::arg("max_token_len") = py::none(),
          py::arg("loss_fn") = py::none(), py::arg("dp_local") = false, py::arg("min_microbatches") = py::none(),
          R"(One optimizer step on the global batch (the same tensors on every rank; each dp rank trains on
its rows), split into `microbatches` per dp rank, or with max_token_len into micro-batches of at
most that many real tokens (verl's dynamic batching; at least min_microbatches of them, by default the
pipeline's stages, 1 as verl's engines ask). Batch fields: input_ids, attention_mask,
loss_mask, and old_log_probs, advantages (ref_log_probs with kl_coeff > 0) for the actor, or
old_values, returns for the critic. With loss_fn(outputs, micro_batch, counts) -> loss or (loss,
metrics), your loss runs per micro-batch on the last pipeline stage in place of the configured one
(any layout): outputs holds log_probs, entropy (actor) or values (critic) and valid; micro_batch
every field of the batch (any extra tensor field too) for that micro-batch's rows; counts the
global batch's batch_num_tokens and global_batch_size (loss tokens, and rows with any), which your
loss divides by so that it adds up over micro-batches and dp ranks; its metrics are averaged.
dp_local=True: each dp rank passes its own rows (verl dispatches each its share) instead of every
rank the global batch; the global counts are summed over the dp ranks.
Returns loss, grad_norm, lr, tokens, seconds, tokens_per_second,
moe_aux_loss, and skipped: True when the gradient norm or the loss was NaN or infinite, in which
case the update was not applied (Megatron's rule; Trainer.skipped counts them).)")
      .def(
          "offload",
          [](py_trainer& self) {
            py::gil_scoped_release release;
            self.t->offload_optimizer();
          },
          "Moves AdamW's moments to host memory (verl's optimizer_offload); Trainer.reload() brings them back.")
      .def(
          "reload",
          [](py_trainer& self) {
            py::gil_scoped_release release;
            self.t->reload_optimizer();
          },
          "Brings back the optimizer state Trainer.offload() moved (a no-op when nothing is offloaded).")
      .def_property_readonly("optimizer_bytes", [](const py_trainer& self) { return self.t->optimizer_bytes(); },
                             "Bytes of optimizer state on the device on this rank (0 while offloaded).")
      .def_property(
          "lr", [](const py_trainer& self) { return self.t->lr(); },
          [](py_trainer& self, double lr) {
            try {
              self.t->set_lr(lr);
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          },
          "The learning rate the next step uses; setting it replaces the schedule from then on (an engine "
          "that runs its own scheduler, as verl's do, sets it before each step).")
      .def_property(
          "weight_decay", [](const py_trainer& self) { return self.t->weight_decay(); },
          [](py_trainer& self, double wd) {
            try {
              self.t->set_weight_decay(wd);
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          },
          "The weight decay the next step applies (to the parameters weight_decay_on names); setting it "
          "replaces the schedule's from then on.")
      .def_property_readonly("steps", [](const py_trainer& self) { return self.t->steps_done(); })
      .def_property_readonly("samples", [](const py_trainer& self) { return self.t->samples_done(); })
      .def_property_readonly("skipped", [](const py_trainer& self) { return self.t->steps_skipped(); })
      .def_property_readonly("model", [](const py_trainer& self) { return self.model; });
}

}  // namespace megadsl::python
