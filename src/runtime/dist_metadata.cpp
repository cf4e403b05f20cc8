#include "dist_metadata.hpp"

#include <algorithm>
#include <set>

#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/models/registry.hpp"
#include "megadsl/io/printable.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/runtime/dist_checkpoint.hpp"
#include "../spec/json_bounded.hpp"
#include "megadsl/reflection.hpp"

#include <boost/hana/at_key.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/keys.hpp>
#include <boost/hana/string.hpp>

namespace megadsl {
namespace dist_metadata {

namespace fs = std::filesystem;
namespace hana = boost::hana;
using json = nlohmann::json;

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

box whole(const std::vector<std::int64_t>& shape) {
  return {static_cast<int>(shape.size()), {0, 0}, {shape[0], shape.size() == 2 ? shape[1] : 1}};
}

std::string region_text(const box& b) {
  std::string s;
  for (int d = 0; d < b.rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    s += (d ? " x " : "") + ("[" + std::to_string(b.off[i]) + ", " + std::to_string(b.off[i] + b.len[i]) + ")");
  }
  return s;
}

std::string shape_text(const std::vector<std::int64_t>& v) {
  std::string s = "(";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

namespace {
// Before the architecture was written by name, checkpoints recorded the composition as ten block
// knobs (Llama's, in checkpoints older still); each family's values of them, in this order.
constexpr std::array<std::string_view, 10> knob_keys{"norm", "qk_norm", "mlp_activation", "embed_scale", "residual",
                                                    "hf_storage", "mlp", "names", "expert_naming", "shared_expert"};
struct legacy_family {
  std::string_view model_type;
  std::array<std::string_view, 10> knobs;
};
constexpr legacy_family legacy_families[] = {
    {"llama", {"rms", "none", "silu", "none", "pre_norm", "separate", "gated", "llama", "qwen", "false"}},
    {"qwen3", {"rms", "per_head", "silu", "none", "pre_norm", "separate", "gated", "llama", "qwen", "false"}},
    {"gemma", {"rms_1p", "none", "gelu_tanh", "sqrt_hidden", "pre_norm", "separate", "gated", "llama", "qwen", "false"}},
    {"gemma2", {"rms_1p", "none", "gelu_tanh", "sqrt_hidden", "sandwich", "separate", "gated", "llama", "qwen", "false"}},
    {"olmo2", {"rms_wmul", "full_width", "silu", "none", "post_norm", "separate", "gated", "llama", "qwen", "false"}},
    {"phi3", {"rms", "none", "silu", "none", "pre_norm", "concatenated", "gated", "llama", "qwen", "false"}},
    {"starcoder2", {"layer_norm", "none", "gelu_tanh", "none", "pre_norm", "separate", "plain", "llama", "qwen", "false"}},
    {"gpt_neox", {"layer_norm", "none", "gelu", "none", "parallel", "interleaved", "plain", "gpt_neox", "qwen", "false"}},
    {"mixtral", {"rms", "none", "silu", "none", "pre_norm", "separate", "moe", "llama", "mixtral", "false"}},
    {"qwen2_moe", {"rms", "none", "silu", "none", "pre_norm", "separate", "moe", "llama", "qwen", "true"}},
    {"qwen3_moe", {"rms", "per_head", "silu", "none", "pre_norm", "separate", "moe", "llama", "qwen", "false"}},
};
}  // namespace

json shape_json(const shape& s) {
  json out = json::object();
  hana::for_each(hana::keys(s), [&](auto key) {
    const auto& v = hana::at_key(s, key);
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, rope_scaling>) {
      json r = json::object();
      hana::for_each(hana::keys(v), [&](auto rkey) {
        if (hana::at_key(v, rkey).is_static()) r[hana::to<char const*>(rkey)] = value_json(hana::at_key(v, rkey));
      });
      out[hana::to<char const*>(key)] = r;
    } else if (v.is_static()) {
      out[hana::to<char const*>(key)] = value_json(v);
    }
  });
  // The blocks' own config keys, by key: what each means in this model.
  if (s.arch != nullptr && !s.settings.dynamic && !s.arch->settings.empty()) {
    json settings = json::object();
    for (const config_setting& c : s.arch->settings) settings[std::string(c.key)] = setting(s, c.key);
    out["settings"] = settings;
  }
  return out;
}

namespace {

// Fields added to shape since the first format, and the architecture of the oldest checkpoints.
void fill_shape_fields(json& shape) {
  // The flag's first name (written for a few days in 2026-11, by GLM-4.5's q/k norms only).
  if (shape.contains("qk_rms_norm") && !shape.contains("use_qk_norm")) shape["use_qk_norm"] = shape["qk_rms_norm"];
  shape.erase("qk_rms_norm");
  // Every field added since the first format means by its absence what it meant before it
  // existed: shape{}'s value (and rope_scaling{}'s), derived here so that a new field needs no entry.
  static const json defaults = shape_json(megadsl::shape{});
  for (const auto& [key, value] : defaults.items()) {
    if (key == "rope") {
      if (shape.contains("rope") && shape["rope"].is_object())
        for (const auto& [rkey, rvalue] : value.items())
          if (!shape["rope"].contains(rkey)) shape["rope"][rkey] = rvalue;
    } else if (!shape.contains(key)) {
      shape[key] = value;
    }
  }
  if (shape.contains("architecture")) return;
  // The knobs (Llama's where absent) name the family, whose composition is the architecture.
  static const std::array<std::string_view, 10> llama = legacy_families[0].knobs;
  std::array<std::string, 10> mine;
  for (std::size_t i = 0; i < knob_keys.size(); ++i) {
    const std::string key(knob_keys[i]);
    const json v = shape.contains(key) ? shape[key] : json(std::string(llama[i]));
    mine[i] = v.is_string() ? v.get<std::string>() : v.dump();
    shape.erase(key);
  }
  for (const legacy_family& f : legacy_families) {
    bool same = true;
    for (std::size_t i = 0; i < knob_keys.size(); ++i) same = same && mine[i] == f.knobs[i];
    if (same) {
      shape["architecture"] = std::string(find_family(f.model_type)->arch->name);
      return;
    }
  }
  shape["architecture"] = "(block knobs of no family: " + mine[0] + ", " + mine[4] + ", " + mine[6] + ")";
}

// Shape fields that became a block's own config key (shape.settings): an older checkpoint's value
// moves there under its key where the composition declares it, and is dropped elsewhere (where it
// held its neutral 0). Llama 4's temperature tuning was off where attn_floor_scale was 0.
enum class moved_as : std::int8_t { value, nonzero, value_unless_zero };
struct moved_field {
  std::string_view field, key;
  moved_as as = moved_as::value;
  double unless = 0;  // value_unless_zero: the key's value where the field held 0
  double neutral = 0;  // the field's value in shape{} before it moved (where its family had no such key)
};
constexpr moved_field fields_now_settings[] = {
    {"swiglu_alpha", "swiglu_alpha"},
    {"swiglu_limit", "swiglu_limit"},
    {"attention_chunk", "attention_chunk_size"},
    {"qk_l2_norm", "use_qk_norm"},
    {"attn_floor_scale", "attn_temperature_tuning", moved_as::nonzero},
    {"attn_floor_scale", "floor_scale", moved_as::value_unless_zero, 8192},
    {"attn_scale", "attn_scale", moved_as::value_unless_zero, 0.1},
    {"use_qk_norm", "use_qk_norm"},
    {"logit_scale", "logit_scale", moved_as::value, 0, 1.0},
    {"embedding_multiplier", "embedding_multiplier", moved_as::value, 0, 1.0},
    {"residual_multiplier", "residual_multiplier", moved_as::value, 0, 1.0},
    {"attention_multiplier", "attention_multiplier"},
    {"logits_scaling", "logits_scaling", moved_as::value, 0, 1.0},
    {"linear_key_heads", "linear_num_key_heads"},
    {"linear_value_heads", "linear_num_value_heads"},
    {"linear_key_dim", "linear_key_head_dim"},
    {"linear_value_dim", "linear_value_head_dim"},
    {"linear_conv_kernel", "linear_conv_kernel_dim"},
    {"q_lora_rank", "q_lora_rank"},
    {"kv_lora_rank", "kv_lora_rank"},
    {"qk_nope_dim", "qk_nope_head_dim"},
    {"v_head_dim", "v_head_dim"},
    {"topk_sum_floor", "moe_norm_min"},
    {"routed_scale", "routed_scaling_factor", moved_as::value, 0, 1.0},
    {"expert_groups", "n_group", moved_as::value, 0, 1.0},
    {"group_top_k", "topk_group", moved_as::value, 0, 1.0},
};
// Whether a field holds the value it had where its family had no such key (moved_field::neutral).
bool neutral(const moved_field& m, const json& v) {
  return v.is_number() ? v.get<double>() == m.neutral : !(v.is_boolean() && v.get<bool>());
}

// The architecture recorded under `name`: a family's composition, or the one it had before its
// keys became its blocks' (family_config::earlier_arch) where the shape holds a value of one of
// them that the recorded composition does not declare (a Granite checkpoint recorded Llama's).
const architecture* recorded_architecture(const json& shape, const std::string& name) {
  const auto moved_here = [&](const architecture& a) {
    for (const moved_field& m : fields_now_settings) {
      const std::string field(m.field);
      if (!shape.contains(field) || setting_index(a, m.key) < 0) continue;
      if (!neutral(m, shape[field])) return true;
    }
    return false;
  };
  for (const family_config* f : families)
    if (f->earlier_arch != nullptr && f->earlier_arch->name == name && moved_here(*f->arch)) return f->arch;
  for (const family_config* f : families)
    if (f->arch->name == name) return f->arch;
  return nullptr;
}

void fill_settings(json& shape) {
  const architecture* arch = nullptr;
  if (shape.contains("architecture") && shape["architecture"].is_string()) {
    arch = recorded_architecture(shape, shape["architecture"].get<std::string>());
    if (arch != nullptr) shape["architecture"] = std::string(arch->name);
  }
  // Values other than a field's neutral one first: two fields became one key (Llama 4's
  // qk_l2_norm and GLM-4.5's and Cohere's use_qk_norm), and the other family's field is neutral.
  for (const bool neutral_pass : {false, true})
  for (const moved_field& m : fields_now_settings) {
    const std::string field(m.field), key(m.key);
    if (!shape.contains(field) || neutral(m, shape[field]) != neutral_pass) continue;
    if (arch != nullptr && setting_index(*arch, m.key) >= 0 && !(shape.contains("settings") && shape["settings"].contains(key))) {
      const json& v = shape[field];
      const bool zero = v.is_number() ? v.get<double>() == 0 : v.is_boolean() && !v.get<bool>();
      shape["settings"][key] = m.as == moved_as::nonzero                  ? json(zero ? 0.0 : 1.0)
                               : m.as == moved_as::value_unless_zero && zero ? json(m.unless)
                               : v.is_boolean()                            ? json(v.get<bool>() ? 1.0 : 0.0)
                                                                           : v;
    }
  }
  for (const moved_field& m : fields_now_settings) shape.erase(std::string(m.field));
  // The composition's keys a checkpoint written before them does not record: their defaults.
  if (arch != nullptr)
    for (const config_setting& c : arch->settings) {
      const std::string key(c.key);
      if (!shape.contains("settings") || !shape["settings"].contains(key)) shape["settings"][key] = c.fallback;
    }
}

}  // namespace

void fill_fields_added_later(json& shape) {
  fill_shape_fields(shape);
  fill_settings(shape);
}

manifest parse_manifest(std::string_view text, const fs::path& dir) {
  manifest m;
  m.dir = dir;
  auto bad = [&](const std::string& what) {
    throw checkpoint_error(one_line(m.where() + ": " + manifest_name + " is corrupt: " + what));
  };
  const json j = parse_json_bounded(text, std::size_t{256} << 20, bad);
  auto integer = [&]<class T = std::int64_t>(const json& v, const std::string& what) {
    T out{};
    std::string why;
    if (!json_as_integer(v, out, why)) bad(what + " " + why);
    return out;
  };
  auto integers = [&](const json& v, const std::string& what) {
    if (!v.is_array()) bad(what + " is " + v.type_name() + ", not a list of integers");
    std::vector<std::int64_t> out;
    for (const json& e : v) out.push_back(integer(e, what));
    return out;
  };
  try {
    if (!j.is_object() || j.value("format", std::string()) != dist_checkpoint_format)
      bad("it does not name the format \"" + std::string(dist_checkpoint_format) + "\"");
    const int version = integer.template operator()<int>(j.at("version"), "\"version\"");
    if (version != dist_checkpoint_version)
      bad("format version " + std::to_string(version) + "; this build reads version " +
          std::to_string(dist_checkpoint_version));
    m.model = j.at("model");
    if (m.model.is_object() && m.model.contains("shape") && m.model["shape"].is_object())
      fill_fields_added_later(m.model["shape"]);
    m.layout = j.value("layout", json::object());
    if (!j.at("training").is_null()) {
      const json& t = j.at("training");
      m.training = training_state{.steps = integer(t.at("steps"), "training.steps"),
                                  .samples = integer(t.at("samples"), "training.samples"),
                                  .adam_step = integer(t.at("adam_step"), "training.adam_step")};
      m.moments = t.at("moments").get<bool>();
    }
    std::set<std::string> keys, names;
    for (const json& f : j.at("files")) {
      saved_file sf;
      sf.name = f.at("file").get<std::string>();
      if (sf.name.empty() || sf.name.find('/') != std::string::npos || sf.name[0] == '.')
        bad("file name \"" + printable(sf.name) + "\" is not a plain file name inside the checkpoint");
      if (!names.insert(sf.name).second) bad("file " + printable(sf.name) + " is listed twice");
      sf.bytes = integer.template operator()<std::uint64_t>(f.at("bytes"), "file " + printable(sf.name) + ": \"bytes\"");
      for (const json& pj : f.at("pieces")) {
        saved_piece p;
        p.key = pj.at("key").get<std::string>();
        p.tensor = pj.at("tensor").get<std::string>();
        p.file = m.files.size();
        p.global_shape = integers(pj.at("global_shape"), "piece " + printable(p.key) + ": \"global_shape\"");
        const auto offset = integers(pj.at("global_offset"), "piece " + printable(p.key) + ": \"global_offset\"");
        const auto shape = integers(pj.at("shape"), "piece " + printable(p.key) + ": \"shape\"");
        p.dtype = pj.at("dtype").get<std::string>();
        const std::string sum = pj.at("fnv1a64").get<std::string>();
        const std::size_t rank = p.global_shape.size();
        if (rank < 1 || rank > 2 || offset.size() != rank || shape.size() != rank)
          bad("piece " + printable(p.key) + " in " + printable(sf.name) + ": global_shape, global_offset and shape must have one rank (1 or 2)");
        p.where = whole(p.global_shape);
        for (std::size_t d = 0; d < rank; ++d) {
          p.where.off[d] = offset[d];
          p.where.len[d] = shape[d];
          if (p.global_shape[d] < 0 || offset[d] < 0 || shape[d] < 0 || offset[d] > p.global_shape[d] ||
              shape[d] > p.global_shape[d] - offset[d])  // no sum that could overflow
            bad("piece " + printable(p.key) + " in " + printable(sf.name) + " covers " + region_text(p.where) + ", outside its tensor's shape " +
                shape_text(p.global_shape));
        }
        if (!parse_safetensors_dtype(p.dtype)) bad("piece " + printable(p.key) + " in " + printable(sf.name) + " has unknown dtype " + printable(p.dtype));
        std::size_t used = 0;
        try {
          p.checksum = std::stoull(sum, &used, 16);
        } catch (const std::exception&) {
          used = 0;
        }
        if (sum.size() != 16 || used != 16) bad("piece " + printable(p.key) + " in " + printable(sf.name) + ": fnv1a64 \"" + printable(sum) + "\" is not 16 hex digits");
        if (!keys.insert(p.key).second) bad("piece " + printable(p.key) + " is listed twice");
        sf.pieces.push_back(m.pieces.size());
        m.by_tensor[p.tensor].push_back(m.pieces.size());
        m.pieces.push_back(std::move(p));
      }
      m.files.push_back(std::move(sf));
    }
    if (const auto it = j.find("hf_files"); it != j.end()) {
      std::vector<saved_extra> extras;
      std::set<std::string> seen;
      for (const json& f : *it) {
        saved_extra e;
        e.name = f.at("file").get<std::string>();
        const std::string leaf = e.name.rfind("hf/", 0) == 0 ? e.name.substr(3) : std::string();
        if (leaf.empty() || leaf.find('/') != std::string::npos || leaf[0] == '.')
          bad("hf file \"" + printable(e.name) + "\" is not a plain file name inside hf/");
        if (!seen.insert(e.name).second) bad("hf file " + printable(e.name) + " is listed twice");
        e.bytes = integer.template operator()<std::uint64_t>(f.at("bytes"), "hf file " + printable(e.name) + ": \"bytes\"");
        const std::string sum = f.at("fnv1a64").get<std::string>();
        std::size_t used = 0;
        try {
          e.checksum = std::stoull(sum, &used, 16);
        } catch (const std::exception&) {
          used = 0;
        }
        if (sum.size() != 16 || used != 16) bad("hf file " + printable(e.name) + ": fnv1a64 \"" + printable(sum) + "\" is not 16 hex digits");
        extras.push_back(std::move(e));
      }
      m.hf_files = std::move(extras);
    }
  } catch (const json::exception& e) {
    bad(e.what());
  }
  return m;
}

}  // namespace dist_metadata

void check_distributed_metadata(std::string_view text, const std::filesystem::path& dir) {
  (void)dist_metadata::parse_manifest(text, dir);
}

}  // namespace megadsl
