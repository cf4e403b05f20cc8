// HF config.json reader and the declared-vs-config comparison (include/megadsl/hf_config.hpp).
//
// Generic over the families: each family's header says what its config class holds (models/
// family_config.hpp, listed in models/registry.hpp), and nothing here names a family. A key that
// config.json leaves out takes the default of its model_type's config class, and every such
// default is recorded in `notes` so that nothing is filled in silently.
// Over 600 lines until the open-config redesign (issue 47) gives each block and family its own
// config keys in its own file; until then every rule of the generic reader and writer is here.
#include "megadsl/hf_config.hpp"
#include "megadsl/reflection.hpp"

#include "json_bounded.hpp"
#include "megadsl/io/printable.hpp"
#include "megadsl/layers/blocks.hpp"
#include "megadsl/models/registry.hpp"  // every family's config.json data

#include <boost/hana/at_key.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/keys.hpp>
#include <boost/hana/string.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

namespace megadsl {
namespace {

// The registry's families, then those registered by programs that declare their own.
std::vector<const family_config*>& family_list() {
  static std::vector<const family_config*> all(families.begin(), families.end());
  return all;
}
const std::vector<const family_config*>& known_families() { return family_list(); }
const family_config* family_named(std::string_view model_type) {
  for (const family_config* f : family_list())
    if (f->model_type == model_type) return f;
  return nullptr;
}

}  // namespace

void register_family(const family_config& family) {
  if (family.arch == nullptr)
    throw config_error("megadsl: register_family: family " + std::string(family.model_type) +
                       " names no architecture; set .arch = &architecture_of<its composition>");
  if (const family_config* known = family_named(family.model_type)) {
    if (known == &family) return;  // the same declaration, registered again
    const bool builtin = std::find(families.begin(), families.end(), known) != families.end();
    throw config_error("megadsl: register_family: model_type \"" + std::string(family.model_type) +
                       "\" is registered already, by " + (builtin ? "megadsl (" : "this program (") +
                       std::string(known->display) + ", " + std::string(known->hf_class) + "); this one (" +
                       std::string(family.display) + ", " + std::string(family.hf_class) +
                       ") would never be used: give it a model_type of its own");
  }
  family_list().push_back(&family);
}

namespace {

namespace hana = boost::hana;
using json = nlohmann::json;

struct key_name {
  std::string_view field;
  std::string_view hf;
};

// megadsl field -> HF key; rope fields carry the `rope.` prefix of their path in the shape.
constexpr key_name key_names[] = {
    {"hidden", "hidden_size"},
    {"layers", "num_hidden_layers"},
    {"heads", "num_attention_heads"},
    {"kv_heads", "num_key_value_heads"},
    {"ffn", "intermediate_size"},
    {"vocab", "vocab_size"},
    {"head_dim", "head_dim"},
    {"max_positions", "max_position_embeddings"},
    {"rms_eps", "rms_norm_eps"},
    {"rope_theta", "rope_theta"},
    {"rope", "rope_scaling"},
    {"local_rope_theta", "rope_parameters.sliding_attention.rope_theta / rope_local_base_freq"},
    {"qkv_bias", "attention_bias / model_type qwen2"},
    {"tie_embeddings", "tie_word_embeddings"},
    {"out_bias", "use_bias / attention_bias"},
    {"mlp_bias", "mlp_bias"},
    {"query_pre_attn_scalar", "query_pre_attn_scalar"},
    {"attn_softcap", "attn_logit_softcapping"},
    {"final_softcap", "final_logit_softcapping"},
    {"rotary_fraction", "rope_parameters.partial_rotary_factor / rotary_pct"},
    {"experts", "num_local_experts / num_experts"},
    {"top_k", "num_experts_per_tok"},
    {"expert_ffn", "moe_intermediate_size"},
    {"shared_expert_ffn", "shared_expert_intermediate_size"},
    {"norm_topk", "norm_topk_prob"},
    {"topk_sum_floor", "moe_norm_min"},
    {"nope_layers", "no_rope_layers"},
    {"routed_scale", "routed_scaling_factor"},
    {"q_lora_rank", "q_lora_rank"},
    {"kv_lora_rank", "kv_lora_rank"},
    {"qk_nope_dim", "qk_nope_head_dim"},
    {"v_head_dim", "v_head_dim"},
    {"rope_interleave", "rope_interleave"},
    {"expert_groups", "n_group"},
    {"group_top_k", "topk_group"},
    {"embedding_multiplier", "embedding_multiplier"},
    {"residual_multiplier", "residual_multiplier"},
    {"attention_multiplier", "attention_multiplier"},
    {"logits_scaling", "logits_scaling"},
    {"logit_scale", "logit_scale"},
    {"attention_chunk", "attention_chunk_size"},
    {"qk_l2_norm", "use_qk_norm"},
    {"use_qk_norm", "use_qk_norm"},
    {"attn_floor_scale", "floor_scale"},
    {"attn_scale", "attn_scale"},
    {"linear_layers", "layer_types (\"linear_attention\") / full_attention_interval"},
    {"linear_key_heads", "linear_num_key_heads"},
    {"linear_value_heads", "linear_num_value_heads"},
    {"linear_key_dim", "linear_key_head_dim"},
    {"linear_value_dim", "linear_value_head_dim"},
    {"linear_conv_kernel", "linear_conv_kernel_dim"},
    {"rope.type", "rope_scaling.rope_type"},
    {"rope.factor", "rope_scaling.factor"},
    {"rope.low_freq_factor", "rope_scaling.low_freq_factor"},
    {"rope.high_freq_factor", "rope_scaling.high_freq_factor"},
    {"rope.original_max_positions", "rope_scaling.original_max_position_embeddings"},
    {"rope.beta_fast", "rope_scaling.beta_fast"},
    {"rope.beta_slow", "rope_scaling.beta_slow"},
    {"rope.mscale", "rope_scaling.mscale"},
    {"rope.mscale_all_dim", "rope_scaling.mscale_all_dim"},
    {"rope.attention_factor", "rope_scaling.attention_factor"},
    {"rope.truncate", "rope_scaling.truncate"},
};

// Shortest round-trip text: 500000.0, 0.02, 1e-05 (as config.json writes them).
std::string format_double(double v) {
  char buf[64];
  const double a = std::abs(v);
  const auto format = a != 0 && (a < 1e-3 || a >= 1e15) ? std::chars_format::scientific : std::chars_format::fixed;
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, format);
  std::string s(buf, ec == std::errc{} ? end : buf);
  if (format == std::chars_format::scientific) {
    // 1e-5 -> 1e-05, like Python's repr
    if (auto e = s.find('e'); e != std::string::npos && s.size() - e == 3) s.insert(e + 2, "0");
  } else if (s.find('.') == std::string::npos) {
    s += ".0";
  }
  return s;
}

std::string show(std::int64_t v) { return std::to_string(v); }
std::string show(double v) { return format_double(v); }
std::string show(bool v) { return v ? "true" : "false"; }
template <class E>
  requires std::is_enum_v<E>
std::string show(E e) {
  return std::string(name_of(e));
}
template <class T>
std::string show(const maybe<T>& v) {
  return v.is_static() ? show(v.value) : "dynamic";
}

// How a json value looks in a message: `"32" (a string)`.
std::string describe_json(const json& v) {
  std::string kind = v.is_string()            ? "a string"
                     : v.is_boolean()         ? "a boolean"
                     : v.is_number_integer()  ? "an integer"
                     : v.is_number_float()    ? "a number with a fraction"
                     : v.is_null()            ? "null"
                     : v.is_array()           ? "an array"
                                              : "an object";
  std::string text = v.dump(-1, ' ', /*ensure_ascii=*/true);  // no raw control or non-ASCII bytes
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text + " (" + kind + ")";
}

class reader {
 public:
  // `key_prefix`: where `root` sits in the file ("text_config." for a multimodal checkpoint's text
  // model), for the messages.
  reader(const json& root, std::string file, std::vector<std::string>& notes, std::string key_prefix = "")
      : root_(root), file_(std::move(file)), prefix_(std::move(key_prefix)), notes_(notes) {}

  [[noreturn]] void fail(std::string_view key, const std::string& what, std::string_view fix) const {
    std::string m = "megadsl: " + file_ + ": ";
    if (!key.empty()) m += prefix_ + std::string(key) + ": ";
    m += what;
    if (!fix.empty()) m += "; " + std::string(fix);
    throw config_error(m);
  }

  const json* find(const json& obj, std::string_view key) const {
    auto it = obj.find(std::string(key));
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  std::int64_t integer(const json& v, std::string_view key, std::int64_t min) const {
    std::optional<std::int64_t> got;
    if (v.is_number_integer()) got = v.get<std::int64_t>();
    else if (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>() &&
             std::abs(v.get<double>()) < 9e15)
      got = static_cast<std::int64_t>(v.get<double>());
    if (!got)
      fail(key, "expected an integer, got " + describe_json(v), "write it as a plain JSON integer");
    if (*got < min)
      fail(key, "expected an integer >= " + std::to_string(min) + ", got " + std::to_string(*got),
           "fix the value in config.json");
    return *got;
  }

  double number(const json& v, std::string_view key) const {
    if (!v.is_number())
      fail(key, "expected a number, got " + describe_json(v), "write it as a plain JSON number");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d <= 0)
      fail(key, "expected a positive number, got " + format_double(d), "fix the value in config.json");
    return d;
  }

  bool boolean(const json& v, std::string_view key) const {
    if (!v.is_boolean())
      fail(key, "expected true or false, got " + describe_json(v), "write it as a JSON boolean");
    return v.get<bool>();
  }

  std::int64_t required_int(std::string_view key, std::string_view meaning) const {
    const json* v = find(root_, key);
    if (!v)
      fail(key, "missing (" + std::string(meaning) + ")",
           "every Llama-family config.json has it; point megadsl at the model's own config.json or add the key");
    return integer(*v, key, 1);
  }

  template <class T, class Read>
  T optional(std::string_view key, T fallback, Read read, bool note = true) const {
    const json* v = find(root_, key);
    if (!v) {
      if (note)
        notes_.push_back(prefix_ + std::string(key) + " not in config.json: using " + show(fallback) +
                         " (transformers' default)");
      return fallback;
    }
    return read(*v, key);
  }

  const json& root() const { return root_; }

