// PEFT's adapter directory into this rank's adapters (runtime/lora_io.hpp).
#include "megadsl/runtime/lora_io.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "../spec/json_bounded.hpp"
#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/io/hf_name_map.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/io/atomic_file.hpp"
#include "megadsl/runtime/shard_io.hpp"
#include "checkpoint_dir.hpp"
#include "name_seed.hpp"

namespace megadsl {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view config_name = "adapter_config.json";
constexpr std::string_view weights_name = "adapter_model.safetensors";
constexpr std::string_view prefix = "base_model.model.";

// Keys of LoraConfig that change the numbers and are not built here, with the value that means
// "not used" (null, false, an empty list or object, or the string given).
bool unused(const json& v, std::string_view none = {}) {
  if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return true;
  if ((v.is_array() || v.is_object()) && v.empty()) return true;
  return v.is_string() && !none.empty() && v.get<std::string>() == none;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// An adapter's name in one layer: its HF module ("model.layers.{layer}.self_attn.q_proj"), a
// mixture's experts their fused parameter ("model.layers.{layer}.mlp.experts.gate_up_proj").
std::string lora_key(const lora_adapter& a) {
  return a.parameter.empty() ? std::string(a.module) : std::string(a.module) + "." + std::string(a.parameter);
}

// Every module `list` adapts, in every layer, by that name (sorted: the same order on every rank).
std::map<std::string, const lora_adapter*> modules_of(const lora_adapter_list& list, const shape& s) {
  std::map<std::string, const lora_adapter*> out;
  for (const lora_adapter& a : list)
    for (std::int64_t layer = 0; layer < s.layers.get(); ++layer)
      if (in_layer(*a.row, s, layer)) out[with_layer(lora_key(a), layer)] = &a;
  return out;
}

// A module's key stem in PEFT's files: "base_model.model.<its stored name>" (a multimodal
// checkpoint's text model under its prefix), before ".lora_A.weight".
std::string peft_stem(const std::string& module, const lora_adapter& a, const hf_name_map& names) {
  if (a.experts == 0) {
    const std::string stored = names.stored(module + ".weight");
    return std::string(prefix) + stored.substr(0, stored.size() - 7);
  }
  // A mixture's experts: the experts module where the checkpoint stores expert 0's tensor, then one
  // ".base_layer" per ParamWrapper of a later parameter around this one (PEFT's nesting).
  const std::string_view hf = a.row->hf[0];
  const std::string tail = ".0." + std::string(hf.substr(hf.find(".{expert}.") + 10));  // ".0.gate_proj.weight"
  const std::string parent = module.substr(0, module.size() - a.parameter.size() - 1);
  const std::string stored = names.stored(parent + tail);
  std::string stem = std::string(prefix) + stored.substr(0, stored.size() - tail.size());
  for (int i = 0; i < a.nesting; ++i) stem += ".base_layer";
  return stem;
}

}  // namespace

lora read_peft_config(const fs::path& dir) {
  const fs::path file = dir / config_name;
  const auto fail = [&](const std::string& problem) -> void {
    throw checkpoint_error("megadsl: " + file.string() + ": " + problem);
  };
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    fail("no such file; a LoRA adapter is a directory PEFT's save_pretrained wrote (adapter_config.json, adapter_model.safetensors)");
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json j = parse_json_bounded(text, 1 << 20, fail);
  if (!j.is_object()) fail("is not a JSON object");
  if (j.value("peft_type", std::string("LORA")) != "LORA")
    fail("peft_type is \"" + j.value("peft_type", std::string()) + "\"; megadsl reads LoRA adapters (peft_type \"LORA\")");
  const struct {
    const char* key;
    std::string_view none;
    const char* what;
  } refused[] = {{"use_dora", {}, "DoRA"},
                 {"bias", "none", "trained biases"},
                 {"lora_bias", {}, "a bias on lora_B"},
                 {"fan_in_fan_out", {}, "transposed (Conv1D) bases"},
                 {"rank_pattern", {}, "per-module ranks"},
                 {"alpha_pattern", {}, "per-module alphas"},
                 {"layers_to_transform", {}, "a subset of the layers"},
                 {"layers_pattern", {}, "a subset of the layers"},
                 {"modules_to_save", {}, "fully trained extra modules"},
                 {"exclude_modules", {}, "excluded modules"},
                 {"layer_replication", {}, "layer replication"},
                 {"use_qalora", {}, "QA-LoRA"},
                 {"trainable_token_indices", {}, "trainable tokens"}};
  for (const auto& r : refused)
    if (const auto it = j.find(r.key); it != j.end() && !unused(*it, r.none))
      fail(std::string(r.key) + " = " + it->dump() + ": " + r.what + " are not supported; save the adapter without it");
  if (const auto it = j.find("alora_invocation_tokens"); it != j.end() && !unused(*it))
    fail("alora_invocation_tokens = " + it->dump() + ": activated LoRA (applied after those tokens only) is not supported");
  // An initialisation that rewrites the base weights: the adapter fits that rewritten base only,
  // unless PEFT converted it to a plain LoRA on save (path_initial_model_for_weight_conversion).
  if (const auto it = j.find("init_lora_weights"); it != j.end() && it->is_string()) {
    const std::string init = it->get<std::string>();
    if (init.starts_with("pissa") || init == "olora" || init.starts_with("corda") || init == "loftq")
      fail("init_lora_weights = \"" + init + "\" rewrites the base weights, which megadsl loads as they are; save the "
           "adapter converted to a plain LoRA (PEFT's path_initial_model_for_weight_conversion) or merge it into its base");
  }
  lora out;
  std::int64_t rank = 0;
  std::string why;
  if (!j.contains("r") || !json_as_integer(j.at("r"), rank, why)) fail("\"r\" (the LoRA rank) " + (why.empty() ? "is missing" : why));
  out.rank = rank;
  const auto number = [&](const char* key, double fallback) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail(std::string(key) + " is " + it->type_name() + ", not a number");
    return it->get<double>();
  };
  out.alpha = number("lora_alpha", 8.0);  // LoraConfig's default
  out.dropout = number("lora_dropout", 0.0);
  if (const auto it = j.find("use_rslora"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) fail("use_rslora is " + std::string(it->type_name()) + ", not true or false");
    out.rslora = it->get<bool>();
  }
  // target_parameters: a mixture's experts (PEFT's ParamWrapper), by "<module>.<parameter>".
  const auto parameters = j.find("target_parameters");
  const bool has_parameters = parameters != j.end() && !unused(*parameters);
  if (has_parameters) {
    if (!parameters->is_array()) fail("target_parameters is " + std::string(parameters->type_name()) + ", not a list of parameter names");
    for (const json& t : *parameters) {
      if (!t.is_string() || t.get<std::string>().empty() || t.get<std::string>().size() >= max_lora_target_name)
        fail("target_parameters holds " + t.dump() + ", not a parameter name (\"mlp.experts.gate_up_proj\")");
      if (out.parameter_count == max_lora_parameters)
        fail("target_parameters names more than " + std::to_string(max_lora_parameters) + " parameters");
      out.target_parameter(t.get<std::string>());
    }
  }
  const auto targets = j.find("target_modules");
  const auto add = [&](const std::string& t) {
    if (t.empty() || t.size() >= max_lora_target_name) fail("target_modules names \"" + t + "\": empty or too long");
    if (out.target_count == max_lora_targets) fail("target_modules names more than " + std::to_string(max_lora_targets) + " modules");
    out.target(t);
  };
  if ((targets == j.end() || targets->is_null() || (targets->is_array() && targets->empty())) && has_parameters) {
    // target_parameters alone
  } else if (targets == j.end() || targets->is_null()) {
    fail("target_modules is not given (PEFT fills it in from the model type); save the adapter with it");
  } else if (targets->is_string()) {
    if (targets->get<std::string>() != all_linear)
      fail("target_modules is the regular expression \"" + targets->get<std::string>() +
           "\"; only a list of module names or \"all-linear\" is supported");
    add(std::string(all_linear));
  } else if (targets->is_array()) {
    for (const json& t : *targets) {
      if (!t.is_string()) fail("target_modules holds " + t.dump() + ", not a module name");
      add(t.get<std::string>());
    }
  } else {
    fail("target_modules is " + std::string(targets->type_name()) + ", not a list of module names");
  }
  return out;
}

