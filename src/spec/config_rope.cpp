// RoPE in config.json: transformers 4.x's rope_scaling and rope_theta, 5.x's rope_parameters, and
// RoPE per layer type (family_config::local_rope_theta).
#include "config_reader.hpp"

namespace megadsl::hf_read {

// One RoPE description: transformers 4.x's "rope_scaling" object ({"rope_type" or "type", scaling
// fields}) or 5.x's "rope_parameters" (the same, plus "rope_theta"). `where` names it in errors.
rope_scaling read_rope_object(const reader& r, const json& v, const std::string& where, std::optional<double>* partial) {
  rope_scaling out;  // type none
  // transformers 5 keeps a partial rotary fraction here (parse_hf_config decides
  // which families honour it).
  if (const json* f = r.find(v, "partial_rotary_factor")) {
    const double fraction = r.number(*f, where + ".partial_rotary_factor");
    if (partial != nullptr) *partial = fraction;
    else if (fraction != 1.0)
      r.fail(where + ".partial_rotary_factor", "is " + describe_json(*f) + " in " + where + ", which transformers reads whole",
             "move it to rope_parameters");
  }
  const json* t = r.find(v, "rope_type");
  std::string type_key = where + ".rope_type";
  if (!t) {
    t = r.find(v, "type");
    type_key = where + ".type";
  }
  if (!t) {
    // transformers 5 keys per-layer-type parameters by layer type (full/sliding attention).
    for (const auto& [k, sub] : v.items())
      if (sub.is_object())
        r.fail(where, "holds RoPE parameters per layer type (\"" + printable(k) + "\": {...}), which this family does not have",
               "this checkpoint's architecture is not supported");
    r.fail(where, "has neither \"rope_type\" nor \"type\"",
           "add \"rope_type\": one of \"default\", \"linear\", \"dynamic\", \"llama3\", \"yarn\"");
  }
  if (!t->is_string())
    r.fail(type_key, "expected a string, got " + describe_json(*t),
           "use one of \"default\", \"linear\", \"dynamic\", \"llama3\", \"yarn\"");
  const std::string type = t->get<std::string>();
  if (type == "default") return out;
  if (type == "linear") out.type = rope_type::linear;
  else if (type == "dynamic") out.type = rope_type::dynamic_ntk;
  else if (type == "llama3") out.type = rope_type::llama3;
  else if (type == "yarn") out.type = rope_type::yarn;
  else
    r.fail(type_key, "\"" + printable(type) + "\" is not supported",
           "megadsl implements rope scaling \"linear\", \"dynamic\", \"llama3\" and \"yarn\" (or none: \"default\")");

  auto need = [&](std::string_view key) -> const json& {
    const json* f = r.find(v, key);
    const std::string full = where + "." + std::string(key);
    if (!f) r.fail(full, "missing (needed by rope type \"" + type + "\")", "add it to " + where);
    return *f;
  };
  out.factor = r.number(need("factor"), where + ".factor");
  if (out.type.get() == rope_type::llama3) {
    out.low_freq_factor = r.number(need("low_freq_factor"), where + ".low_freq_factor");
    out.high_freq_factor = r.number(need("high_freq_factor"), where + ".high_freq_factor");
    out.original_max_positions =
        r.integer(need("original_max_position_embeddings"), where + ".original_max_position_embeddings", 1);
  }
  if (out.type.get() == rope_type::yarn) {  // transformers' _compute_yarn_parameters; null keys take its defaults
    out.original_max_positions =
        r.integer(need("original_max_position_embeddings"), where + ".original_max_position_embeddings", 1);
    const auto number = [&](std::string_view key, double fallback) {
      const json* f = r.find(v, key);
      return f == nullptr || f->is_null() ? fallback : r.number(*f, where + "." + std::string(key));
    };
    out.beta_fast = number("beta_fast", 32.0);
    out.beta_slow = number("beta_slow", 1.0);
    out.mscale = number("mscale", 0.0);
    out.mscale_all_dim = number("mscale_all_dim", 0.0);
    out.attention_factor = number("attention_factor", 0.0);
    const json* t = r.find(v, "truncate");
    out.truncate = t == nullptr || t->is_null() ? true : r.boolean(*t, where + ".truncate");
  }
  return out;
}

bool same_rope(const rope_scaling& a, const rope_scaling& b) {
  if (a.type.get() != b.type.get()) return false;
  if (a.type.get() == rope_type::none) return true;
  if (a.factor.get() != b.factor.get()) return false;
  if (a.type.get() == rope_type::yarn)
    return a.original_max_positions.get() == b.original_max_positions.get() && a.beta_fast.get() == b.beta_fast.get() &&
           a.beta_slow.get() == b.beta_slow.get() && a.mscale.get() == b.mscale.get() &&
           a.mscale_all_dim.get() == b.mscale_all_dim.get() && a.attention_factor.get() == b.attention_factor.get() &&
           a.truncate.get() == b.truncate.get();
  if (a.type.get() != rope_type::llama3) return true;
  return a.low_freq_factor.get() == b.low_freq_factor.get() && a.high_freq_factor.get() == b.high_freq_factor.get() &&
         a.original_max_positions.get() == b.original_max_positions.get();
}



// Both generations of config.json: 5.x's rope_parameters and 4.x's rope_scaling + rope_theta. A
// file with both must say the same thing in both (a re-saved config may carry the old keys too).
rope_read read_rope(const reader& r) {
  rope_read out;
  const json* legacy = r.find(r.root(), "rope_scaling");
  if (legacy && !legacy->is_null() && !legacy->is_object())
    r.fail("rope_scaling", "expected null or an object, got " + describe_json(*legacy),
           "write \"rope_scaling\": null for plain RoPE");
  if (legacy && legacy->is_object()) out.scaling = read_rope_object(r, *legacy, "rope_scaling");
  if (const json* t = r.find(r.root(), "rope_theta")) out.theta = r.number(*t, "rope_theta");

  const json* params = r.find(r.root(), "rope_parameters");
  if (!params || params->is_null()) return out;
  if (!params->is_object())
    r.fail("rope_parameters", "expected an object, got " + describe_json(*params),
           "transformers 5 writes {\"rope_type\": ..., \"rope_theta\": ...}");
  const rope_scaling scaling = read_rope_object(r, *params, "rope_parameters", &out.partial);
  if (legacy && legacy->is_object() && !same_rope(scaling, out.scaling))
    r.fail("rope_parameters", "disagrees with rope_scaling (" + std::string(name_of(scaling.type.get())) + " vs " +
                                  std::string(name_of(out.scaling.type.get())) + " or their factors)",
           "keep one of them: transformers 5 reads rope_parameters");
  out.scaling = scaling;
  if (const json* t = r.find(*params, "rope_theta")) {
    const double theta = r.number(*t, "rope_parameters.rope_theta");
    if (out.theta && *out.theta != theta)
      r.fail("rope_parameters.rope_theta", "is " + show(theta) + " but the top-level rope_theta is " + show(*out.theta),
             "keep one of them: transformers 5 reads rope_parameters.rope_theta");
    out.theta = theta;
  }
  return out;
}

// RoPE per layer type: rope_parameters {"full_attention": {...},
// "sliding_attention": {...}} (transformers 5), or 4.x's rope_theta / rope_scaling for the full
// layers and the family's local key (family_config::local_theta_key) for the sliding ones. The
// sliding layers' RoPE must be plain (the config classes scale the full layers only).
rope_read read_rope_per_layer_type(const reader& r, const family_config& fam, double& local) {
  local = fam.local_rope_theta;
  const json* params = r.find(r.root(), "rope_parameters");
  const bool nested = params != nullptr && params->is_object() &&
                      (params->contains("full_attention") || params->contains("sliding_attention"));
  if (!nested) {
    rope_read out = read_rope(r);
    if (!fam.local_theta_key.empty())
      if (const json* l = r.find(r.root(), fam.local_theta_key)) local = r.number(*l, fam.local_theta_key);
    return out;
  }
  rope_read out;
  if (const json* t = r.find(r.root(), "rope_theta")) out.theta = r.number(*t, "rope_theta");
  for (const auto& [k, v] : params->items())
    if (k != "full_attention" && k != "sliding_attention")
      r.fail("rope_parameters", "holds \"" + printable(k) + "\" beside the layer types' parameters",
             "keep \"full_attention\" and \"sliding_attention\" only");
  if (const json* full = r.find(*params, "full_attention"); full != nullptr && !full->is_null()) {
    if (!full->is_object()) r.fail("rope_parameters.full_attention", "expected an object, got " + describe_json(*full), "write {\"rope_type\": ..., \"rope_theta\": ...}");
    out.scaling = read_rope_object(r, *full, "rope_parameters.full_attention", &out.partial);
    if (const json* t = r.find(*full, "rope_theta")) out.theta = r.number(*t, "rope_parameters.full_attention.rope_theta");
  }
  if (const json* sliding = r.find(*params, "sliding_attention"); sliding != nullptr && !sliding->is_null()) {
    if (!sliding->is_object()) r.fail("rope_parameters.sliding_attention", "expected an object, got " + describe_json(*sliding), "write {\"rope_type\": \"default\", \"rope_theta\": ...}");
    const rope_scaling scaled = read_rope_object(r, *sliding, "rope_parameters.sliding_attention");
    if (scaled.type.get() != rope_type::none)
      r.fail("rope_parameters.sliding_attention.rope_type", "is \"" + std::string(name_of(scaled.type.get())) +
                 "\"; megadsl scales the full layers' RoPE only, as the published checkpoints do",
             "this checkpoint is not supported yet");
    if (const json* t = r.find(*sliding, "rope_theta")) local = r.number(*t, "rope_parameters.sliding_attention.rope_theta");
  }
  return out;
}

}  // namespace megadsl::hf_read