 private:
  const json& root_;
  std::string file_;
  std::string prefix_;
  std::vector<std::string>& notes_;
};

// One RoPE description: transformers 4.x's "rope_scaling" object ({"rope_type" or "type", scaling
// fields}) or 5.x's "rope_parameters" (the same, plus "rope_theta"). `where` names it in errors.
rope_scaling read_rope_object(const reader& r, const json& v, const std::string& where,
                              std::optional<double>* partial = nullptr) {
  rope_scaling out;  // type none
  // transformers 5 keeps Phi-3's / NeoX's partial rotary fraction here (parse_hf_config decides
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
    // transformers 5 keys per-layer-type parameters by layer type (Gemma 3's full/sliding attention).
    for (const auto& [k, sub] : v.items())
      if (sub.is_object())
        r.fail(where, "holds RoPE parameters per layer type (\"" + printable(k) + "\": {...}), which megadsl's Llama family does not have",
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

struct rope_read {
  rope_scaling scaling;
  std::optional<double> theta;  // from rope_parameters.rope_theta (5.x) or the top-level rope_theta (4.x)
  std::optional<double> partial;  // rope_parameters.partial_rotary_factor
};

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

// Gemma 3's and OLMo 3's RoPE per layer type: rope_parameters {"full_attention": {...},
// "sliding_attention": {...}} (transformers 5), or 4.x's rope_theta / rope_scaling for the full
// layers and the family's local key (Gemma 3's rope_local_base_freq) for the sliding ones. The
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

bool close(double a, double b) { return a == b || std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); }

template <class T>
bool agree(const maybe<T>& d, const maybe<T>& c) {
  if (d.is_dynamic() || c.is_dynamic()) return true;
  if constexpr (std::is_same_v<T, double>) return close(d.value, c.value);
  else return d.value == c.value;
}

// Which rope_scaling fields a rope type reads.
bool rope_field_used(std::string_view field, const maybe<rope_type>& type) {
  if (field == "type") return true;
  if (type.is_dynamic()) return true;
  if (type.value == rope_type::none) return false;
  if (type.value == rope_type::yarn) return field != "low_freq_factor" && field != "high_freq_factor";
  return field == "factor" || (type.value == rope_type::llama3 && (field == "low_freq_factor" || field == "high_freq_factor" ||
                                                                  field == "original_max_positions"));
}

template <class T>
void fill(maybe<T>& d, const maybe<T>& c) {
  if (d.is_dynamic()) d = c;
}
void fill(rope_scaling& d, const rope_scaling& c) {
  hana::for_each(hana::keys(d), [&](auto key) { fill(hana::at_key(d, key), hana::at_key(c, key)); });
}

// The keys of every family's config class (PreTrainedConfig's own and the shape's), and what megadsl
// does with them; each family's own keys are in its header (family_config::keys), found first. A
// key in neither is unknown to the family's config class: transformers ignores it too, and megadsl
// says so in a note.
constexpr config_key_rule common_keys[] = {
    // Shape: read by parse_hf_config.
    {"model_type", key_use::read},
    {"hidden_size", key_use::read},
    {"num_hidden_layers", key_use::read},
    {"num_attention_heads", key_use::read},
    {"num_key_value_heads", key_use::read},
    {"intermediate_size", key_use::read},
    {"vocab_size", key_use::read},
    {"head_dim", key_use::read},
    {"max_position_embeddings", key_use::read},
    {"rope_theta", key_use::read},
    {"rope_scaling", key_use::read},
    {"rope_parameters", key_use::read},
    {"tie_word_embeddings", key_use::read},
    {"hidden_act", key_use::read},                // the family's activation only
    // Refused unless neutral (checked in check_keys).
    {"attention_dropout", key_use::read},         // dropout on the attention probabilities in training (read_dropout)
    {"classifier_dropout", key_use::refused},     // the value head's dropout (TokenClassification)
    {"quantization_config", key_use::refused},    // quantized weights
    {"pruned_heads", key_use::refused},
    // No effect on the numbers.
    {"torch_dtype", key_use::no_effect},          // the weights carry their dtype; convert writes it
    {"dtype", key_use::no_effect},
    {"architectures", key_use::no_effect},        // the head comes from the weights and the command
    {"transformers_version", key_use::no_effect},
    {"_name_or_path", key_use::no_effect},
    {"name_or_path", key_use::no_effect},
    {"initializer_range", key_use::no_effect},
    {"use_cache", key_use::no_effect},
    {"pad_token_id", key_use::no_effect},
    {"bos_token_id", key_use::no_effect},
    {"eos_token_id", key_use::no_effect},
    {"sep_token_id", key_use::no_effect},
    {"decoder_start_token_id", key_use::no_effect},
    {"id2label", key_use::no_effect},             // a critic's score shape is checked on the weights
    {"label2id", key_use::no_effect},
    {"num_labels", key_use::no_effect},
    {"problem_type", key_use::no_effect},
    {"tokenizer_class", key_use::no_effect},
    {"_attn_implementation", key_use::no_effect},  // eager, sdpa and flash compute the same attention
    {"attn_implementation", key_use::no_effect},
    {"_attn_implementation_autoset", key_use::no_effect},
    {"output_attentions", key_use::no_effect},
    {"output_hidden_states", key_use::no_effect},
    {"return_dict", key_use::no_effect},
    {"use_return_dict", key_use::no_effect},
    {"torchscript", key_use::no_effect},
    {"chunk_size_feed_forward", key_use::no_effect},  // chunking gives the same product
    {"is_encoder_decoder", key_use::no_effect},
    {"is_decoder", key_use::no_effect},
    {"add_cross_attention", key_use::no_effect},
    {"tie_encoder_decoder", key_use::no_effect},
    {"task_specific_params", key_use::no_effect},
    {"finetuning_task", key_use::no_effect},
    {"prefix", key_use::no_effect},
    {"auto_map", key_use::no_effect},
    {"keys_to_ignore_at_inference", key_use::no_effect},
    // 4.x configs still carry generation settings; they concern sampling, not the model's numbers.
    {"max_length", key_use::no_effect},
    {"min_length", key_use::no_effect},
    {"do_sample", key_use::no_effect},
    {"early_stopping", key_use::no_effect},
    {"num_beams", key_use::no_effect},
    {"num_beam_groups", key_use::no_effect},
    {"diversity_penalty", key_use::no_effect},
    {"temperature", key_use::no_effect},
    {"top_k", key_use::no_effect},
    {"top_p", key_use::no_effect},
    {"typical_p", key_use::no_effect},
    {"repetition_penalty", key_use::no_effect},
    {"length_penalty", key_use::no_effect},
    {"no_repeat_ngram_size", key_use::no_effect},
    {"encoder_no_repeat_ngram_size", key_use::no_effect},
    {"bad_words_ids", key_use::no_effect},
    {"num_return_sequences", key_use::no_effect},
    {"output_scores", key_use::no_effect},
    {"return_dict_in_generate", key_use::no_effect},
    {"forced_bos_token_id", key_use::no_effect},
    {"forced_eos_token_id", key_use::no_effect},
    {"remove_invalid_values", key_use::no_effect},
    {"exponential_decay_length_penalty", key_use::no_effect},
    {"suppress_tokens", key_use::no_effect},
    {"begin_suppress_tokens", key_use::no_effect},
};

// The gated DeltaNet's keys, read by read_linear_attention for every family that has the layers.
constexpr config_key_rule linear_attention_keys[] = {
    {"layer_types", key_use::read},
    {"full_attention_interval", key_use::read},
    {"linear_num_key_heads", key_use::read},
    {"linear_num_value_heads", key_use::read},
    {"linear_key_head_dim", key_use::read},
    {"linear_value_head_dim", key_use::read},
    {"linear_conv_kernel_dim", key_use::read},
};

const config_key_rule* find_key(const family_config& family, std::string_view key) {
  for (const config_key_rule& k : family.keys)
    if (k.key == key) return &k;
  if (family.linear_attention)
    for (const config_key_rule& k : linear_attention_keys)
      if (k.key == key) return &k;
  for (const config_key_rule& k : common_keys)
    if (k.key == key) return &k;
  return nullptr;
}

// attention_dropout as every config class but ERNIE 4.5's has it (a family lists its own otherwise).
constexpr dropout_key attention_dropout_key{.key = "attention_dropout", .attention = true};

// The family's dropout keys: its own (family_config::dropouts), and attention_dropout unless the
// family lists it or its keys say its class applies none.
std::vector<dropout_key> dropout_keys_of(const family_config& family) {
  std::vector<dropout_key> out(family.dropouts.begin(), family.dropouts.end());
  bool listed = false;
  for (const dropout_key& k : out) listed = listed || k.key == attention_dropout_key.key;
  bool own_rule = false;
  for (const config_key_rule& k : family.keys) own_rule = own_rule || k.key == attention_dropout_key.key;
  if (!listed && !own_rule) out.push_back(attention_dropout_key);
  return out;
}

const dropout_key* dropout_key_named(const family_config& family, std::string_view key) {
  for (const dropout_key& k : family.dropouts)
    if (k.key == key) return &k;
  if (key != attention_dropout_key.key) return nullptr;
  for (const config_key_rule& k : family.keys)
    if (k.key == key) return nullptr;
  return &attention_dropout_key;
}

// The rates of the family's dropout keys, their class defaults where config.json is silent: each a
// probability in [0, 1).
dropout_rates read_dropout(const reader& r, const family_config& family, std::vector<std::string>& notes) {
  dropout_rates out;
  for (const dropout_key& k : dropout_keys_of(family)) {
    double p = k.class_default;
    const auto it = r.root().find(std::string(k.key));
    if (it == r.root().end()) {
      if (p != 0.0)
        notes.push_back(std::string(k.key) + " not in config.json: using " + format_double(p) + " (transformers' default), "
                        "applied in training steps");
    } else {
      if (!it->is_number())
        r.fail(k.key, "expected a dropout probability, got " + describe_json(*it),
               "write a number in [0, 1) (0.0: no dropout)");
      p = it->get<double>();
      if (!(p >= 0.0 && p < 1.0))
        r.fail(k.key, "is " + describe_json(*it) + ", not a probability below 1 (1 would drop everything)",
               "write a number in [0, 1) (0.0: no dropout)");
    }
    if (k.attention) out.attention = p;
    if (k.residual) out.residual = p;
    if (k.embedding) out.embedding = p;
  }
  return out;
}

// The key (or an older spelling) under which config.json gives a block's own setting, or "".
std::string_view setting_key_in(const json& root, const config_setting& c) {
  if (root.contains(std::string(c.key))) return c.key;
  for (const std::string_view k : c.also)
    if (!k.empty() && root.contains(std::string(k))) return k;
  return {};
}
bool is_setting_key(const architecture& a, std::string_view key) {
  for (const config_setting& c : a.settings)
    if (c.key == key || c.also[0] == key || c.also[1] == key) return true;
  return false;
}

// Refused keys must hold their neutral value; unknown keys get a note (transformers ignores them
// too, since its config class has no such field).
void check_keys(const reader& r, const family_config& family, std::vector<std::string>& notes) {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : r.root().items()) {
    if (dropout_key_named(family, key) != nullptr) continue;  // read by read_dropout
    if (is_setting_key(*family.arch, key)) continue;          // a block's own, read by read_block_settings
    const config_key_rule* k = find_key(family, key);
    if (k == nullptr) {
      unknown.push_back(printable(key));
      continue;
    }
    if (k->use == key_use::no_effect && !k->note.empty() && !value.is_null() &&
        !(value.is_number() && value.get<double>() == 0.0))
      notes.push_back(key + " = " + printable(value.dump()) + ": " + std::string(k->note));
    if (k->use != key_use::refused || value.is_null()) continue;
    if (key == "router_jitter_noise") {
      if (value.is_number() && value.get<double>() == 0.0) continue;
      r.fail(key, "is " + describe_json(value) + ": HF multiplies the router's input by random noise in training, "
             "which megadsl does not, so training would differ", "set it to 0.0 (Mixtral's published configs have 0.0)");
    }
    if (key == "classifier_dropout") {
      if (value.is_number() && value.get<double>() == 0.0) continue;
      r.fail(key, "is " + describe_json(value) + ": megadsl's value head has no dropout, so a critic's training would "
             "differ from HF's", "set it to 0.0 (verl's critics set it to 0)");
    }
    if (key == "pruned_heads" && value.is_object() && value.empty()) continue;
    if (value.is_boolean() && !value.get<bool>()) continue;  // a switch left off
    r.fail(key, "is " + describe_json(value) + ", which megadsl does not implement" + (k->note.empty() ? "" : " (" + std::string(k->note) + ")"),
           key == "quantization_config" ? "dequantize the checkpoint to bf16/fp32 first"
                                        : "this checkpoint is not supported");
  }
  if (!unknown.empty()) {
    std::string list;
    for (std::size_t i = 0; i < unknown.size(); ++i) list += (i ? ", " : "") + unknown[i];
    notes.push_back("keys unknown to transformers' " + std::string(family.model_type) +
                    " config, ignored as transformers ignores them: " + list);
  }
}

// The blocks' own config keys (architecture.hpp's config_setting), whatever the family: each read
// and checked as its block declares it; a key config.json does not give keeps its default.
void read_block_settings(const reader& r, const architecture& a, shape& s) {
  s.settings = {};
  for (std::size_t i = 0; i < a.settings.size(); ++i) {
    const config_setting& c = a.settings[i];
    const std::string_view key = setting_key_in(r.root(), c);
    const json* v = key.empty() ? nullptr : r.find(r.root(), key);
    if (v == nullptr) continue;
    const std::string what = std::string(c.meaning.empty() ? "" : " (" + std::string(c.meaning) + ")");
    double x = 0;
    if (c.kind == setting_kind::flag) {
      x = r.boolean(*v, key) ? 1.0 : 0.0;
    } else {
      if (!v->is_number()) r.fail(key, "expected a number, got " + describe_json(*v) + what, "write it as a plain JSON number");
      x = v->get<double>();
      if (c.kind == setting_kind::integer && std::trunc(x) != x)
        r.fail(key, "expected an integer, got " + describe_json(*v) + what, "write it as a plain JSON integer");
      if (!std::isfinite(x) || x < c.least || x > c.most)
        r.fail(key, "is " + format_double(x) + what + ", where the block takes " +
                        (c.least <= -1e300 ? "at most " + format_double(c.most)
                         : c.most >= 1e300 ? "at least " + format_double(c.least)
                                           : "[" + format_double(c.least) + ", " + format_double(c.most) + "]"),
               "give a value in that range (default " + format_double(c.fallback) + ")");
    }
    s.settings.value[i] = x;
    s.settings.given |= 1U << i;
  }
}

// Multi-head latent attention's sizes (DeepseekV3Config): q_lora_rank null means q_proj directly;
// head_dim is the rotated share of each head, qk_rope_head_dim (a head_dim key must agree with it).
void read_mla(const reader& r, const mla_config& m, shape& s) {
  const auto size = [&](std::string_view key, std::int64_t fallback, std::int64_t least) {
    return r.optional<std::int64_t>(key, fallback, [&](const json& v, std::string_view k) { return r.integer(v, k, least); });
  };
  const auto q = r.root().find("q_lora_rank");  // null (not absent): the query directly (q_proj)
  s.q_lora_rank = q == r.root().end() ? m.q_lora_rank : q->is_null() ? 0 : r.integer(*q, "q_lora_rank", 1);
  s.kv_lora_rank = size("kv_lora_rank", m.kv_lora_rank, 1);
  s.qk_nope_dim = size("qk_nope_head_dim", m.qk_nope_head_dim, 0);
  s.v_head_dim = size("v_head_dim", m.v_head_dim, 1);
  const std::int64_t rope = size("qk_rope_head_dim", m.qk_rope_head_dim, 2);
  if (const json* hd = r.find(r.root(), "head_dim"); hd != nullptr && !hd->is_null() && r.integer(*hd, "head_dim", 1) != rope)
    r.fail("head_dim", "is " + describe_json(*hd) + " but qk_rope_head_dim is " + std::to_string(rope),
           "DeepseekV3Config sets head_dim to qk_rope_head_dim: make them equal");
  s.head_dim = rope;
  s.rope_interleave = r.optional<bool>("rope_interleave", m.rope_interleave, [&](const json& v, std::string_view k) { return r.boolean(v, k); });
}

// SmolLM3's NoPE layers: `no_rope_layers` holds one 0/1 per layer (1: the layer applies RoPE); without
// it, every `no_rope_layer_interval`-th layer (4 by default) has none, as SmolLM3Config derives it.
void read_no_rope_layers(const reader& r, shape& s, bool empty_is_default) {
  const std::int64_t layers = s.layers.get();
  std::int64_t nope = 0;
  const auto mark = [&](std::int64_t i, std::string_view key) {
    if (i >= 64)
      r.fail(key, "makes layer " + std::to_string(i) + " a NoPE layer; megadsl marks NoPE layers among the first 64 only",
             "this checkpoint is not supported yet");
    nope |= static_cast<std::int64_t>(std::uint64_t{1} << i);
  };
  const json* list = r.find(r.root(), "no_rope_layers");
  if (list != nullptr && empty_is_default && list->is_array() && list->empty()) list = nullptr;  // Llama4TextConfig's fallback
  if (list != nullptr && !list->is_null()) {
    if (!list->is_array() || static_cast<std::int64_t>(list->size()) != layers)
      r.fail("no_rope_layers", "expected a list of " + std::to_string(layers) + " zeros and ones, got " + describe_json(*list),
             "one entry per layer: 1 where the layer applies RoPE, 0 where it does not");
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::int64_t v = r.integer((*list)[i], "no_rope_layers", 0);
      if (v > 1) r.fail("no_rope_layers", "holds " + std::to_string(v), "write 1 (RoPE) or 0 (no RoPE) per layer");
      if (v == 0) mark(static_cast<std::int64_t>(i), "no_rope_layers");
    }
  } else {
    const std::int64_t every = r.optional<std::int64_t>("no_rope_layer_interval", 4,
        [&](const json& v, std::string_view k) { return r.integer(v, k, 1); }, /*note=*/false);
    for (std::int64_t i = 0; i < layers; ++i)
      if ((i + 1) % every == 0) mark(i, "no_rope_layer_interval");
  }
  s.nope_layers = nope;
}

