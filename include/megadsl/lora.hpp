// LoRA adapters (PEFT's LoraConfig; verl's actor_rollout_ref.model.lora) on a composition's linear
// rows, torch-free and constexpr: which HF modules they wrap, and each adapter's shards under tp,
// derived from its base row's geometry (DESIGN decision 21):
//
//   base split 0 (column-parallel): B (out, r) split with the base's output rows, A (r, in) whole
//   base split 1 (row-parallel):    A (r, in) split with the base's input columns, B (out, r) whole;
//                                   x_r A_r^T is a partial sum over tp, reduced with the base's own
//   base whole (split -1):          A and B whole on every rank
//
//   lora adapters{.rank = 32, .alpha = 64.0};
//   adapters.target("q_proj").target("v_proj");        // or .target("all-linear")
//   for (const lora_adapter& a : lora_adapters(shape, layout, adapters)) ...
//
// A target is an HF module name as PEFT's target_modules matches it: the module's full name, or its
// ending after a '.' ("q_proj", "self_attn.o_proj"); "all-linear" is every linear of the layers
// (PEFT's: every nn.Linear but the output layer). A fused row adapts each HF source it stores on
// its own (q_proj, k_proj and v_proj of megadsl's fused q/k/v), as PEFT does on the HF model.
//
// A mixture's experts take adapters as PEFT adapts transformers' fused experts, by
// target_parameters ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"; PEFT's ParamWrapper):
// one adapter per expert, stacked, A (r E, in) with expert e's rows [e r, (e + 1) r) and B (out, r E)
// with expert e's columns e, E + e, ... (B viewed (out, r, E)); gate_up_proj's outputs are
// [gate; up]. Each expert's adapter is sharded over tp as its expert is and lives on its ep rank.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "megadsl/architecture.hpp"
#include "megadsl/geometry.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/shard_plan.hpp"

namespace megadsl {

inline constexpr int max_lora_targets = 16;
inline constexpr int max_lora_parameters = 4;
inline constexpr std::size_t max_lora_target_name = 48;
inline constexpr std::string_view all_linear = "all-linear";

// A target's name, held by value so that a `lora` is a literal type (a template argument).
struct lora_target {
  std::array<char, max_lora_target_name> name{};  // NUL-padded
  [[nodiscard]] constexpr std::string_view view() const {
    std::size_t n = 0;
    while (n < name.size() && name[n] != '\0') ++n;
    return {name.data(), n};
  }
  constexpr bool operator==(const lora_target&) const = default;
};

struct lora {
  dim rank = 0;          // r; 0: no adapters
  real alpha = 16.0;     // lora_alpha
  flag rslora = false;   // use_rslora: the update scaled by alpha / sqrt(r), else alpha / r
  real dropout = 0.0;    // lora_dropout, on the adapter's input in training
  std::array<lora_target, max_lora_targets> targets{};
  int target_count = 0;
  std::array<lora_target, max_lora_parameters> parameters{};  // PEFT's target_parameters (a mixture's experts)
  int parameter_count = 0;

