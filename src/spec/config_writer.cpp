// Which HF config class describes a model (why_not, model_type_for), and config.json as save_hf
// writes it (hf_config_json).
#include "config_reader.hpp"

namespace megadsl {

using namespace hf_read;

namespace {

// The range of sparse layers (moe_config::sparse_first_key): the first and the last that route (none: layers, layers - 1).
std::pair<std::int64_t, std::int64_t> sparse_range(const shape& s) {
  std::int64_t first = s.layers.get(), last = s.layers.get() - 1;
  for (std::int64_t i = s.layers.get() - 1; i >= 0; --i)
    if (layer_routes(s, i)) first = i;
  for (std::int64_t i = 0; i < s.layers.get(); ++i)
    if (layer_routes(s, i)) last = i;
  return {first, last};
}

// How many layers from the first are dense (the dense_layers bits set from bit 0 on).
std::int64_t dense_prefix(const shape& s) {
  std::int64_t k = 0;
  while (k < 63 && k < s.layers.get() && ((s.dense_layers.get() >> k) & 1) != 0) ++k;
  return k;
}

// Why `family`'s config class cannot describe this model (its blocks being the family's), or empty.
// Why the family's bias keys cannot say this model's biases, or "": a fixed switch must hold its
// value, and switches sharing one key must agree.
std::string bias_mismatch(const shape& s, const family_config& family, const std::string& f) {
  const bias_switch* sw[3] = {&family.bias.qkv, &family.bias.out, &family.bias.mlp};
  const bool on[3] = {s.qkv_bias.get(), s.out_bias.get(), s.mlp_bias.get()};
  constexpr std::string_view bias[3] = {"q/k/v bias", "o_proj bias", "bias on the gated MLP (mlp_bias)"};
  constexpr std::string_view what[3] = {"q/k/v", "o_proj", "the MLP"};
  constexpr std::string_view field[3] = {"qkv_bias", "out_bias", "mlp_bias"};
  for (int i = 0; i < 3; ++i) {
    if (!sw[i]->key.empty() || on[i] == sw[i]->fallback) continue;
    return "a " + f + " config " + (sw[i]->fallback ? "always has the " : "has no ") + std::string(bias[i]) +
           (sw[i]->fallback ? ", and this model has none" : ", and this model has one");
  }
  for (int i = 0; i < 3; ++i) {
    if (sw[i]->key.empty()) continue;
    std::string parts, values;
    int n = 0;
    bool differ = false;
    for (int j = i; j < 3; ++j)
      if (sw[j]->key == sw[i]->key) {
        differ = differ || on[j] != on[i];
        parts += (n == 0 ? "" : ", ") + std::string(what[j]);
        values += (n == 0 ? "" : ", ") + std::string(field[j]) + " " + (on[j] ? "true" : "false");
        ++n;
      }
    if (differ) {
      const std::size_t last = parts.rfind(", ");
      if (last != std::string::npos) parts.replace(last, 2, " and ");
      return "a " + f + " config has one " + std::string(sw[i]->key) + " for " + parts + "; this model has " + values;
    }
  }
  return {};
}

std::string why_not(const shape& s, const sliding_window& window, const family_config& family,
                    const dropout_rates& dropout = {}) {
  const std::string f(family.hf_class);
  // Each non-zero rate needs a key of the family's that sets it, and one key sets its places alike.
  const std::vector<dropout_key> keys = dropout_keys_of(family);
  for (const auto& [place, rate] : {std::pair<std::string_view, double>{"attention", dropout.attention},
                                    {"residual", dropout.residual}, {"embedding", dropout.embedding}}) {
    bool said = false;
    for (const dropout_key& k : keys) {
      const bool sets = (place == "attention" && k.attention) || (place == "residual" && k.residual) ||
                        (place == "embedding" && k.embedding);
      if (!sets) continue;
      said = true;
      if ((k.attention && dropout.attention != rate) || (k.residual && dropout.residual != rate) ||
          (k.embedding && dropout.embedding != rate))
        return "a " + f + " config sets one rate for several dropouts (" + std::string(k.key) + "), and this model's differ (" +
               describe(dropout) + ")";
    }
    if (!said && rate != 0.0)
      return "a " + f + " config has no " + std::string(place) + " dropout, and this model's is " + format_double(rate);
  }
  if (s.rotary_fraction.get() != 1.0 && family.partial_rotary_key.empty())
    return "a " + f + " config rotates the whole head, and this model rotates " + show(s.rotary_fraction) + " of it";
  if (family.legacy_rope_keys && s.rope.type.get() != rope_type::none)
    return "megadsl writes a " + f + " config with plain RoPE only, and this model's is scaled (" + show(s.rope.type) + ")";
  if (family.rope_on == rope_layers::sliding)
    for (std::int64_t i = 0; i < s.layers.get(); ++i)
      if (nope_layer(s, i) != (window.of(i) == 0))
        return "a " + f + " config rotates exactly the sliding layers, and this model's NoPE layers differ";
  if (family.rope_on == rope_layers::sliding_if_windowed)
    for (std::int64_t i = 0; i < s.layers.get(); ++i)
      if (nope_layer(s, i) != (window.any() && window.of(i) == 0))
        return "a " + f + " config has no RoPE exactly on the full layers when a window is set, and this model's NoPE layers differ";
  if (s.local_rope_theta.get() != 0 && family.local_rope_theta == 0)
    return "a " + f + " config has one RoPE for every layer, and this model's sliding layers take their own base " +
           show(s.local_rope_theta);
  if (family.local_rope_theta != 0 && s.local_rope_theta.get() == 0 && s.rope.type.get() != rope_type::none)
    return "a " + f + " config scales the full layers' RoPE only, and this model scales every layer's";
  if (!family.score_caps && (s.query_pre_attn_scalar.get() != 0 || s.attn_softcap.get() != 0 || s.final_softcap.get() != 0))
    return "a " + f + " config has no score scale or soft-caps, and this model has them (query_pre_attn_scalar " +
           show(s.query_pre_attn_scalar) + ", attn_softcap " + show(s.attn_softcap) + ", final_softcap " +
           show(s.final_softcap) + ")";
  if (const std::string why = bias_mismatch(s, family, f); !why.empty()) return why;
  if (family.rope_interleave_key.empty() && s.rope_interleave.get() != family.interleaved_rope)
    return family.interleaved_rope ? "a " + f + " config rotates interleaved pairs, and this model rotates halves"
                                   : "a " + f + " config rotates each head's halves, and this model rotates interleaved pairs";
  if (family.moe != nullptr && family.moe->experts_as_wide_as_ffn &&
      ((!family.moe->reads_norm_topk && !s.norm_topk.get()) || s.expert_ffn.get() != 0 || !every_layer_routes(s)))
    return "a " + f + " config " + (family.moe->reads_norm_topk ? "" : "renormalises the top-k weights, ") +
           "sizes each expert by intermediate_size and has experts in every layer; this model has norm_topk " +
           show(s.norm_topk) + ", expert_ffn " + show(s.expert_ffn) + ", sparse_step " + show(s.sparse_step) +
           " and dense_layers " + show(s.dense_layers);
  if (family.moe != nullptr && family.moe->shared_as_wide_as_experts && s.shared_expert_ffn.get() != expert_ffn_of(s).get())
    return "a " + f + " config sizes its shared expert as each expert, and this model's shared_expert_ffn " +
           show(s.shared_expert_ffn) + " differs from expert_ffn " + show(expert_ffn_of(s));
  if (family.moe != nullptr && family.ffn_key == family.moe->expert_ffn_key && s.ffn.get() != expert_ffn_of(s).get())
    return "a " + f + " config has one MLP width, " + std::string(family.ffn_key) + " (its experts'), and this model's ffn " +
           show(s.ffn) + " differs from expert_ffn " + show(expert_ffn_of(s));
  if (family.moe != nullptr && family.moe->every_layer && (!every_layer_routes(s) || !s.norm_topk.get()))
    return "a " + f + " config has experts in every layer and renormalises the top-k weights; this model has norm_topk " +
           show(s.norm_topk) + ", sparse_step " + show(s.sparse_step) + " and dense_layers " + show(s.dense_layers);
  if (s.arch != nullptr && !s.settings.dynamic)
    for (const config_setting& c : s.arch->settings)
      if (const double v = setting(s, c.key); !c.accepts(v))
        return "a " + f + " config's " + std::string(c.key) + " takes [" + format_double(c.least) + ", " +
               format_double(c.most) + "], and this model's is " + format_double(v);
  if (family.moe != nullptr && family.moe->shared_as_wide_as_ffn && s.shared_expert_ffn.get() != s.ffn.get())
    return "a " + f + " config sizes its shared MLP by intermediate_size, and this model's shared_expert_ffn " +
           show(s.shared_expert_ffn) + " differs from ffn " + show(s.ffn);
  if (family.moe != nullptr && !family.moe->dense_first_key.empty()) {
    const std::int64_t k = dense_prefix(s);
    const std::int64_t mask = k >= 63 ? std::numeric_limits<std::int64_t>::max() : (std::int64_t{1} << k) - 1;
    if (s.sparse_step.get() != 1 || s.dense_layers.get() != mask)
      return "a " + f + " config makes the first " + std::string(family.moe->dense_first_key) +
             " layers dense and the rest sparse; this model has sparse_step " + show(s.sparse_step) + " and dense_layers " +
             show(s.dense_layers);
  }
  if (family.moe != nullptr && !family.moe->sparse_first_key.empty()) {
    const auto [first, last] = sparse_range(s);
    for (std::int64_t i = 0; i < s.layers.get(); ++i)
      if (layer_routes(s, i) != (i >= first && i <= last && (i + 1) % s.sparse_step.get() == 0))
        return "a " + f + " config makes every " + std::string(family.moe->sparse_step_key) + "-th layer from " +
               std::string(family.moe->sparse_first_key) + " to " + std::string(family.moe->sparse_last_key) +
               " sparse; this model's sparse layers (sparse_step " + show(s.sparse_step) + ", dense_layers " +
               show(s.dense_layers) + ") are not such a range";
  }
  if (family.moe != nullptr && !family.moe->shared_count_key.empty() && s.shared_expert_ffn.get() == 0 &&
      family.moe->shared_count_least > 0)
    return "a " + f + " config has at least one shared expert (" + std::string(family.moe->shared_count_key) +
           "), and this model has none";
  if (family.moe != nullptr && !family.moe->shared_count_key.empty() &&
      (expert_ffn_of(s).get() < 1 || s.shared_expert_ffn.get() % expert_ffn_of(s).get() != 0))
    return "a " + f + " config sizes the shared experts as " + std::string(family.moe->shared_count_key) +
           " x moe_intermediate_size, and this model's shared_expert_ffn " + show(s.shared_expert_ffn) +
           " is no multiple of " + show(expert_ffn_of(s));
  if (!window.any()) return {};
  switch (family.window) {
    case window_rule::none:
      return "a " + f + " config has no sliding window, and this model has one of " + std::to_string(window.size) + " tokens";
    case window_rule::every_layer:
      if (!window.every_layer())
        return "a " + f + " config slides every layer or none, and this model's window of " +
               std::to_string(window.size) + " tokens is on some layers only";
      break;
    case window_rule::from_max_window_layers: {
      bool seen = false;
      for (std::int64_t i = 0; i < s.layers.get(); ++i) {
        seen = seen || window.of(i) != 0;
        if (seen && window.of(i) == 0)
          return "a " + f + " config slides the layers from max_window_layers on, and this model's window is on other layers";
      }
      break;
    }
    case window_rule::alternate: break;  // any pattern, written as layer_types
    case window_rule::nope_layers:
      for (std::int64_t i = 0; i < s.layers.get(); ++i)
        if ((window.of(i) != 0) != nope_layer(s, i))
          return "a " + f + " config slides the layers without RoPE, and this model's window is on other layers";
      break;
  }
  return {};
}

// " save it as model_type x or y" for the families of the same blocks that describe the model,
// else " save it as a distributed checkpoint".
std::string alternatives(const shape& s, const sliding_window& window, const dropout_rates& dropout) {
  std::vector<std::string_view> ok;
  for (const family_config* f : known_families())
    if (s.arch == f->arch && why_not(s, window, *f, dropout).empty()) ok.push_back(f->model_type);
  if (ok.empty()) return " save it as a distributed checkpoint";
  std::string out = " save it as model_type ";
  for (std::size_t i = 0; i < ok.size(); ++i) out += (i == 0 ? "" : i + 1 == ok.size() ? " or " : ", ") + std::string(ok[i]);
  return out;
}

}  // namespace

std::string_view model_type_for(const shape& s, const sliding_window& window, const dropout_rates& dropout) {
  for (const family_config* f : known_families())
    if (s.arch == f->arch && why_not(s, window, *f, dropout).empty()) return f->model_type;
  return {};
}

namespace {
// A whole number as a JSON integer: transformers 5's config classes check their fields' types
// strictly, and an int field (a query_pre_attn_scalar, an integer block key) refuses 24.0.
json int_if_whole(double v) {
  return v == std::trunc(v) && std::abs(v) < 9e15 ? json(static_cast<std::int64_t>(v)) : json(v);
}
}  // namespace

std::string hf_config_json(const shape& s, std::string_view model_type, bool critic,
                           std::string_view torch_dtype, const sliding_window& window, const dropout_rates& dropout) {
  const family_config* fam = family_named(model_type);
  if (fam == nullptr) {
    std::string types;
    const std::vector<const family_config*>& families = known_families();
    for (std::size_t i = 0; i < families.size(); ++i)
      types += (i == 0 ? "" : i + 1 == families.size() ? " and " : ", ") + std::string(families[i]->model_type);
    throw config_error("megadsl: cannot write a config.json of model_type \"" + printable(model_type) +
                       "\"; megadsl writes " + types);
  }
  if (s.arch != fam->arch) {
    std::string others;  // the families of this composition, if any
    for (const family_config* f : known_families())
      if (f->arch == s.arch) others += (others.empty() ? "" : ", ") + std::string(f->model_type);
    throw config_error("megadsl: this model's blocks are not those of model_type " + std::string(model_type) + ": " +
                       std::string(s.arch != nullptr ? s.arch->name : "(none)") + ", where " + std::string(model_type) +
                       " has " + std::string(fam->arch->name) +
                       (others.empty() ? "; no HF config class describes this composition: save it as a distributed checkpoint"
                                       : "; save it as model_type " + others));
  }
  if (const std::string why = why_not(s, window, *fam, dropout); !why.empty())
    throw config_error("megadsl: " + why + ";" + alternatives(s, window, dropout));
  const std::string family(fam->hf_class);
  json j;
  j["architectures"] = {family + (critic ? "ForTokenClassification" : "ForCausalLM")};
  j["model_type"] = std::string(model_type);
  j["hidden_size"] = s.hidden.get();
  j["num_hidden_layers"] = s.layers.get();
  j["num_attention_heads"] = s.heads.get();
  j["num_key_value_heads"] = s.kv_heads.get();
  j[std::string(fam->ffn_key)] = s.ffn.get();
  j["vocab_size"] = s.vocab.get();
  for (const config_setting& c : s.arch->settings) {  // the blocks' own keys
    const double v = setting(s, c.key);
    j[std::string(c.key)] = c.kind == setting_kind::flag || c.kind == setting_kind::truthy ? json(v != 0)
                            : c.kind == setting_kind::integer_or_null && v == 0        ? json(nullptr)
                            : c.kind != setting_kind::number                           ? int_if_whole(v)
                                                                                       : json(v);
  }
  j["head_dim"] = effective_head_dim(s).get();
  j["max_position_embeddings"] = s.max_positions.get();
  j[std::string(fam->eps_key)] = s.rms_eps.get();
  j["rope_theta"] = s.rope_theta.get();
  if (fam->arch->has_act)
    j[std::string(fam->activation_key)] =
      fam->arch->act == activation::gelu_tanh ? "gelu_pytorch_tanh" : fam->arch->act == activation::gelu ? "gelu"
      : fam->arch->act == activation::xielu ? "xielu" : "silu";
  for (std::string_view key : fam->omitted_keys) j.erase(std::string(key));
  for (const required_key& k : fam->required) j[std::string(k.key)] = true;
  if (fam->legacy_rope_keys) {  // 4.x's keys beside 5.x's rope_parameters
    j[std::string(fam->partial_rotary_key)] = s.rotary_fraction.get();
    j[std::string(fam->theta_key)] = s.rope_theta.get();
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", s.rope_theta.get()},
                            {"partial_rotary_factor", s.rotary_fraction.get()}};
  } else if (!fam->partial_rotary_key.empty() && s.rotary_fraction.get() != 1.0) {
    j[std::string(fam->partial_rotary_key)] = s.rotary_fraction.get();
  }
  if (fam->score_caps) {
    // An int in transformers 5's config classes (their strict check refuses 24.0).
    const double scalar = s.query_pre_attn_scalar.get() != 0 ? s.query_pre_attn_scalar.get()
                                                             : static_cast<double>(effective_head_dim(s).get());
    j["query_pre_attn_scalar"] = int_if_whole(scalar);
    j["attn_logit_softcapping"] = s.attn_softcap.get() != 0 ? json(s.attn_softcap.get()) : json(nullptr);
    j["final_logit_softcapping"] = s.final_softcap.get() != 0 ? json(s.final_softcap.get()) : json(nullptr);
  }
  for (const auto& [sw, on] : {std::pair{&fam->bias.qkv, s.qkv_bias.get()}, {&fam->bias.out, s.out_bias.get()},
                                {&fam->bias.mlp, s.mlp_bias.get()}})
    if (!sw->key.empty()) j[std::string(sw->key)] = on;  // (switches sharing a key agree: why_not)
  for (const dropout_key& k : dropout_keys_of(*fam))
    j[std::string(k.key)] = k.attention ? dropout.attention : k.residual ? dropout.residual : dropout.embedding;
  j["tie_word_embeddings"] = s.tie_embeddings.get();
  j["torch_dtype"] = std::string(torch_dtype);
  if (fam->moe != nullptr) {
    const moe_config& m = *fam->moe;
    j[std::string(m.count_key)] = s.experts.get();
    j[std::string(m.top_k_key)] = s.top_k.get();
    if (m.experts_as_wide_as_ffn && m.reads_norm_topk) j["norm_topk_prob"] = s.norm_topk.get();
    if (!m.experts_as_wide_as_ffn) {
      j[std::string(m.expert_ffn_key)] = expert_ffn_of(s).get();
      if (m.reads_norm_topk) j["norm_topk_prob"] = s.norm_topk.get();
      if (m.every_layer) {
        // (no key: every layer routes)
      } else if (!m.dense_first_key.empty()) {
        j[std::string(m.dense_first_key)] = dense_prefix(s);
      } else if (!m.sparse_first_key.empty()) {  // the step, and the range of sparse layers
        const auto [first, last] = sparse_range(s);
        j[std::string(m.sparse_step_key)] = s.sparse_step.get();
        j[std::string(m.sparse_first_key)] = first;
        j[std::string(m.sparse_last_key)] = last;
      } else if (!m.sparse_layers_key.empty()) {  // the step, and the sparse layers listed
        j[std::string(m.sparse_step_key)] = s.sparse_step.get();
        json sparse = json::array();
        for (std::int64_t i = 0; i < s.layers.get(); ++i)
          if (layer_routes(s, i)) sparse.push_back(i);
        j[std::string(m.sparse_layers_key)] = sparse;
      } else {
        j["decoder_sparse_step"] = s.sparse_step.get();
        json dense = json::array();
        for (std::int64_t i = 0; i < 63 && i < s.layers.get(); ++i)
          if ((s.dense_layers.get() >> i) & 1) dense.push_back(i);
        j["mlp_only_layers"] = dense;
      }
      if (!m.shared_count_key.empty()) j[std::string(m.shared_count_key)] = s.shared_expert_ffn.get() / expert_ffn_of(s).get();
      else if (m.shared_expert_ffn != 0 && !m.shared_as_wide_as_experts) j["shared_expert_intermediate_size"] = s.shared_expert_ffn.get();
    }
  }
  const bool slides = window.any();
  const auto layers = s.layers.get();
  json types = json::array();
  std::int64_t first_sliding = layers;
  for (std::int64_t i = 0; i < layers; ++i) {
    const bool sliding = window.of(i) != 0;
    types.push_back(sliding ? "sliding_attention" : "full_attention");
    if (sliding && first_sliding == layers) first_sliding = i;
  }
  if (fam->window_needs_use_flag || !fam->use_flag_refusal.empty()) j["use_sliding_window"] = slides;
  if (fam->window != window_rule::none) j["sliding_window"] = slides ? json(window.size) : json(nullptr);
  if (fam->window == window_rule::from_max_window_layers) j["max_window_layers"] = first_sliding;
  if (fam->reads_layer_types) j["layer_types"] = types;
  if (!fam->head_dim_key.empty()) j[std::string(fam->head_dim_key)] = effective_head_dim(s).get();
  if (!fam->rope_interleave_key.empty()) j[std::string(fam->rope_interleave_key)] = s.rope_interleave.get();
  if (fam->reads_no_rope_layers) {
    json rope_layers = json::array();
    for (std::int64_t i = 0; i < layers; ++i) rope_layers.push_back(nope_layer(s, i) ? 0 : 1);
    j["no_rope_layers"] = rope_layers;
  }
  if (fam->layer_type != nullptr) {
    json fixed = json::array();
    for (std::int64_t i = 0; i < layers; ++i) fixed.push_back(fam->layer_type(s, i));
    j["layer_types"] = fixed;
  }
  const rope_scaling& r = s.rope;
  if (r.type.get() == rope_type::none) {
    j["rope_scaling"] = nullptr;
  } else {
    json rs;
    rs["rope_type"] = std::string(name_of(r.type.get()));
    rs["factor"] = r.factor.get();
    if (r.type.get() == rope_type::llama3) {
      rs["low_freq_factor"] = r.low_freq_factor.get();
      rs["high_freq_factor"] = r.high_freq_factor.get();
      rs["original_max_position_embeddings"] = r.original_max_positions.get();
    }
    if (r.type.get() == rope_type::yarn) {
      rs["original_max_position_embeddings"] = r.original_max_positions.get();
      rs["beta_fast"] = r.beta_fast.get();
      rs["beta_slow"] = r.beta_slow.get();
      if (r.mscale.get() != 0) rs["mscale"] = r.mscale.get();
      if (r.mscale_all_dim.get() != 0) rs["mscale_all_dim"] = r.mscale_all_dim.get();
      if (r.attention_factor.get() != 0) rs["attention_factor"] = r.attention_factor.get();
      rs["truncate"] = r.truncate.get();
    }
    j["rope_scaling"] = rs;
  }
  if (!fam->rope_must_be_stated.empty() && fam->local_rope_theta == 0) {
    // 5.x's rope_parameters, always: this family's class ignores a rope_theta without them.
    json params = j["rope_scaling"].is_object() ? j["rope_scaling"] : json{{"rope_type", "default"}};
    params["rope_theta"] = s.rope_theta.get();
    j["rope_parameters"] = params;
    j.erase("rope_scaling");
    j.erase("rope_theta");
  }
  if (fam->local_rope_theta != 0) {  // RoPE per layer type, as transformers 5 writes it
    json full = j["rope_scaling"].is_object() ? j["rope_scaling"] : json::object();
    if (!full.contains("rope_type")) full["rope_type"] = "default";
    full["rope_theta"] = s.rope_theta.get();
    const double local = s.local_rope_theta.get() != 0 ? s.local_rope_theta.get() : s.rope_theta.get();
    j["rope_parameters"] = {{"full_attention", full}, {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", local}}}};
    j.erase("rope_scaling");
    j.erase("rope_theta");
  }
  if (critic) {
    j["num_labels"] = 1;
    j["id2label"] = {{"0", "LABEL_0"}};
    j["label2id"] = {{"LABEL_0", 0}};
  }
  return j.dump(2) + "\n";
}

}  // namespace megadsl