// The attention window HF applies and its layers, as transformers 5 derives them from the family's
// rule (family_config::window): `sliding_window` on every layer; only with `use_sliding_window`,
// on the layers from `max_window_layers` on; on alternate layers from the first. An explicit
// `layer_types` list overrides the pattern in the families whose attention reads it.
sliding_window read_attention_window(const reader& r, const family_config& family, const shape& s) {
  const std::int64_t layers = s.layers.get();
  const json& root = r.root();
  const json* w = r.find(root, "sliding_window");
  if (family.window_needs_use_flag || !family.use_flag_refusal.empty()) {
    // Without use_sliding_window these configs clear the window whatever sliding_window says.
    const json* use = r.find(root, "use_sliding_window");
    if (use == nullptr || !r.boolean(*use, "use_sliding_window")) {
      // SmolLM3Config keeps sliding_window then, and transformers' eager and sdpa masks slide the
      // layers an explicit layer_types calls sliding while its flash attention does not: refused.
      const json* types = family.window == window_rule::nope_layers ? r.find(root, "layer_types") : nullptr;
      if (types != nullptr && types->is_array() && w != nullptr && !w->is_null() &&
          std::find(types->begin(), types->end(), json("sliding_attention")) != types->end())
        r.fail("layer_types", "has sliding_attention layers while use_sliding_window is false: transformers' eager and "
                              "sdpa attention slide them by sliding_window, its flash attention does not",
               "set use_sliding_window true to slide them, or call them \"full_attention\"");
      return {};
    }
    if (!family.use_flag_refusal.empty())
      r.fail("use_sliding_window", std::string(family.use_flag_refusal),
             "this checkpoint is not supported yet (the published " + std::string(family.display) +
                 " checkpoints have it false)");
  }
  const bool alternate = family.window == window_rule::alternate;
  if (family.window == window_rule::none || (w == nullptr && !alternate)) return {};
  if (family.window == window_rule::nope_layers && w->is_null()) return {};  // SmolLM3Config: no window, no sliding layer
  // An explicit null (not an absent key: the class default) leaves the patterned families' attention
  // without a window for its sliding layers, and transformers fails (Gemma 2's mask; EXAONE 4's
  // pattern; Cohere2's sliding layers take a None window): refused below unless every layer is full.
  const auto null_key = root.find("sliding_window");
  const bool null_window = alternate && null_key != root.end() && null_key->is_null();
  sliding_window out;
  out.size = w ? r.integer(*w, "sliding_window", 1) : family.default_window;  // (Gemma2Config's: 4096)
  out.layers.assign(static_cast<std::size_t>(layers), true);
  if (family.window == window_rule::from_max_window_layers) {
    const json* mwl = r.find(root, "max_window_layers");
    const std::int64_t first = mwl ? r.integer(*mwl, "max_window_layers", 0) : 28;
    for (std::int64_t i = 0; i < layers; ++i) out.layers[static_cast<std::size_t>(i)] = i >= first;
  }
  if (alternate) {  // every full_every-th layer full (Gemma2: 2; Gemma 3: sliding_window_pattern, 6)
    std::int64_t every = family.full_every;
    if (const json* p = r.find(root, "sliding_window_pattern"); p != nullptr && family.full_every != 2)
      every = r.integer(*p, "sliding_window_pattern", 1);
    for (std::int64_t i = 0; i < layers; ++i) out.layers[static_cast<std::size_t>(i)] = (i + 1) % every != 0;
  }
  if (family.window == window_rule::nope_layers) {
    for (std::int64_t i = 0; i < layers; ++i) out.layers[static_cast<std::size_t>(i)] = nope_layer(s, i);
  }
  if (const json* types = r.find(root, "layer_types"); types && family.reads_layer_types) {
    if (!types->is_array() || static_cast<std::int64_t>(types->size()) != layers)
      r.fail("layer_types", "expected an array of " + std::to_string(layers) + " strings, got " + describe_json(*types),
             "one \"full_attention\" or \"sliding_attention\" per layer");
    for (std::size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t != "sliding_attention" && t != "full_attention")
        r.fail("layer_types", "holds " + describe_json(t) + ", a layer type megadsl does not have",
               "use \"full_attention\" or \"sliding_attention\"");
      out.layers[i] = t == "sliding_attention";
    }
  }
  if (null_window && std::find(out.layers.begin(), out.layers.end(), true) != out.layers.end())
    r.fail("sliding_window", "is null while the layer pattern has sliding layers: transformers has no window to build "
                             "their mask with (its " + std::string(family.hf_class) + " model fails on this config)",
           "give the window's size (the class default is 4096), or make every layer \"full_attention\" in layer_types");
  if (!out.any()) return {};
  return out;
}