  // Adds a target module name (or "all-linear"); a name too long or one target too many is refused
  // where it is written (a constant expression fails to compile; at run time, lora_error).
  constexpr lora& target(std::string_view module) {
    if (module.empty() || module.size() >= max_lora_target_name)
      throw "megadsl: a LoRA target module name is empty or longer than max_lora_target_name (lora.hpp)";
    if (target_count == max_lora_targets) throw "megadsl: more LoRA target modules than max_lora_targets (lora.hpp)";
    lora_target t;
    for (std::size_t i = 0; i < module.size(); ++i) t.name[i] = module[i];
    targets[static_cast<std::size_t>(target_count++)] = t;
    return *this;
  }
  // Adds a target parameter (PEFT's target_parameters: "mlp.experts.gate_up_proj"), refused as target() is.
  constexpr lora& target_parameter(std::string_view parameter) {
    if (parameter.empty() || parameter.size() >= max_lora_target_name)
      throw "megadsl: a LoRA target parameter name is empty or longer than max_lora_target_name (lora.hpp)";
    if (parameter_count == max_lora_parameters) throw "megadsl: more LoRA target parameters than max_lora_parameters (lora.hpp)";
    lora_target t;
    for (std::size_t i = 0; i < parameter.size(); ++i) t.name[i] = parameter[i];
    parameters[static_cast<std::size_t>(parameter_count++)] = t;
    return *this;
  }
  [[nodiscard]] constexpr bool enabled() const { return !rank.is_static() || rank.get() != 0; }
  [[nodiscard]] constexpr bool all_linear_targeted() const {
    for (int i = 0; i < target_count; ++i)
      if (targets[static_cast<std::size_t>(i)].view() == all_linear) return true;
    return false;
  }
  // The factor of the low-rank update B A (PEFT's `scaling`).
  [[nodiscard]] constexpr double scaling() const {
    const double r = static_cast<double>(rank.get());
    return rslora.get() ? alpha.get() / sqrt_of(r) : alpha.get() / r;
  }
  constexpr bool operator==(const lora&) const = default;