std::shared_ptr<lora_set> load_peft_adapter(const fs::path& dir, const runtime_config& c, std::int64_t tp_rank,
                                            const std::vector<named_parameter>& params, const hf_name_map& names) {
  const lora settings = read_peft_config(dir);
  const fs::path file = dir / weights_name;
  const auto fail = [&](const std::string& problem) -> void {
    throw checkpoint_error("megadsl: " + file.string() + ": " + problem);
  };
  const shape& s = c.s;
  if (const violations v = lora_rules(s, settings, c.head); !v.ok())
    throw checkpoint_error("megadsl: " + (dir / config_name).string() + ": " + std::string(v.joined().view()));
  if (c.l.invariant.get())
    throw std::invalid_argument("megadsl: LoRA adapters with invariant arithmetic (layout::invariant) are not supported yet; "
                                "load the adapter without invariant=True");
  const lora_adapter_list adapters = lora_adapters(s, c.l, settings, c.head);
  // Every adapter the model applies, in every layer, with its shape (each rank checks the whole
  // file alike, before any rank reads its own), and every module it could adapt.
  const std::map<std::string, const lora_adapter*> expected = modules_of(adapters, s);
  lora every = settings;
  every.target_count = 0;
  const lora_adapter_list linears = lora_adapters(s, c.l, every.target(all_linear), c.head);
  const std::map<std::string, const lora_adapter*> adaptable = modules_of(linears, s);
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) fail("no such file; PEFT's save_pretrained writes the adapter's weights there");
  const safetensors_file st = safetensors_file::open(file);
  std::map<std::string, std::string> key_of;  // the text model's module -> its key in the file (a multimodal model's under its prefix)
  std::map<std::string, std::string> experts_stem;  // a mixture's experts: the stem PEFT keys them by -> their name
  for (const auto& [module, a] : expected)
    if (a->experts > 0) experts_stem[peft_stem(module, *a, names)] = module;
  for (const tensor_info& t : st.tensors()) {
    const std::string_view name = t.name;
    const bool a = name.ends_with(".lora_A.weight"), b = name.ends_with(".lora_B.weight");
    if (!name.starts_with(prefix) || !(a || b))
      fail("holds \"" + t.name + "\", not a LoRA weight (base_model.model.<module>.lora_A.weight or .lora_B.weight)");
    const std::string stem(name.substr(0, name.size() - 14));
    if (const auto e = experts_stem.find(stem); e != experts_stem.end()) {
      key_of[e->second] = stem;
      continue;
    }
    const std::string stored = stem.substr(prefix.size());
    if (stored.ends_with(".experts") || stored.find(".experts.base_layer") != std::string::npos)
      fail("holds an adapter on " + stored + ", a mixture's experts' parameter that target_parameters in "
           "adapter_config.json does not name (or not in PEFT's nesting of them: one .base_layer per later parameter)");
    const std::optional<std::string> text = names.text_name(stored + ".weight");
    if (!text) fail("holds an adapter on " + stored + ", outside the text model megadsl runs (a vision tower's?)");
    const std::string module = text->substr(0, text->size() - 7);
    if (!expected.contains(module))
      fail("holds an adapter on " + stored + (adaptable.contains(module)
                                                  ? ", which target_modules in adapter_config.json does not name"
                                                  : ", which megadsl does not adapt in this model (a mixture's routers, "
                                                    "the embedding and the LM head take none)"));
    key_of[module] = stem;
  }
  const std::int64_t r = settings.rank.get();
  for (const auto& [module, a] : expected) {
    const auto it = key_of.find(module);
    if (it == key_of.end())
      fail("has no adapter on " + (a->experts > 0 ? peft_stem(module, *a, names).substr(prefix.size()) + " (" + module + ")"
                                                  : names.stored(module)) +
           (a->experts > 0 ? ", which target_parameters names" : ", which target_modules names"));
    const auto check = [&](const char* which, std::int64_t rows, std::int64_t cols, const char* what) {
      const tensor_info* t = st.find(it->second + which);
      if (t == nullptr) fail("has no " + it->second + which + " beside the other of its pair");
      if (t->shape != std::vector<std::int64_t>{rows, cols})
        fail(it->second + which + " has shape " + shape_text(t->shape) + "; this model's is [" + std::to_string(rows) + ", " +
             std::to_string(cols) + "] " + what);
    };
    const std::int64_t stacked = a->stacked_rank(r);
    check(".lora_A.weight", stacked, a->in, a->experts > 0 ? "(r x experts, the experts' inputs)" : "(r, the module's inputs)");
    check(".lora_B.weight", a->out, stacked, a->experts > 0 ? "(the experts' outputs, r x experts)" : "(the module's outputs, r)");
  }
  return shard_adapters(settings, c, tp_rank, params, [&](const std::string& module) {
    const std::string& key = key_of.at(module);
    return std::pair{st.read(key + ".lora_A.weight", at::kFloat), st.read(key + ".lora_B.weight", at::kFloat)};
  });
}