// Llama 4's attention keys (family_config::llama4_attention): the RoPE layers' chunks and q/k L2
// norm, the NoPE layers' temperature tuning; layer_types, if given, must agree with the RoPE layers
// (Llama4TextAttention rotates by no_rope_layers, the mask follows layer_types).
void read_llama4_attention(const reader& r, shape& s) {
  const json& root = r.root();
  // (reader::find reads null as absent; here null says something else than the class default.)
  const auto raw = [&](const char* key) -> const json* {
    const auto it = root.find(key);
    return it == root.end() ? nullptr : &*it;
  };
  const json* chunk = raw("attention_chunk_size");
  if (chunk != nullptr && chunk->is_null())
    r.fail("attention_chunk_size", "is null: transformers' Llama 4 then fails to build the chunked layers' mask",
           "give the chunk (Llama 4's is 8192)");
  s.attention_chunk = chunk != nullptr ? r.integer(*chunk, "attention_chunk_size", 1) : std::int64_t{8192};
  const json* qk = raw("use_qk_norm");
  s.qk_l2_norm = qk == nullptr || (!qk->is_null() && r.boolean(*qk, "use_qk_norm"));  // null: falsy
  // attn_temperature_tuning is tested for truth (early configs wrote a number).
  bool tuning = true;
  if (const json* t = raw("attn_temperature_tuning"); t != nullptr && !t->is_null()) {
    if (t->is_boolean()) tuning = t->get<bool>();
    else if (t->is_number()) tuning = t->get<double>() != 0;
    else r.fail("attn_temperature_tuning", "expected true or false, got " + describe_json(*t), "write true or false");
  } else if (t != nullptr) {
    tuning = false;  // null: falsy, as Llama4TextAttention tests it
  }
  const auto number = [&](std::string_view key, double fallback) {
    return r.optional<double>(key, fallback, [&](const json& v, std::string_view k) { return r.number(v, k); });
  };
  const double floor_scale = number("floor_scale", 8192.0), scale = number("attn_scale", 0.1);
  if (tuning && !(floor_scale > 0))
    r.fail("floor_scale", "is " + show(floor_scale) + ": the NoPE layers divide each position by it",
           "give a positive floor_scale (Llama 4's is 8192)");
  s.attn_floor_scale = tuning ? floor_scale : 0.0;
  s.attn_scale = tuning ? scale : 0.0;
  if (const json* types = r.find(root, "layer_types"); types != nullptr && !types->is_null()) {
    if (!types->is_array() || static_cast<std::int64_t>(types->size()) != s.layers.get())
      r.fail("layer_types", "expected one entry per layer (" + std::to_string(s.layers.get()) + "), got " + describe_json(*types),
             "write \"chunked_attention\" for the RoPE layers and \"full_attention\" for the others");
    for (std::int64_t i = 0; i < s.layers.get(); ++i) {
      const json& t = (*types)[static_cast<std::size_t>(i)];
      const std::string_view want = nope_layer(s, i) ? "full_attention" : "chunked_attention";
      if (!t.is_string() || t.get<std::string>() != want)
        r.fail("layer_types", "makes layer " + std::to_string(i) + " " + describe_json(t) + " where no_rope_layers makes it a " +
                   (nope_layer(s, i) ? "NoPE" : "RoPE") + " layer; megadsl's Llama 4 layers chunk exactly the RoPE layers",
               "write \"" + std::string(want) + "\" there (or leave layer_types out)");
    }
  }
}