 private:
  static constexpr double sqrt_of(double x) {  // (std::sqrt is not constexpr in C++20)
    if (x <= 0) return 0;
    double y = x > 1 ? x : 1;
    for (int i = 0; i < 64; ++i) y = 0.5 * (y + x / y);
    return y;
  }
};

// An HF weight name's module: "model.layers.{layer}.self_attn.q_proj.weight" -> "...self_attn.q_proj".
constexpr std::string_view lora_module_of(std::string_view hf_weight) {
  return hf_weight.ends_with(".weight") ? hf_weight.substr(0, hf_weight.size() - 7) : hf_weight;
}
// Whether `target` names `module` as PEFT matches a target_modules entry: the whole name, or its
// end after a '.'.
constexpr bool lora_target_matches(std::string_view module, std::string_view target) {
  if (target.empty() || !module.ends_with(target)) return false;
  return module.size() == target.size() || module[module.size() - target.size() - 1] == '.';
}

// Whether `target` names the parameter `parameter` of `module` as PEFT matches a
// target_parameters entry: "<module>.<parameter>" whole, or its end after a '.'.
constexpr bool lora_parameter_matches(std::string_view module, std::string_view parameter, std::string_view target) {
  if (target == parameter) return true;
  if (target.size() <= parameter.size() || !target.ends_with(parameter) || target[target.size() - parameter.size() - 1] != '.')
    return false;
  return lora_target_matches(module, target.substr(0, target.size() - parameter.size() - 1));
}

// A per-expert row's experts module and the parameter transformers fuses it into
// ("model.layers.{layer}.mlp.experts", "gate_up_proj" of ...experts.{expert}.gate_proj.weight and
// up_proj; "down_proj"); a stacked row's own split at its last '.'; empty for other rows.
struct experts_parameter {
  std::string_view module, parameter;
};
constexpr experts_parameter experts_parameter_of(const param_row& row) {
  if (row.where != placement::expert || is_bias(row)) return {};
  const std::string_view hf = row.hf[0];
  if (row.stacking != hf_stacking::none) {
    const std::size_t dot = hf.rfind('.');
    return dot == std::string_view::npos ? experts_parameter{} : experts_parameter{hf.substr(0, dot), hf.substr(dot + 1)};
  }
  const std::size_t at = hf.find(".{expert}.");
  if (at == std::string_view::npos) return {};
  if (row.name.ends_with("experts.{expert}.gate_up.weight")) return {hf.substr(0, at), "gate_up_proj"};
  if (row.name.ends_with("experts.{expert}.down.weight")) return {hf.substr(0, at), "down_proj"};
  return {};
}

// Why an expert row cannot carry PEFT's adapter on its fused parameter (empty: it can).
constexpr std::string_view lora_experts_unsupported(const param_row& row) {
  if (row.stacking != hf_stacking::none)
    return "stacked experts stored transposed (Llama 4's, gpt-oss's) take no adapters yet";
  const std::string_view p = experts_parameter_of(row).parameter;
  for (int i = 0; i < row.hf_count; ++i) {
    const std::string_view hf = row.hf[static_cast<std::size_t>(i)];
    const std::string_view want = p == "down_proj" ? "down_proj.weight" : i == 0 ? "gate_proj.weight" : "up_proj.weight";
    if (!hf.ends_with(want))
      return "its experts' HF names (Mixtral's w1/w3/w2) are not those transformers fuses into experts.gate_up_proj and "
             "down_proj under the same module";
  }
  return {};
}

// Why a row cannot carry an adapter (empty: it can): only the layers' linear weights can.
constexpr std::string_view lora_unsupported(const param_row& row, const row_geometry& g) {
  if (row.where == placement::expert)
    return "a mixture's experts take adapters through target_parameters (PEFT's \"mlp.experts.gate_up_proj\", "
           "\"mlp.experts.down_proj\"), not target_modules";
  if (row.where != placement::layer) return "only the decoder layers' linears take adapters (not the embedding or a head)";
  if (is_bias(row) || g.across == 0) return "a vector is no linear";
  if (row.form != hf_form::as_held) return "it is no nn.Linear (a conv's weight, a scalar)";
  if (!g.token_matrix) return "it is no linear over the tokens (a router's or a per-head weight)";
  if (g.vocab) return "the vocabulary's rows take no adapters";
  return {};
}

// One adapter: the HF source of a row it wraps, its base's whole (out, in), the base's tp split,
// and A (r, in) and B (out, r) on one tp rank.
struct lora_adapter {
  const param_row* row = nullptr;
  int source = 0;              // the HF source of the row (0 for a row of one source or stored concatenated)
  std::string_view module;     // its HF module ("model.layers.{layer}.self_attn.q_proj"; experts: "...mlp.experts")
  // A mixture's experts: the fused parameter adapted ("gate_up_proj"), the layer's experts E (each
  // expert's adapter is (in, out) below; PEFT stacks them), and how many ParamWrappers of later
  // parameters of the module wrap this one (its key's ".base_layer" count). Linears: empty, 0, 0.
  std::string_view parameter{};
  std::int64_t experts = 0;
  int nesting = 0;
  std::int64_t in = 0, out = 0;
  int split = -1;              // the base's: 0 column, 1 row, -1 whole
  dims a_local{}, b_local{};   // A (r, in or in / tp), B (out or out / tp, r); kv heads fewer than tp: their group's one
  [[nodiscard]] constexpr std::int64_t whole_params(std::int64_t r) const { return r * (in + out); }
  // PEFT's stacked A's rows and B's columns: r, or r E for a mixture's experts.
  [[nodiscard]] constexpr std::int64_t stacked_rank(std::int64_t r) const { return experts > 0 ? r * experts : r; }
};

struct lora_adapter_list {
  std::array<lora_adapter, max_rows * 3> items{};
  std::size_t count = 0;
  [[nodiscard]] constexpr const lora_adapter* begin() const { return items.data(); }
  [[nodiscard]] constexpr const lora_adapter* end() const { return items.data() + count; }
  [[nodiscard]] constexpr std::size_t size() const { return count; }
};

// Whether the settings target this HF module (by name, or as a linear under "all-linear").
constexpr bool lora_targets_module(const lora& a, std::string_view module, bool linear) {
  for (int i = 0; i < a.target_count; ++i) {
    const std::string_view t = a.targets[static_cast<std::size_t>(i)].view();
    if (t == all_linear ? linear : lora_target_matches(module, t)) return true;
  }
  return false;
}

// Whether the settings' target_parameters name this experts parameter.
constexpr bool lora_targets_parameter(const lora& a, std::string_view module, std::string_view parameter) {
  for (int i = 0; i < a.parameter_count; ++i)
    if (lora_parameter_matches(module, parameter, a.parameters[static_cast<std::size_t>(i)].view())) return true;
  return false;
}

// The adapters of a model (its rows present under its shape, in table order; a layer row once,
// with `{layer}`; an expert row once, for every expert), and their shards at the layout's tp. Rows
// that cannot carry one are skipped; lora_rules refuses a target that names only such rows.
constexpr lora_adapter_list lora_adapters(const shape& s, const layout& l, const lora& a, head_info h = {}) {
  lora_adapter_list out;
  if (!a.enabled()) return out;
  const std::int64_t r = a.rank.get();
  for (const param_row& row : arch_of(s).rows) {
    if (!present(row, s, h) || existing_instances(row, s) == 0) continue;
    const row_geometry g = row.geometry(s);
    const std::int64_t tp = g.split < 0 ? 1 : l.tp.get();
    if (const experts_parameter e = experts_parameter_of(row); !e.parameter.empty()) {
      if (!lora_experts_unsupported(row).empty() || !lora_targets_parameter(a, e.module, e.parameter)) continue;
      // One adapter over every source of the row (gate_up_proj's [gate; up] rows).
      lora_adapter x{.row = &row, .source = 0, .module = e.module, .parameter = e.parameter, .experts = s.experts.get(),
                     .split = g.split};
      std::int64_t whole = 0, local = 0;
      for (const geometry_source& src : g.sources) {
        if (src.units == 0) continue;
        whole += src.extent();
        local += local_units(src, tp) * src.unit;
      }
      if (g.split == 1) x.in = whole, x.out = g.across, x.a_local = mat(r, local), x.b_local = mat(g.across, r);
      else x.in = g.across, x.out = whole, x.a_local = mat(r, g.across), x.b_local = mat(local, r);
      // PEFT wraps a module's targeted parameters in their order: the first innermost.
      for (std::size_t k = 0; k < out.count; ++k)
        if (out.items[k].experts > 0 && out.items[k].module == x.module) ++out.items[k].nesting;
      out.items[out.count++] = x;
      continue;
    }
    if (!lora_unsupported(row, g).empty()) continue;
    const int sources = row.concatenated ? 1 : row.hf_count;
    for (int i = 0; i < sources; ++i) {
      const std::string_view module = lora_module_of(row.hf[static_cast<std::size_t>(i)]);
      if (!lora_targets_module(a, module, true)) continue;
      lora_adapter x{.row = &row, .source = i, .module = module, .split = g.split};
      // The source's extent along the split dim, whole and on one rank.
      std::int64_t whole = 0, local = 0;
      for (std::size_t k = 0; k < g.sources.size(); ++k) {
        const geometry_source& src = g.sources[k];
        if (src.units == 0 || (!row.concatenated && static_cast<int>(k) != i)) continue;
        whole += src.extent();
        local += local_units(src, tp) * src.unit;
      }
      if (g.split == 1) {  // row-parallel: the source's extent is its input
        x.in = whole, x.out = g.across;
        x.a_local = mat(r, local), x.b_local = mat(g.across, r);
      } else {             // column-parallel or whole: its output rows
        x.in = g.across, x.out = whole;
        x.a_local = mat(r, g.across), x.b_local = mat(local, r);
      }
      out.items[out.count++] = x;
    }
  }
  return out;
}

// The adapters' parameters in the whole model (every layer), as PEFT counts them trainable.
constexpr std::int64_t lora_parameter_count(const shape& s, const lora& a, head_info h = {}) {
  std::int64_t n = 0;
  for (const lora_adapter& x : lora_adapters(s, layout{}, a, h)) n += existing_instances(*x.row, s) * x.whole_params(a.rank.get());
  return n;
}

// The rules a LoRA setting obeys against its model (named like the layout's, rules.hpp).
constexpr violations lora_rules(const shape& s, const lora& a, head_info h = {}) {
  violations out;
  if (!a.enabled()) return out;
  if (a.rank.is_static() && a.rank.get() < 1)
    out.add("lora_rank_positive", {a.rank.get()}).add("LoRA rank r = ", a.rank.get(), "; use r >= 1 (0: no adapters)");
  if (a.alpha.is_static() && !(a.alpha.get() > 0))
    out.add("lora_alpha_positive").add("lora_alpha = ", a.alpha.get(), "; the update is scaled by alpha / r: use alpha > 0");
  if (a.dropout.is_static() && !(a.dropout.get() >= 0 && a.dropout.get() < 1))
    out.add("lora_dropout_range").add("lora_dropout = ", a.dropout.get(), "; use 0 <= dropout < 1");
  if (a.parameter_count > 0 && a.dropout.is_static() && a.dropout.get() != 0)
    out.add("lora_dropout_experts").add("lora_dropout = ", a.dropout.get(), " with target_parameters: a mixture's experts' "
                                        "adapters take no dropout (PEFT's ParamWrapper refuses it too); use lora_dropout 0");
  if (a.target_count == 0 && a.parameter_count == 0)
    out.add("lora_targets_given").add("no LoRA target modules; name them (\"q_proj\", \"v_proj\", ...), use \"all-linear\", "
                                      "or name a mixture's experts' target_parameters");
  // Each named target wraps at least one linear of this model, else it names what it would wrap.
  for (int t = 0; t < a.target_count; ++t) {
    const std::string_view target = a.targets[static_cast<std::size_t>(t)].view();
    if (target == all_linear) continue;
    bool wraps = false;
    std::string_view refused, refused_module;
    for (const param_row& row : arch_of(s).rows) {
      if (!present(row, s, h) || existing_instances(row, s) == 0) continue;  // (a dense MLP no layer has)
      const int sources = row.concatenated ? 1 : row.hf_count;
      for (int i = 0; i < sources; ++i) {
        const std::string_view module = lora_module_of(row.hf[static_cast<std::size_t>(i)]);
        if (!lora_target_matches(module, target) || is_bias(row)) continue;
        if (const std::string_view why = lora_unsupported(row, row.geometry(s)); !why.empty()) {
          if (refused.empty()) refused = why, refused_module = module;
        } else {
          wraps = true;
        }
      }
    }
    if (wraps) continue;
    if (!refused.empty())
      out.add("lora_target_supported").add("LoRA target \"", target, "\" names ", refused_module, ": ", refused);
    else
      out.add("lora_targets_match").add("LoRA target \"", target, "\" names no module of ", arch_of(s).name.substr(0, 80),
                                        "; use its HF module names (q_proj, o_proj, gate_proj, ...) or \"all-linear\"");
  }
  // Each target parameter names a mixture's experts parameter that can carry PEFT's adapter.
  for (int t = 0; t < a.parameter_count; ++t) {
    const std::string_view target = a.parameters[static_cast<std::size_t>(t)].view();
    bool wraps = false;
    std::string_view refused;
    for (const param_row& row : arch_of(s).rows) {
      if (!present(row, s, h) || existing_instances(row, s) == 0) continue;
      const experts_parameter e = experts_parameter_of(row);
      if (e.parameter.empty() || !lora_parameter_matches(e.module, e.parameter, target)) continue;
      if (const std::string_view why = lora_experts_unsupported(row); !why.empty()) refused = why;
      else wraps = true;
    }
    if (wraps) continue;
    if (!refused.empty())
      out.add("lora_target_supported").add("LoRA target parameter \"", target, "\": ", refused);
    else
      out.add("lora_targets_match").add("LoRA target parameter \"", target, "\" names no experts parameter of ",
                                        arch_of(s).name.substr(0, 80),
                                        "; use \"mlp.experts.gate_up_proj\" or \"mlp.experts.down_proj\" (a mixture's experts)");
  }
  return out;
}

}  // namespace megadsl