std::shared_ptr<lora_set> shard_adapters(const lora& settings, const runtime_config& c, std::int64_t tp_rank,
                                         const std::vector<named_parameter>& params, const whole_lora_source& whole) {
  const shape& s = c.s;
  const lora_adapter_list adapters = lora_adapters(s, c.l, settings, c.head);
  const std::int64_t tp = c.l.tp.get(), r = settings.rank.get();
  auto out = std::make_shared<lora_set>(settings);
  std::pair<std::string, std::pair<at::Tensor, at::Tensor>> stack;  // a mixture's experts: the layer's, read once
  for (const named_parameter& p : params) {
    if (p.plan == nullptr || p.plan->row == nullptr) continue;
    const placement where = p.plan->row->where;
    if (where != placement::layer && where != placement::expert) continue;
    for (const lora_adapter& a : adapters) {
      if (a.row->name != p.plan->row->name) continue;
      const std::string module = with_layer(lora_key(a), p.at.layer);
      at::Tensor A, B;  // this base's (r, in) and (out, r)
      if (a.experts > 0) {
        // Expert e's of PEFT's stacks: A's rows [e r, (e + 1) r), B's columns e, E + e, ...
        if (stack.first != module) stack = {module, whole(module)};  // (a layer's experts are consecutive parameters)
        const auto& [SA, SB] = stack.second;
        A = SA.narrow(0, p.at.expert * r, r);
        B = SB.view({a.out, r, a.experts}).select(2, p.at.expert);
      } else {
        std::tie(A, B) = whole(module);
      }
      lora_shard shard{.module = module, .along_output = true, .scaling = settings.scaling(), .dropout = settings.dropout.get(),
                       .base_split = p.plan->split_dim >= 0 && tp > 1, .out = a.out, .in = a.in};
      const std::vector<shard_piece> mains = shard_pieces(*p.plan, s, c.l, tp_rank, piece_set::main_replica);
      for (const shard_piece& piece : shard_pieces(*p.plan, s, c.l, tp_rank, piece_set::all)) {
        if (a.experts == 0 && !p.plan->row->concatenated && piece.slot != a.source) continue;
        // An expert's adapter spans its row's sources (gate_up_proj's [gate; up]): a piece's place
        // in it is after the sources before its own.
        std::int64_t global = piece.global_offset;
        if (a.experts > 0 && !p.plan->row->concatenated)
          for (int k = 0; k < piece.source; ++k) global += p.plan->geo.sources[static_cast<std::size_t>(k)].extent();
        shard.along_output = piece.dim == 0;
        const at::Tensor part = piece.dim == 0 ? B.narrow(0, global, piece.extent) : A.narrow(1, global, piece.extent);
        const geometry_source& src = p.plan->geo.sources[static_cast<std::size_t>(piece.source)];
        const bool replicated = src.replicated_when_fewer && src.units < tp;
        shard.pieces.push_back({.local_offset = piece.local_offset, .extent = piece.extent,
                                .global_offset = global, .replica_units = replicated ? src.units : 0,
                                .main = std::find(mains.begin(), mains.end(), piece) != mains.end(),
                                .part = part.clone(at::MemoryFormat::Contiguous).to(p.tensor.device())});
      }
      shard.whole = (shard.along_output ? A : B).clone(at::MemoryFormat::Contiguous).to(p.tensor.device());
      if (a.experts > 0) {
        shard.expert = p.at.expert, shard.experts = a.experts;
        std::int64_t offset = 0;  // the expert's HF tensors and their rows of B
        for (int k = 0; k < p.plan->row->hf_count; ++k) {
          const std::int64_t rows = a.split == 1 ? a.out : p.plan->geo.sources[static_cast<std::size_t>(k)].extent();
          shard.hf_parts.push_back({with_layer(p.plan->row->hf[static_cast<std::size_t>(k)], p.at.layer), offset, rows});
          offset += rows;
        }
      }
      out->add(p.tensor, p.at.layer, std::move(shard));
    }
  }
  return out;
}