// Qwen3-Next's gated DeltaNet keys (family_config::linear_attention), with Qwen3NextConfig's
// defaults: the heads and dims of the linear layers, and which layers they are (layer_types, or
// every layer but each full_attention_interval-th).
void read_linear_attention(const reader& r, shape& s) {
  const auto size = [&](std::string_view key, std::int64_t fallback) {
    return r.optional<std::int64_t>(key, fallback, [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  };
  s.linear_key_heads = size("linear_num_key_heads", 16);
  s.linear_value_heads = size("linear_num_value_heads", 32);
  s.linear_key_dim = size("linear_key_head_dim", 128);
  s.linear_value_dim = size("linear_value_head_dim", 128);
  s.linear_conv_kernel = size("linear_conv_kernel_dim", 4);
  if (s.linear_value_heads.get() % s.linear_key_heads.get() != 0)
    r.fail("linear_num_value_heads", "is " + show(s.linear_value_heads.get()) + ", not a multiple of linear_num_key_heads " +
               show(s.linear_key_heads.get()),
           "transformers groups the value heads per key head: give a multiple");
  const std::int64_t layers = s.layers.get();
  std::int64_t bits = 0;
  const auto mark = [&](std::int64_t i, std::string_view key) {
    if (i >= 63)
      r.fail(key, "makes layer " + std::to_string(i) + " a linear-attention layer; megadsl marks them among the first 63 "
                  "layers only", "this checkpoint is not supported yet");
    bits |= std::int64_t{1} << i;
  };
  if (const json* types = r.find(r.root(), "layer_types"); types != nullptr) {
    if (!types->is_array() || static_cast<std::int64_t>(types->size()) != layers)
      r.fail("layer_types", "expected one entry per layer (" + std::to_string(layers) + "), got " + describe_json(*types),
             "write \"linear_attention\" or \"full_attention\" for each layer");
    for (std::int64_t i = 0; i < layers; ++i) {
      const json& t = (*types)[static_cast<std::size_t>(i)];
      if (t == "linear_attention") mark(i, "layer_types");
      else if (t != "full_attention")
        r.fail("layer_types", "holds " + describe_json(t) + " at layer " + std::to_string(i) + ", a layer type Qwen3-Next does not have",
               "use \"linear_attention\" or \"full_attention\"");
    }
  } else {
    const std::int64_t every = size("full_attention_interval", 4);
    for (std::int64_t i = 0; i < layers; ++i)
      if ((i + 1) % every != 0) mark(i, "full_attention_interval");
  }
  s.linear_layers = bits;
}

// A mixture of experts' keys (family_config::moe). Mixtral names its count num_local_experts,
// Qwen2-MoE num_experts, and transformers 5 writes Qwen3-MoE's as num_local_experts (reading either).
void read_experts(const reader& r, const family_config& family, shape& s) {
  const json& root = r.root();
  const moe_config& m = *family.moe;
  // A name the config class maps onto a key (attribute_map): read as that key, unless both disagree.
  const auto alias = [&](std::string_view key, std::string_view other) {
    const json* a = other.empty() ? nullptr : r.find(root, other);
    if (a == nullptr) return;
    const json* k = r.find(root, key);
    if (k != nullptr && *k != *a)
      r.fail(other, "is " + describe_json(*a) + " but " + std::string(key) + " is " + describe_json(*k),
             "keep one of them (transformers maps " + std::string(other) + " onto " + std::string(key) + ")");
  };
  alias(m.count_key, m.count_alias);
  alias(m.top_k_key, m.top_k_alias);
  // The name config.json gives it: the key, or where only the alias is there, the alias.
  const auto stated = [&](std::string_view key, std::string_view other) {
    return r.find(root, key) == nullptr && !other.empty() && r.find(root, other) != nullptr ? other : key;
  };
  const bool both = m.reads_both_counts;
  const json* local = both || m.count_key == "num_local_experts" ? r.find(root, "num_local_experts") : nullptr;
  const json* named = both || m.count_key == "num_experts" ? r.find(root, "num_experts")
                      : m.count_key != "num_local_experts" ? r.find(root, stated(m.count_key, m.count_alias)) : nullptr;
  if (local && named && r.integer(*local, "num_local_experts", 1) != r.integer(*named, "num_experts", 1))
    r.fail("num_experts", "is " + describe_json(*named) + " but num_local_experts is " + describe_json(*local),
           "keep one of them (transformers reads " + std::string(m.count_key) + " for " + std::string(family.model_type) + ")");
  if (!local && !named)
    r.fail(m.count_key, "missing (the number of experts per layer)", "point megadsl at the model's own config.json or add the key");
  s.experts = local ? r.integer(*local, "num_local_experts", 1) : r.integer(*named, both ? "num_experts" : m.count_key, 1);
  // HunYuan's moe_topk may list one per layer: megadsl's mixture has one top-k for every layer.
  s.top_k = r.optional<std::int64_t>(stated(m.top_k_key, m.top_k_alias), m.top_k, [&](const json& v, std::string_view k) {
    if (!v.is_array()) return r.integer(v, k, 1);
    if (v.empty() || static_cast<std::int64_t>(v.size()) != s.layers.get())
      r.fail(k, "is " + describe_json(v) + ", expected one number or one per layer (" + std::to_string(s.layers.get()) + ")",
             "give one top-k");
    const std::int64_t first = r.integer(v.front(), k, 1);
    for (const json& e : v)
      if (r.integer(e, k, 1) != first)
        r.fail(k, "differs between layers (" + describe_json(v) + "); megadsl's mixture has one top-k for every layer",
               "this checkpoint is not supported yet");
    return first;
  });
  if (m.shared_as_wide_as_ffn) s.shared_expert_ffn = s.ffn;  // HunYuan's shared_mlp: intermediate_size
  if (m.experts_as_wide_as_ffn) {
    s.expert_ffn = 0;  // intermediate_size
    s.norm_topk = !m.reads_norm_topk ||
                  r.optional<bool>("norm_topk_prob", m.norm_topk, [&](const json& v, std::string_view k) { return r.boolean(v, k); });
    return;
  }
  s.expert_ffn = r.optional<std::int64_t>(m.expert_ffn_key, m.expert_ffn,
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  s.norm_topk = m.reads_norm_topk ? r.optional<bool>("norm_topk_prob", m.norm_topk,
                                                     [&](const json& v, std::string_view k) { return r.boolean(v, k); })
                                  : m.norm_topk;
  if (has_shared_expert(s) && !m.shared_count_key.empty())
    s.shared_expert_ffn = s.expert_ffn.get() * r.optional<std::int64_t>(m.shared_count_key, m.shared_count,
        [&](const json& v, std::string_view k) { return r.integer(v, k, m.shared_count_least); });
  else if (m.shared_as_wide_as_experts)
    s.shared_expert_ffn = s.expert_ffn;  // Llama 4's shared expert: intermediate_size, as each expert
  else if (has_shared_expert(s))
    s.shared_expert_ffn = r.optional<std::int64_t>("shared_expert_intermediate_size", m.shared_expert_ffn,
        [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  // DeepSeek's grouped sigmoid router (the composition's expert bias; ERNIE's biased softmax router,
  // whose keys have the floor, has none of these).
  if (has_geometry(s, &geo::expert_vector) && m.sum_floor_key.empty()) {
    s.routed_scale = r.optional<double>("routed_scaling_factor", m.routed_scale, [&](const json& v, std::string_view k) { return r.number(v, k); });
    s.expert_groups = r.optional<std::int64_t>("n_group", m.groups, [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
    s.group_top_k = r.optional<std::int64_t>("topk_group", m.group_top_k, [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  }
  s.topk_sum_floor = 0.0;
  if (!m.sum_floor_key.empty()) {  // ERNIE's moe_norm_min: the renormalising sum's floor
    s.topk_sum_floor = r.optional<double>(m.sum_floor_key, m.sum_floor, [&](const json& v, std::string_view k) { return r.number(v, k); });
    if (!(s.topk_sum_floor.get() >= 0))
      r.fail(m.sum_floor_key, "is " + show(s.topk_sum_floor) + ": the top-k weights are divided by max(sum, it)",
             "give a small positive floor (ERNIE 4.5's is 1e-12)");
  }
  if (m.every_layer) {  // no dense layer (Qwen3.5-MoE's config class has no key for one)
    s.sparse_step = 1;
    s.dense_layers = 0;
    return;
  }
  if (!m.dense_first_key.empty()) {  // the first k layers dense, the rest sparse
    const std::int64_t k = r.optional<std::int64_t>(m.dense_first_key, m.dense_first,
        [&](const json& v, std::string_view key) { return r.integer(v, key, 0); });
    if (k >= 63 && s.layers.get() > 63)
      r.fail(m.dense_first_key, "is " + std::to_string(k) + "; megadsl marks dense layers among the first 63 only",
             "this checkpoint is not supported yet");
    s.sparse_step = 1;
    const std::int64_t dense = std::min(k, s.layers.get());  // (transformers: layer i is dense when i < k)
    s.dense_layers = dense >= 63 ? std::numeric_limits<std::int64_t>::max() : (std::int64_t{1} << dense) - 1;
    return;
  }
  // Dense layers among the sparse ones: a layer is sparse when it is not in mlp_only_layers and
  // (i + 1) % decoder_sparse_step == 0; the dense ones have a gated MLP of intermediate_size.
  s.sparse_step = r.optional<std::int64_t>(m.sparse_step_key, 1,
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); }, /*note=*/false);
  std::int64_t dense = 0;
  if (!m.sparse_first_key.empty()) {  // ERNIE: the layers outside [start, end] dense
    const std::int64_t first = r.optional<std::int64_t>(m.sparse_first_key, m.sparse_first,
        [&](const json& v, std::string_view k) { return r.integer(v, k, 0); });
    std::int64_t last = r.optional<std::int64_t>(m.sparse_last_key, -1,
        [&](const json& v, std::string_view k) { return r.integer(v, k, -1); });
    if (last == -1) last = s.layers.get() - 1;  // (the config class's __post_init__)
    // (Bits only where the step alone would route: one model, one shape, whatever range says it.)
    for (std::int64_t i = 0; i < s.layers.get(); ++i) {
      if ((i >= first && i <= last) || (i + 1) % s.sparse_step.get() != 0) continue;
      if (i >= 63)
        r.fail(i > last ? m.sparse_last_key : m.sparse_first_key,
               "leaves layer " + std::to_string(i) + " dense; megadsl marks dense layers among the first 63 only",
               "this checkpoint is not supported yet");
      dense |= std::int64_t{1} << i;
    }
    s.dense_layers = dense;
    return;
  }
  if (!m.sparse_layers_key.empty()) {  // Llama 4: moe_layers lists the sparse layers, overriding the step
    const json* listed = r.find(root, m.sparse_layers_key);
    if (listed == nullptr || listed->is_null()) {
      s.dense_layers = 0;
      return;
    }
    if (!listed->is_array())
      r.fail(m.sparse_layers_key, "expected a list of layer indices, got " + describe_json(*listed), "write e.g. [1, 3, 5]");
    std::vector<bool> sparse(static_cast<std::size_t>(s.layers.get()), false);
    for (const json& e : *listed) {
      const std::int64_t i = r.integer(e, m.sparse_layers_key, 0);
      if (i < s.layers.get()) sparse[static_cast<std::size_t>(i)] = true;  // no such layer: transformers matches none either
    }
    // The list the step gives (Llama4TextConfig writes it so): the step alone says it.
    bool stepped = true;
    for (std::int64_t i = 0; i < s.layers.get(); ++i)
      stepped = stepped && sparse[static_cast<std::size_t>(i)] == ((i + 1) % s.sparse_step.get() == 0);
    if (stepped) {
      s.dense_layers = 0;
      return;
    }
    s.sparse_step = 1;
    for (std::int64_t i = 0; i < s.layers.get(); ++i) {
      if (sparse[static_cast<std::size_t>(i)]) continue;
      if (i >= 63)
        r.fail(m.sparse_layers_key, "leaves layer " + std::to_string(i) + " dense; megadsl marks dense layers among the first 63 only",
               "this checkpoint is not supported yet");
      dense |= std::int64_t{1} << i;
    }
    s.dense_layers = dense;
    return;
  }
  if (const json* only = r.find(root, "mlp_only_layers")) {
    if (!only->is_array())
      r.fail("mlp_only_layers", "expected a list of layer indices, got " + describe_json(*only), "write e.g. [] or [0, 3]");
    for (const json& e : *only) {
      const std::int64_t i = r.integer(e, "mlp_only_layers", 0);
      if (i >= s.layers.get()) continue;  // no such layer: transformers matches none either
      if (i >= 63)
        r.fail("mlp_only_layers", "lists layer " + std::to_string(i) + "; megadsl marks dense layers among the first 63 only",
               "this checkpoint is not supported yet");
      dense |= std::int64_t{1} << i;
    }
  }
  s.dense_layers = dense;
}

}  // namespace

std::string_view hf_key_of(std::string_view field) {
  for (const auto& k : key_names)
    if (k.field == field) return k.hf;
  return field;
}

namespace {

// The multimodal checkpoints whose text model megadsl reads (hf_config::wrapper): their classes
// tie the LM head to the embedding by their own (top-level) tie_word_embeddings, with this default.
struct multimodal_class {
  std::string_view model_type, hf_class;
  bool tie_default;
};
constexpr multimodal_class multimodal_classes[] = {
    {"qwen3_5", "Qwen3_5ForConditionalGeneration", false},
    {"qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", false},
    {"gemma3", "Gemma3ForConditionalGeneration", true},
    {"llama4", "Llama4ForConditionalGeneration", false},
};

hf_config parse_config_object(const json& root, const std::filesystem::path& file, const std::string& key_prefix);

// `root` is a multimodal checkpoint's config (model_type `mm`) with a family's text_config: the
// text model's config, its LM head tied as the multimodal class ties it.
hf_config parse_multimodal(const json& root, const json& text, const multimodal_class& mm,
                           const std::filesystem::path& file) {
  hf_config out = parse_config_object(text, file, "text_config.");
  out.wrapper = std::string(mm.model_type);
  std::vector<std::string> notes;
  reader r(root, file.string(), notes);
  const json* tie = r.find(root, "tie_word_embeddings");
  const bool tied = tie != nullptr ? r.boolean(*tie, "tie_word_embeddings") : mm.tie_default;
  if (tied != out.s.tie_embeddings.get())
    out.notes.push_back(std::string("text_config.tie_word_embeddings is ") + (out.s.tie_embeddings.get() ? "true" : "false") +
                        ", but " + std::string(mm.hf_class) + " ties its LM head by the top level's (" +
                        (tied ? "true" : "false") + "): using that");
  out.s.tie_embeddings = tied;
  out.notes.push_back("a multimodal checkpoint (" + std::string(mm.hf_class) + "): megadsl reads and trains its text model (" +
                      out.model_type + ", text_config); the vision tower is carried, not run");
  return out;
}

}  // namespace

hf_config parse_hf_config(std::string_view json_text, const std::filesystem::path& file) {
  const json root = parse_json_bounded(json_text, 16 << 20, [&](const std::string& problem) {
    throw config_error("megadsl: " + file.string() + ": " + problem + "; fix the file (an HF config.json is one JSON object)");
  });
  return parse_config_object(root, file, "");
}

namespace {

hf_config parse_config_object(const json& root, const std::filesystem::path& file, const std::string& key_prefix) {
  hf_config out;
  out.file = file;
  const std::string fname = file.string();
  reader r(root, fname, out.notes, key_prefix);
  if (!root.is_object())
    r.fail("", "expected a JSON object, got " + describe_json(root), "an HF config.json is one JSON object");

  const json* mt = r.find(root, "model_type");
  std::string types, names;  // "llama", "mistral", ... or "qwen3_moe"; what they read, for the fix
  const std::vector<const family_config*>& families = known_families();
  for (std::size_t i = 0; i < families.size(); ++i) {
    types += (i == 0 ? "" : i + 1 == families.size() ? " or " : ", ") + std::string("\"") +
             std::string(families[i]->model_type) + "\"";
    names += (i == 0 ? "" : ", ") + std::string(families[i]->display);
  }
  if (!mt) r.fail("model_type", "missing", "megadsl reads model_type " + types + ": add the model's");
  if (!mt->is_string())
    r.fail("model_type", "expected a string, got " + describe_json(*mt), "use " + types);
  out.model_type = mt->get<std::string>();
  const family_config* fam = family_named(out.model_type);
  // A multimodal checkpoint whose text model is a family (Qwen3.5's, Llama 4's and Gemma 3's as
  // published): megadsl reads and trains the text model.
  if (const json* text = r.find(root, "text_config"); fam == nullptr && text != nullptr && text->is_object()) {
    const auto it = text->find("model_type");
    const bool family = it != text->end() && it->is_string() && family_named(it->get<std::string>()) != nullptr;
    for (const multimodal_class& mm : multimodal_classes)
      if (family && key_prefix.empty() && out.model_type == mm.model_type) return parse_multimodal(root, *text, mm, file);
    if (family)
      r.fail("model_type", "\"" + printable(out.model_type) + "\" is a multimodal checkpoint, its text model (text_config) a \"" +
                               printable(it->get<std::string>()) + "\", but megadsl reads the text models of \"qwen3_5\", \"qwen3_5_moe\", "
                               "\"gemma3\" and \"llama4\" checkpoints only (whose classes it knows run the text model as it is)",
             "save the text model alone with transformers (<Class>.from_pretrained(dir).language_model, or "
             ".model.language_model, .save_pretrained(out)) and give megadsl that");
  }
  if (fam == nullptr)
    r.fail("model_type", "\"" + printable(out.model_type) + "\" is not a family megadsl composes",
           "megadsl reads model_type " + types + " (" + names + ")");

  // Architecture switches the family's blocks do not have: refuse rather than mis-load.
  // The activation is the family's composition's (or the family's legacy spelling of it: Gemma's
  // "gelu" is transformers' old name of the tanh approximation, which it rewrites).
  const activation family_act = fam->arch->act;
  const bool tanh = family_act == activation::gelu_tanh;
  // (A composition whose MLPs apply no activation of HF's `hidden_act` has its own in its block.)
  for (std::string_view key : {std::string_view("hidden_act"), std::string_view("hidden_activation")}) {
    const json* act = fam->arch->has_act ? r.find(root, key) : nullptr;
    if (act == nullptr || (key == "hidden_activation" && act->is_null())) continue;
    const std::string a = act->is_string() ? act->get<std::string>() : std::string();
    const std::string_view hf_name = tanh ? "gelu_pytorch_tanh" : family_act == activation::gelu ? "gelu"
                                     : family_act == activation::xielu ? "xielu" : "silu";
    const bool ok = (!fam->legacy_activation.empty() && a == fam->legacy_activation) || a == hf_name;
    if (!ok)
      r.fail(key, "is " + describe_json(*act) + "; the " + std::string(fam->model_type) + " family's MLP uses " +
                      (tanh ? "GELU with the tanh approximation" : family_act == activation::gelu ? "the exact GELU"
                       : family_act == activation::xielu ? "xIELU (with its learned scalars)" : "SiLU"),
             "only \"" + std::string(hf_name) + "\" is supported");
  }
  for (const required_key& k : fam->required)
    if (const json* b = r.find(root, k.key); b && !r.boolean(*b, k.key))
      r.fail(k.key, "is false; the " + std::string(fam->model_type) + " composition has " + std::string(k.what),
             "this checkpoint is not supported yet; " + std::string(fam->display) + " checkpoints have it true");

  out.ignored_tensors = fam->ignored_tensors;
  if (!fam->mtp_key.empty())
    out.mtp_layers = r.optional<std::int64_t>(fam->mtp_key, 1, [&](const json& v, std::string_view k) { return r.integer(v, k, 0); });

  shape& s = out.s;
  s.hidden = r.required_int("hidden_size", "the model width");
  s.layers = r.required_int("num_hidden_layers", "the number of decoder layers");
  s.heads = r.required_int("num_attention_heads", "the number of query heads");
  s.kv_heads = r.optional<std::int64_t>("num_key_value_heads", s.heads.get(),
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  s.ffn = r.required_int(fam->ffn_key, "the MLP width");
  s.vocab = r.required_int("vocab_size", "the vocabulary size");
  s.head_dim = r.optional<std::int64_t>("head_dim", fam->head_dim,
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); }, /*note=*/fam->head_dim != 0);
  s.max_positions = r.optional<std::int64_t>("max_position_embeddings", fam->max_positions,
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  s.rms_eps = r.optional<double>(fam->eps_key, fam->rms_eps,
      [&](const json& v, std::string_view k) { return r.number(v, k); });
  double local_theta = 0;
  rope_read rope = fam->local_rope_theta != 0 ? read_rope_per_layer_type(r, *fam, local_theta) : read_rope(r);
  if (!fam->rope_must_be_stated.empty()) {
    const json* params = r.find(root, "rope_parameters");
    const json* legacy = r.find(root, "rope_scaling");
    if ((params == nullptr || params->is_null()) && (legacy == nullptr || !legacy->is_object()))
      r.fail("rope_parameters", "missing (and no rope_scaling): " + std::string(fam->rope_must_be_stated),
             "write the checkpoint's RoPE as transformers 5 does: \"rope_parameters\": {\"rope_type\": ..., \"rope_theta\": ...}");
  }
  // 4.x configs may name the theta otherwise (NeoX's rotary_emb_base) and keep the rotated share
  // at the top level (NeoX's rotary_pct, 0.25 by default; Phi-3's partial_rotary_factor).
  auto agree_with = [&](std::optional<double>& slot, std::string_view key, std::string_view what) {
    const json* v = r.find(root, key);
    if (v == nullptr) return;
    const double x = r.number(*v, key);
    if (slot && !close(*slot, x))
      r.fail(key, "is " + show(x) + " but rope_parameters says " + show(*slot), "keep one " + std::string(what));
    slot = x;
  };
  if (!fam->theta_key.empty()) agree_with(rope.theta, fam->theta_key, "theta");
  if (!fam->partial_rotary_key.empty()) {
    agree_with(rope.partial, fam->partial_rotary_key, "partial rotary share");
    if (!rope.partial && fam->partial_rotary_default != 1.0) rope.partial = fam->partial_rotary_default;
  }
  s.rotary_fraction = rope.partial.value_or(1.0);
  if (fam->partial_rotary_key.empty() && s.rotary_fraction.get() != 1.0)
    r.fail("rope_parameters.partial_rotary_factor", "is " + show(s.rotary_fraction.get()) + ": transformers' " +
               std::string(fam->model_type) + " attention rotates the whole head and ignores it",
           "remove it (the " + std::string(fam->model_type) + " checkpoints transformers writes do not have it)");
  if (rope.theta) s.rope_theta = *rope.theta;
  else {
    s.rope_theta = fam->rope_theta;
    out.notes.push_back("rope_theta not in config.json: using " + show(fam->rope_theta) + " (transformers' default)");
  }
  s.rope = rope.scaling;
  s.local_rope_theta = local_theta;
  if (fam->ntk_alpha_rope && s.rope.type.get() == rope_type::dynamic_ntk) {
    // HunYuan's fixed-alpha NTK ("dynamic" with an alpha): the base stretched once,
    // theta * alpha^(d / (d - 2)), as transformers computes it in Python floats; plain RoPE on it.
    const json* params = r.find(root, "rope_parameters");
    if (params == nullptr || !params->is_object()) params = r.find(root, "rope_scaling");
    const json* a = params != nullptr && params->is_object() ? r.find(*params, "alpha") : nullptr;
    if (a != nullptr && !a->is_null()) {
      const double alpha = r.number(*a, "rope_parameters.alpha");
      const double d = static_cast<double>(effective_head_dim(s).get());
      if (!(alpha > 0) || d <= 2)
        r.fail("rope_parameters.alpha", "is " + show(alpha) + " with head_dim " + show(d), "use a positive alpha and head_dim > 2");
      const double base = s.rope_theta.get() * std::pow(alpha, d / (d - 2));
      out.notes.push_back("rope_parameters: \"dynamic\" with alpha " + show(alpha) + " is HunYuan's fixed NTK-alpha RoPE: "
                          "plain RoPE with base " + show(base) + " (written back so)");
      s.rope_theta = base;
      s.rope = {};
    }
  }
  const auto flag = [&](std::string_view key, bool fallback, bool note) {
    return r.optional<bool>(key, fallback, [&](const json& v, std::string_view k) { return r.boolean(v, k); }, note);
  };
  switch (fam->bias) {
    case bias_rule::fixed:
      s.qkv_bias = fam->qkv_bias;
      s.out_bias = fam->out_bias;
      break;
    case bias_rule::attention_bias:  // LlamaAttention's q, k, v and o_proj biases (o_proj's after the reduction)
      s.qkv_bias = s.out_bias = flag("attention_bias", false, /*note=*/false);
      break;
    case bias_rule::attention_bias_on:  // gpt-oss's: the same, on unless said
      s.qkv_bias = s.out_bias = flag("attention_bias", true, /*note=*/true);
      break;
    case bias_rule::use_bias:  // StarCoder2's: q, k, v, o_proj and the MLP's
      s.qkv_bias = s.out_bias = flag("use_bias", true, /*note=*/true);
      break;
    case bias_rule::qkv_bias:  // Qwen2-MoE's: q, k and v
      s.qkv_bias = flag("qkv_bias", true, /*note=*/false);
      s.out_bias = false;
      break;
    case bias_rule::attention_and_out_bias:  // Seed-OSS's: q, k, v by attention_bias, o_proj by attention_out_bias
      s.qkv_bias = flag("attention_bias", true, /*note=*/true);
      s.out_bias = flag("attention_out_bias", false, /*note=*/false);
      break;
    case bias_rule::attention_bias_qkv:  // GLM-4.5's: q, k and v; o_proj never
      s.qkv_bias = flag("attention_bias", false, /*note=*/false);
      s.out_bias = false;
      break;
    case bias_rule::use_bias_all:  // ERNIE 4.5's: q, k, v, o_proj and gate/up/down
      s.qkv_bias = s.out_bias = s.mlp_bias = flag("use_bias", false, /*note=*/false);
      break;
    case bias_rule::attention_bias_qkv_on:  // GLM-4's: q, k and v, on unless said; o_proj never
      s.qkv_bias = flag("attention_bias", true, /*note=*/true);
      s.out_bias = false;
      break;
  }
  // Llama's mlp_bias: biases on gate_proj, up_proj and down_proj (LlamaMLP).
  if (fam->bias != bias_rule::use_bias_all) s.mlp_bias = fam->reads_mlp_bias && flag("mlp_bias", false, /*note=*/false);
  if (fam->interleaved_rope) s.rope_interleave = true;  // the family's rotation, not a key
  s.tie_embeddings = flag("tie_word_embeddings", fam->tie_embeddings, /*note=*/false);
  // Gemma2's score scale and soft-caps (null: no cap); 0 = off in every other family.
  s.query_pre_attn_scalar = s.attn_softcap = s.final_softcap = 0.0;
  if (fam->score_caps) {
    s.query_pre_attn_scalar = r.optional<double>("query_pre_attn_scalar", 256.0,
        [&](const json& v, std::string_view k) { return r.number(v, k); });
    auto cap = [&](std::string_view key, double fallback) {
      const auto it = root.find(std::string(key));
      if (it != root.end() && it->is_null()) return 0.0;  // None: no soft-cap
      return r.optional<double>(key, fallback, [&](const json& v, std::string_view k) { return r.number(v, k); });
    };
    s.attn_softcap = cap("attn_logit_softcapping", fam->attn_softcap_default);
    s.final_softcap = cap("final_logit_softcapping", fam->final_softcap_default);
  }
  // Granite's multipliers (their neutral values in every other family: the shape's defaults).
  if (fam->multipliers) {
    const auto number = [&](std::string_view key) {
      return r.optional<double>(key, 1.0, [&](const json& v, std::string_view k) { return r.number(v, k); });
    };
    s.embedding_multiplier = number("embedding_multiplier");
    s.residual_multiplier = number("residual_multiplier");
    s.attention_multiplier = number("attention_multiplier");
    s.logits_scaling = number("logits_scaling");
    if (s.logits_scaling.get() == 0)
      r.fail("logits_scaling", "is 0: the logits are divided by it", "give the checkpoint's value (Granite 3's is 16.0 or 8.0)");
    if (s.attention_multiplier.get() == 0)
      r.fail("attention_multiplier", "is 0: every score would be 0 and attention uniform",
             "give the checkpoint's value (Granite 3's is 1/head_dim, e.g. 0.0078125)");
  }
  // Cohere's logit_scale (multiplied): 1 in every other family.
  if (fam->reads_logit_scale)
    s.logit_scale = r.optional<double>("logit_scale", fam->logit_scale_default,
                                       [&](const json& v, std::string_view k) { return r.number(v, k); });
  s.arch = fam->arch;
  read_block_settings(r, *fam->arch, s);
  if (fam->moe != nullptr) read_experts(r, *fam, s);

  if (fam->reads_no_rope_layers) read_no_rope_layers(r, s, fam->empty_no_rope_is_default);
  s.attention_chunk = 0;  // Llama 4's, read by its blocks only
  s.qk_l2_norm = false;
  s.attn_floor_scale = s.attn_scale = 0.0;
  if (fam->llama4_attention) read_llama4_attention(r, s);
  // Weighted per-head q/k norms: GLM-4.5's RMS norms, Command R+'s LayerNorms (off by default, as
  // Glm4MoeConfig and CohereConfig have them).
  s.use_qk_norm = fam->reads_use_qk_norm &&
                  r.optional<bool>("use_qk_norm", false, [&](const json& v, std::string_view k) { return r.boolean(v, k); });
  s.linear_layers = s.linear_key_heads = s.linear_value_heads = s.linear_key_dim = s.linear_value_dim = 0;
  s.linear_conv_kernel = 0;  // Qwen3-Next's, read by its blocks only
  if (fam->linear_attention) read_linear_attention(r, s);
  if (fam->mla != nullptr) read_mla(r, *fam->mla, s);
  out.attention_window = read_attention_window(r, *fam, s);
  out.dropout = read_dropout(r, *fam, out.notes);
  // EXAONE 4: with a window set, the full layers have no RoPE; Cohere2: RoPE on the sliding layers
  // only (with every layer full, none rotates).
  if (fam->nope_on_full_layers || fam->rope_only_sliding) {
    const json* w = r.find(root, "sliding_window");
    std::int64_t nope = 0;
    if (fam->rope_only_sliding || (w != nullptr && !w->is_null()))
      for (std::int64_t i = 0; i < s.layers.get(); ++i)
        if (out.attention_window.of(i) == 0) {
          if (i >= 64)
            r.fail("layer_types", "makes layer " + std::to_string(i) + " a full layer without RoPE; megadsl marks NoPE layers among the first 64 only",
                   "this checkpoint is not supported yet");
          nope |= static_cast<std::int64_t>(std::uint64_t{1} << i);
        }
    s.nope_layers = nope;
  }
  check_keys(r, *fam, out.notes);
  return out;
}

}  // namespace

hf_config read_hf_config(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(path, ec)) {
    file = path / "config.json";
    if (!fs::exists(file, ec))
      throw config_error("megadsl: " + path.string() +
                         " has no config.json; pass an HF model directory (one with config.json) or "
                         "the config.json itself");
  } else if (!fs::exists(path, ec)) {
    throw config_error("megadsl: " + path.string() +
                       ": no such file or directory; pass an HF model directory or its config.json");
  }
  // Checked before opening: a FIFO would block the open, a device be read without end.
  if (!fs::is_regular_file(file, ec))
    throw config_error("megadsl: " + file.string() + ": is not a regular file (a FIFO, a device or a directory); "
                       "pass an HF model directory or its config.json");
  if (fs::file_size(file, ec) > (16u << 20))
    throw config_error("megadsl: " + file.string() + ": is " + std::to_string(fs::file_size(file, ec)) +
                       " bytes, more than a config.json can plausibly be (16 MiB); pass the model's config.json");
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw config_error("megadsl: " + file.string() + ": cannot be opened for reading; check its permissions");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_hf_config(text.str(), file);
}

std::vector<std::string> mismatches(const shape& declared, const shape& config, std::string_view file) {
  std::vector<std::string> out;
  auto report = [&](std::string_view field, const std::string& d, const std::string& c) {
    out.push_back(std::string(field) + " (" + std::string(hf_key_of(field)) + "): declared " + d + ", " +
                  std::string(file) + " has " + c);
  };
  // head_dim 0 means hidden / heads, so compare what each side means.
  shape sizes = declared;
  fill(sizes.hidden, config.hidden);
  fill(sizes.heads, config.heads);
  hana::for_each(hana::keys(declared), [&](auto key) {
    const std::string_view field = hana::to<char const*>(key);
    const auto& d = hana::at_key(declared, key);
    const auto& c = hana::at_key(config, key);
    if constexpr (std::is_same_v<std::decay_t<decltype(d)>, rope_scaling>) {
      hana::for_each(hana::keys(d), [&](auto rkey) {
        const std::string name = "rope." + std::string(hana::to<char const*>(rkey));
        const auto& rd = hana::at_key(d, rkey);
        const auto& rc = hana::at_key(c, rkey);
        const std::string_view sub = std::string_view(name).substr(5);
        if (rope_field_used(sub, d.type) && rope_field_used(sub, c.type) && !agree(rd, rc))
          report(name, show(rd), show(rc));
      });
    } else if (field == "head_dim") {
      if constexpr (std::is_same_v<std::decay_t<decltype(d)>, dim>) {
      if (d.is_dynamic() || c.is_dynamic()) return;
      const dim de = effective_head_dim(sizes);
      const dim ce = effective_head_dim(config);
      // Both 0: a difference follows from hidden or heads, which are reported themselves.
      if (de.is_static() && ce.is_static() && de.get() != ce.get() && (d.get() != 0 || c.get() != 0))
        report(field, show(d) + (d.get() == 0 ? " (= hidden / heads = " + show(de) + ")" : ""),
               show(c) + (c.get() == 0 ? " (= hidden / heads = " + show(ce) + ")" : ""));
      }
    } else if (!agree(d, c)) {
      report(field, show(d), show(c));
    }
  });
  // The blocks' own keys: what each side means (its value, or the block's default).
  if (!declared.settings.dynamic && !config.settings.dynamic && declared.arch != nullptr && declared.arch == config.arch)
    for (const config_setting& c : declared.arch->settings)
      if (setting(declared, c.key) != setting(config, c.key))
        out.push_back(std::string(c.key) + " (a block's own key): declared " + format_double(setting(declared, c.key)) + ", " +
                      std::string(file) + " has " + format_double(setting(config, c.key)));
  if (declared.arch != nullptr && config.arch != nullptr && declared.arch != config.arch)
    out.push_back("architecture (model_type): declared " + std::string(declared.arch->name) + ", " + std::string(file) +
                  " has " + std::string(config.arch->name));
  return out;
}

shape resolve(const shape& declared, const shape& config, std::string_view file, std::string_view model_name) {
  // Each field names the file by its base name; the head of the message gives the full path.
  const std::string base = std::filesystem::path(file).filename().string();
  const std::vector<std::string> bad = mismatches(declared, config, base.empty() ? file : base);
  if (!bad.empty()) {
    std::string m = "megadsl: " + std::string(model_name) + " does not match " + std::string(file) + ": ";
    for (std::size_t i = 0; i < bad.size(); ++i) m += (i ? "; " : "") + bad[i];
    m += "; fix: use the model that matches this checkpoint (megadsl presets lists them), or declare "
         "these fields `dynamic` so that config.json supplies them";
    throw config_error(m);
  }
  shape out = declared;
  hana::for_each(hana::keys(out), [&](auto key) {
    auto& d = hana::at_key(out, key);
    const auto& c = hana::at_key(config, key);
    fill(d, c);
  });
  if (out.arch == nullptr) out.arch = config.arch;
  if (out.settings.dynamic) out.settings = config.settings;
  return out;
}

std::string to_string(const shape& s) {
  std::string out = "shape{";
  bool first = true;
  hana::for_each(hana::keys(s), [&](auto key) {
    const auto& v = hana::at_key(s, key);
    out += first ? "." : ", .";
    first = false;
    out += hana::to<char const*>(key);
    out += " = ";
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, rope_scaling>) {
      out += "{";
      bool rfirst = true;
      hana::for_each(hana::keys(v), [&](auto rkey) {
        const std::string_view name = hana::to<char const*>(rkey);
        if (!rope_field_used(name, v.type)) return;
        out += rfirst ? "." : ", .";
        rfirst = false;
        out += std::string(name) + " = " + show(hana::at_key(v, rkey));
      });
      out += "}";
    } else {
      out += show(v);
    }
  });
  if (s.arch != nullptr && !s.settings.dynamic)
    for (const config_setting& c : s.arch->settings) out += ", ." + std::string(c.key) + " = " + format_double(setting(s, c.key));
  return out + ", .arch = " + (s.arch != nullptr ? std::string(s.arch->name) : std::string("dynamic")) + "}";
}

dropout_rates dropout_with(const hf_config& cfg, const std::vector<std::pair<std::string, double>>& keys) {
  const family_config* fam = family_named(cfg.model_type);
  if (fam == nullptr) throw config_error("megadsl: dropout_with: \"" + printable(cfg.model_type) + "\" is no family");
  dropout_rates out = cfg.dropout;
  for (const auto& [key, p] : keys) {
    const dropout_key* k = dropout_key_named(*fam, key);
    if (k == nullptr) {
      std::string known;
      for (const dropout_key& d : dropout_keys_of(*fam)) known += (known.empty() ? "" : ", ") + std::string(d.key);
      throw config_error("megadsl: " + cfg.file.string() + ": \"" + printable(key) + "\" is not a dropout key of " +
                         std::string(fam->display) + " (" + cfg.model_type + "); its are " + (known.empty() ? "none" : known));
    }
    if (!(p >= 0.0 && p < 1.0))
      throw config_error("megadsl: " + cfg.file.string() + ": " + key + " = " + format_double(p) +
                         " is not a dropout probability; give a number in [0, 1) (0.0: no dropout)");
    if (k->attention) out.attention = p;
    if (k->residual) out.residual = p;
    if (k->embedding) out.embedding = p;
  }
  return out;
}

std::string describe(const dropout_rates& r) {
  std::string out;
  for (const auto& [place, rate] : {std::pair<const char*, double>{"attention", r.attention}, {"residual", r.residual},
                                    {"embedding", r.embedding}})
    if (rate != 0.0) out += (out.empty() ? "" : ", ") + std::string(place) + " dropout " + format_double(rate);
  return out.empty() ? "no dropout" : out;
}

std::string describe(const sliding_window& w) {
  if (!w.any()) return "no sliding window";
  std::string out = "a window of " + std::to_string(w.size) + " tokens on ";
  if (w.layers.empty() || w.every_layer()) return out + "every layer";
  out += "layers ";
  int shown = 0;
  for (std::size_t i = 0; i < w.layers.size(); ++i)
    if (w.layers[i]) {
      if (shown == 6) return out + ", ...";
      out += (shown++ ? ", " : "") + std::to_string(i);
    }
  return out;
}

namespace {

// ERNIE's range of sparse layers: the first and the last that route (none: layers, layers - 1).
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
  if (family.rope_only_sliding)
    for (std::int64_t i = 0; i < s.layers.get(); ++i)
      if (nope_layer(s, i) != (window.of(i) == 0))
        return "a " + f + " config rotates exactly the sliding layers, and this model's NoPE layers differ";
  if (family.nope_on_full_layers)
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
  if (!family.multipliers && (s.embedding_multiplier.get() != 1 || s.residual_multiplier.get() != 1 ||
                              s.attention_multiplier.get() != 0 || s.logits_scaling.get() != 1))
    return "a " + f + " config has none of Granite's multipliers, and this model has them (embedding_multiplier " +
           show(s.embedding_multiplier) + ", residual_multiplier " + show(s.residual_multiplier) + ", attention_multiplier " +
           show(s.attention_multiplier) + ", logits_scaling " + show(s.logits_scaling) + ")";
  if (!family.reads_logit_scale && s.logit_scale.get() != 1)
    return "a " + f + " config does not scale the logits, and this model multiplies them by " + show(s.logit_scale);
  const std::string biases = "qkv_bias " + show(s.qkv_bias) + " and out_bias " + show(s.out_bias);
  switch (family.bias) {
    case bias_rule::fixed:
      if (s.qkv_bias.get() != family.qkv_bias)
        return family.qkv_bias ? "a " + f + " config always has the q/k/v bias, and this model has none"
                               : "a " + f + " config has no q/k/v bias, and this model has one";
      if (s.out_bias.get() != family.out_bias)
        return family.out_bias ? "a " + f + " config has biases on o_proj and the MLP, and this model has none"
                               : "a " + f + " config cannot express o_proj and MLP biases";
      break;
    case bias_rule::attention_bias:
    case bias_rule::attention_bias_on:
      if (s.qkv_bias.get() != s.out_bias.get())
        return "a " + f + " config's attention_bias puts biases on q/k/v and o_proj alike; this model has " + biases;
      break;
    case bias_rule::use_bias:
      if (s.qkv_bias.get() != s.out_bias.get())
        return "a " + f + " config has one use_bias for q/k/v, o_proj and the MLP; this model has " + biases;
      break;
    case bias_rule::qkv_bias:
      if (s.out_bias.get()) return "a " + f + " config cannot express o_proj and MLP biases";
      break;
    case bias_rule::attention_and_out_bias: break;  // attention_bias and attention_out_bias say both
    case bias_rule::attention_bias_qkv:
    case bias_rule::attention_bias_qkv_on:
      if (s.out_bias.get()) return "a " + f + " config has no o_proj bias, and this model has one";
      break;
    case bias_rule::use_bias_all:
      if (s.qkv_bias.get() != s.out_bias.get() || s.qkv_bias.get() != s.mlp_bias.get())
        return "a " + f + " config has one use_bias for q/k/v, o_proj and the MLP; this model has " + biases +
               " and mlp_bias " + show(s.mlp_bias);
      break;
  }
  if (family.mla == nullptr && s.rope_interleave.get() != family.interleaved_rope)
    return family.interleaved_rope ? "a " + f + " config rotates interleaved pairs, and this model rotates halves"
                                   : "a " + f + " config rotates each head's halves, and this model rotates interleaved pairs";
  if (s.mlp_bias.get() && !family.reads_mlp_bias && family.bias != bias_rule::use_bias_all)
    return "a " + f + " config cannot express biases on the gated MLP (mlp_bias)";
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
  if (family.llama4_attention && s.attention_chunk.get() < 1)
    return "a " + f + " config chunks the RoPE layers' attention, and this model has no attention_chunk";
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
  if (family.moe != nullptr && family.moe->sum_floor_key.empty() && s.topk_sum_floor.get() != 0)
    return "a " + f + " config renormalises the top-k weights by their sum, and this model floors it at " +
           show(s.topk_sum_floor) + " (ERNIE 4.5's moe_norm_min)";
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
// strictly, and an int field (Gemma's query_pre_attn_scalar, Llama 4's floor_scale) refuses 24.0.
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
    j[std::string(c.key)] = c.kind == setting_kind::flag ? json(v != 0) : c.kind == setting_kind::integer ? int_if_whole(v) : json(v);
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
    // An int in transformers 5's Gemma2Config / Gemma3TextConfig (its strict check refuses 24.0).
    const double scalar = s.query_pre_attn_scalar.get() != 0 ? s.query_pre_attn_scalar.get()
                                                             : static_cast<double>(effective_head_dim(s).get());
    j["query_pre_attn_scalar"] = int_if_whole(scalar);
    j["attn_logit_softcapping"] = s.attn_softcap.get() != 0 ? json(s.attn_softcap.get()) : json(nullptr);
    j["final_logit_softcapping"] = s.final_softcap.get() != 0 ? json(s.final_softcap.get()) : json(nullptr);
  }
  if (fam->reads_logit_scale) j["logit_scale"] = s.logit_scale.get();
  if (fam->multipliers) {  // attention_multiplier 0 (a shape's default): the usual head_dim^-0.5, as Python computes it
    j["embedding_multiplier"] = s.embedding_multiplier.get();
    j["residual_multiplier"] = s.residual_multiplier.get();
    j["attention_multiplier"] = s.attention_multiplier.get() != 0
                                    ? s.attention_multiplier.get()
                                    : std::pow(static_cast<double>(effective_head_dim(s).get()), -0.5);
    j["logits_scaling"] = s.logits_scaling.get();
  }
  switch (fam->bias) {
    case bias_rule::fixed: break;
    case bias_rule::attention_bias:
    case bias_rule::attention_bias_on: j["attention_bias"] = s.qkv_bias.get(); break;
    case bias_rule::use_bias: j["use_bias"] = s.qkv_bias.get(); break;
    case bias_rule::qkv_bias: j["qkv_bias"] = s.qkv_bias.get(); break;
    case bias_rule::attention_and_out_bias:
      j["attention_bias"] = s.qkv_bias.get();
      j["attention_out_bias"] = s.out_bias.get();
      break;
    case bias_rule::attention_bias_qkv:
    case bias_rule::attention_bias_qkv_on: j["attention_bias"] = s.qkv_bias.get(); break;
    case bias_rule::use_bias_all: j["use_bias"] = s.qkv_bias.get(); break;
  }
  for (const dropout_key& k : dropout_keys_of(*fam))
    j[std::string(k.key)] = k.attention ? dropout.attention : k.residual ? dropout.residual : dropout.embedding;
  if (fam->reads_mlp_bias) j["mlp_bias"] = s.mlp_bias.get();
  if (fam->reads_use_qk_norm) j["use_qk_norm"] = s.use_qk_norm.get();
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
      } else if (!m.sparse_first_key.empty()) {  // ERNIE: the step, and the range of sparse layers
        const auto [first, last] = sparse_range(s);
        j[std::string(m.sparse_step_key)] = s.sparse_step.get();
        j[std::string(m.sparse_first_key)] = first;
        j[std::string(m.sparse_last_key)] = last;
      } else if (!m.sparse_layers_key.empty()) {  // Llama 4: the step, and the sparse layers listed
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
      if (!m.sum_floor_key.empty()) j[std::string(m.sum_floor_key)] = s.topk_sum_floor.get();
      if (has_geometry(s, &geo::expert_vector) && m.sum_floor_key.empty()) {  // (DeepSeek's router)
        j["routed_scaling_factor"] = s.routed_scale.get();
        j["n_group"] = s.expert_groups.get();
        j["topk_group"] = s.group_top_k.get();
      }
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
  if (fam->mla != nullptr) {
    j["q_lora_rank"] = s.q_lora_rank.get() > 0 ? json(s.q_lora_rank.get()) : json(nullptr);
    j["kv_lora_rank"] = s.kv_lora_rank.get();
    j["qk_nope_head_dim"] = s.qk_nope_dim.get();
    j["qk_rope_head_dim"] = effective_head_dim(s).get();
    j["v_head_dim"] = s.v_head_dim.get();
    j["rope_interleave"] = s.rope_interleave.get();
  }
  if (fam->reads_no_rope_layers) {
    json rope_layers = json::array();
    for (std::int64_t i = 0; i < layers; ++i) rope_layers.push_back(nope_layer(s, i) ? 0 : 1);
    j["no_rope_layers"] = rope_layers;
  }
  if (fam->llama4_attention) {
    json chunked = json::array();
    for (std::int64_t i = 0; i < layers; ++i) chunked.push_back(nope_layer(s, i) ? "full_attention" : "chunked_attention");
    j["layer_types"] = chunked;
    j["attention_chunk_size"] = s.attention_chunk.get();
    j["use_qk_norm"] = s.qk_l2_norm.get();
    j["attn_temperature_tuning"] = s.attn_floor_scale.get() != 0;
    j["floor_scale"] = int_if_whole(s.attn_floor_scale.get() != 0 ? s.attn_floor_scale.get() : 8192.0);  // an int in Llama4TextConfig
    j["attn_scale"] = s.attn_floor_scale.get() != 0 ? s.attn_scale.get() : 0.1;
  }
  if (fam->linear_attention) {
    json kinds = json::array();
    for (std::int64_t i = 0; i < layers; ++i) kinds.push_back(linear_layer(s, i) ? "linear_attention" : "full_attention");
    j["layer_types"] = kinds;
    j["linear_num_key_heads"] = s.linear_key_heads.get();
    j["linear_num_value_heads"] = s.linear_value_heads.get();
    j["linear_key_head_dim"] = s.linear_key_dim.get();
    j["linear_value_head_dim"] = s.linear_value_dim.get();
    j["linear_conv_kernel_dim"] = s.linear_conv_kernel.get();
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