std::shared_ptr<lora_set> new_adapters(const lora& settings, const runtime_config& c, std::int64_t tp_rank,
                                       const std::vector<named_parameter>& params, std::uint64_t seed) {
  if (const violations v = lora_rules(c.s, settings, c.head); !v.ok())
    throw std::invalid_argument("megadsl: LoRA: " + std::string(v.joined().view()));
  if (c.l.invariant.get())
    throw std::invalid_argument("megadsl: LoRA adapters with invariant arithmetic (layout::invariant) are not supported yet; "
                                "build the model without invariant=True");
  const std::int64_t r = settings.rank.get();
  const lora_adapter_list list = lora_adapters(c.s, c.l, settings, c.head);
  const std::map<std::string, const lora_adapter*> all = modules_of(list, c.s);  // pointers into `list`
  return shard_adapters(settings, c, tp_rank, params, [&](const std::string& module) {
    const lora_adapter& a = *all.at(module);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(detail::name_seed(module, seed));
    const double bound = 1.0 / std::sqrt(static_cast<double>(a.in));  // kaiming_uniform_(a = sqrt(5))
    const std::int64_t rows = a.stacked_rank(r);  // a mixture's experts: PEFT's stack, drawn whole
    return std::pair{at::empty({rows, a.in}, at::kFloat).uniform_(-bound, bound, gen), at::zeros({a.out, rows}, at::kFloat)};
  });
}

std::string peft_config_json(const lora& settings) {
  json targets = json::array();
  for (int i = 0; i < settings.target_count; ++i) {
    const std::string_view t = settings.targets[static_cast<std::size_t>(i)].view();
    if (t == all_linear) targets = std::string(all_linear);
    else if (targets.is_array()) targets.push_back(std::string(t));
  }
  json parameters = json::array();
  for (int i = 0; i < settings.parameter_count; ++i)
    parameters.push_back(std::string(settings.parameters[static_cast<std::size_t>(i)].view()));
  const json config = {{"peft_type", "LORA"},
                       {"task_type", "CAUSAL_LM"},
                       {"r", settings.rank.get()},
                       {"lora_alpha", settings.alpha.get()},
                       {"lora_dropout", settings.dropout.get()},
                       {"use_rslora", settings.rslora.get()},
                       {"target_modules", targets},
                       {"target_parameters", parameters.empty() ? json(nullptr) : parameters},
                       {"bias", "none"},
                       {"fan_in_fan_out", false},
                       {"inference_mode", true},
                       {"init_lora_weights", true},
                       {"base_model_name_or_path", nullptr},
                       {"revision", nullptr},
                       {"modules_to_save", nullptr}};
  return config.dump(2) + "\n";
}

std::vector<std::pair<std::string, at::Tensor>> gather_peft_adapter(const lora_set& set, const runtime_config& c,
                                                                   const parallel_groups& g, const hf_name_map& names) {
  const lora& settings = set.settings();
  const std::int64_t r = settings.rank.get();
  set.gather_whole(g.tp.get(), g.ep.get());  // every tp (and ep) rank's shards into whole A and B
  // Every stage's modules in one buffer (each module lives on one stage), summed over pp.
  const lora_adapter_list list = lora_adapters(c.s, c.l, settings, c.head);
  const std::map<std::string, const lora_adapter*> all = modules_of(list, c.s);  // pointers into `list`
  std::int64_t total = 0;
  for (const auto& [module, a] : all) total += a->stacked_rank(r) * (a->in + a->out);
  at::Tensor flat = at::zeros({total}, at::kFloat);
  std::int64_t at = 0;
  for (const auto& [module, a] : all) {
    const std::int64_t rows = a->stacked_rank(r);
    if (const auto [A, B] = set.whole(module); A.defined()) {
      flat.narrow(0, at, rows * a->in).copy_(A.reshape({-1}));
      flat.narrow(0, at + rows * a->in, a->out * rows).copy_(B.reshape({-1}));
    }
    at += rows * (a->in + a->out);
  }
  set.release_whole();
  if (g.pp->size() > 1) {
    at::Tensor on = flat.to(c.options.device);
    g.pp->all_reduce(on);
    flat = on.cpu();
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  at = 0;
  for (const auto& [module, a] : all) {
    const std::int64_t rows = a->stacked_rank(r);
    const std::string stem = peft_stem(module, *a, names);
    out.emplace_back(stem + ".lora_A.weight", flat.narrow(0, at, rows * a->in).view({rows, a->in}).clone());
    out.emplace_back(stem + ".lora_B.weight", flat.narrow(0, at + rows * a->in, a->out * rows).view({a->out, rows}).clone());
    at += rows * (a->in + a->out);
  }
  return out;
}

void save_peft_adapter(const fs::path& dir, const lora_set& set, const runtime_config& c, const parallel_groups& g,
                       const hf_name_map& names) {
  const std::vector<std::pair<std::string, at::Tensor>> tensors = gather_peft_adapter(set, c, g, names);
  const bool writer = g.world->rank() == 0;
  fs::path target = dir;
  if (!target.has_filename()) target = target.parent_path();
  const comm_group& world = *g.world;
  const fs::path staging = staging_name(world, target);
  const cleanup_on_signal staging_cleanup(staging, /*directory=*/true);
  std::optional<target_lock> lock;
  save_step(world, staging, [&] {
    if (!writer) return;
    lock.emplace(target);
    remove_stale_staging(target);
    std::error_code ec;
    if (fs::exists(target, ec) && !fs::is_directory(target, ec))
      throw checkpoint_error("megadsl: cannot save a LoRA adapter to " + target.string() + ": it exists and is not a directory");
    if (fs::exists(target, ec) && !fs::is_empty(target, ec) && !fs::exists(target / config_name, ec))
      throw checkpoint_error("megadsl: cannot save a LoRA adapter to " + target.string() + ": it holds files but no " +
                             std::string(config_name) + ", and saving would replace them; choose a new or empty directory");
    fs::create_directories(target.parent_path().empty() ? fs::path(".") : target.parent_path(), ec);
    if (!fs::create_directory(staging, ec) || ec)
      throw checkpoint_error("megadsl: cannot save a LoRA adapter to " + target.string() + ": cannot create " +
                             staging.string() + (ec ? ": " + ec.message() : ": it exists"));
    write_safetensors(staging / weights_name, tensors, {{"format", "pt"}});
    write_file_atomically(staging / config_name, peft_config_json(set.settings()));
    fsync_dir(staging);
    move_into_place(staging, target);
  });
}

std::function<void(const fs::path&)> lora_checkpoint_writer(const lora_set& set, const training_state* state,
                                                           const runtime_config& c, const parallel_groups& g,
                                                           const hf_name_map& names) {
  auto adapters = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>(gather_peft_adapter(set, c, g, names));
  auto moments = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>();
  if (state != nullptr && !state->exp_avg.empty()) {
    const char* kinds[] = {"exp_avg/", "exp_avg_sq/"};
    const std::vector<at::Tensor>* values[] = {&state->exp_avg, &state->exp_avg_sq};
    for (int k = 0; k < 2; ++k)
      for (auto& [name, t] : gather_peft_adapter(*set.with_tensors(*values[k]), c, g, names))
        moments->emplace_back(kinds[k] + name, std::move(t));
  }
  const std::string config = peft_config_json(set.settings());
  return [adapters, moments, config](const fs::path& staging) {
    const fs::path folder = staging / lora_checkpoint_folder;
    fs::create_directories(folder);
    write_safetensors(folder / weights_name, *adapters, {{"format", "pt"}});
    if (!moments->empty()) write_safetensors(folder / "optimizer.safetensors", *moments, {{"format", "pt"}});
    write_file_atomically(folder / config_name, config);
    fsync_dir(folder);
  };
}

void load_lora_checkpoint(const fs::path& dir, lora_set& set, const runtime_config& c, std::int64_t tp_rank,
                          const std::vector<named_parameter>& params, const hf_name_map& names, training_state* state) {
  const fs::path folder = dir / lora_checkpoint_folder;
  const lora saved = read_peft_config(folder);
  const lora& mine = set.settings();
  if (saved.rank.get() != mine.rank.get() || saved.alpha.get() != mine.alpha.get() || saved.rslora.get() != mine.rslora.get() ||
      saved.target_count != mine.target_count || saved.targets != mine.targets ||
      saved.parameter_count != mine.parameter_count || saved.parameters != mine.parameters)
    throw checkpoint_error("megadsl: " + (folder / config_name).string() + ": holds adapters of r = " +
                           std::to_string(saved.rank.get()) + ", lora_alpha = " + std::to_string(saved.alpha.get()) +
                           " on other target_modules, target_parameters or rank than this model's (r = " + std::to_string(mine.rank.get()) +
                           "); build the model with the checkpoint's LoRA settings");
  const std::vector<at::Tensor> into = set.tensors();
  const std::vector<at::Tensor> values = load_peft_adapter(folder, c, tp_rank, params, names)->tensors();
  if (values.size() != into.size())
    throw checkpoint_error("megadsl: " + folder.string() + ": its adapters do not match this model's");
  {
    const c10::NoGradGuard no_grad;
    for (std::size_t i = 0; i < into.size(); ++i) into[i].copy_(values[i]);
  }
  if (state == nullptr) return;
  // No moments saved (the trainer had not stepped): AdamW starts fresh, as without adapters.
  const fs::path file = folder / "optimizer.safetensors";
  state->exp_avg.clear();
  state->exp_avg_sq.clear();
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return;
  const safetensors_file st = safetensors_file::open(file);
  const lora_adapter_list list = lora_adapters(c.s, c.l, mine, c.head);
  const std::map<std::string, const lora_adapter*> all = modules_of(list, c.s);
  const std::int64_t r = mine.rank.get();
  const auto stem_of = [&](const char* kind, const std::string& module) { return kind + peft_stem(module, *all.at(module), names); };
  // Every module's moments checked on every rank alike before any rank reads its own (a rank
  // that failed alone would leave the others waiting).
  for (const char* kind : {"exp_avg/", "exp_avg_sq/"})
    for (const auto& [module, a] : all)
      for (const auto& [which, shape] : {std::pair{".lora_A.weight", std::vector<std::int64_t>{a->stacked_rank(r), a->in}},
                                         std::pair{".lora_B.weight", std::vector<std::int64_t>{a->out, a->stacked_rank(r)}}}) {
        const std::string name = stem_of(kind, module) + which;
        const tensor_info* t = st.find(name);
        if (t == nullptr || t->shape != shape)
          throw checkpoint_error("megadsl: " + file.string() + ": " + name +
                                 (t == nullptr ? " is missing" : " has shape " + shape_text(t->shape) + ", not " + shape_text(shape)));
      }
  for (const char* kind : {"exp_avg/", "exp_avg_sq/"}) {
    const auto moment = shard_adapters(mine, c, tp_rank, params, [&](const std::string& module) {
      const std::string stem = stem_of(kind, module);
      return std::pair{st.read(stem + ".lora_A.weight", at::kFloat), st.read(stem + ".lora_B.weight", at::kFloat)};
    });
    (std::string_view(kind) == "exp_avg/" ? state->exp_avg : state->exp_avg_sq) = moment->tensors();
  }
}

}  // namespace megadsl
