// HF config.json reader and the declared-vs-config comparison (include/megadsl/hf_config.hpp).
//
// Generic over the families: each family's header says what its config class holds (models/
// family_config.hpp, listed in models/registry.hpp), and nothing here names a family. A key that
// config.json leaves out takes the default of its model_type's config class, and every such
// default is recorded in `notes` so that nothing is filled in silently.
// The reader's other parts are in this folder's config_*.cpp (config_reader.hpp lists them).
#include "config_reader.hpp"
#include "megadsl/config_hook.hpp"

#include <fstream>
#include <sstream>

namespace megadsl {

using namespace hf_read;

namespace hf_read {

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

}  // namespace hf_read

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
    {"qkv_bias", "attention_bias / qkv_bias / use_bias (the family's key, if any)"},
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
    {"nope_layers", "no_rope_layers"},
    {"rope_interleave", "rope_interleave"},
    {"linear_layers", "layer_types (\"linear_attention\") / full_attention_interval"},
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

}  // namespace

std::string_view hf_key_of(std::string_view field) {
  for (const auto& k : key_names)
    if (k.field == field) return k.hf;
  return field;
}

namespace {

hf_config parse_config_object(const json& root, const std::filesystem::path& file, const std::string& key_prefix);

// `root` is a multimodal checkpoint's config (model_type `mm`, family_config::multimodal) with a
// family's text_config: the text model's config, its LM head tied as the multimodal class ties it
// (by its own, top-level tie_word_embeddings).
hf_config parse_multimodal(const json& root, const json& text, const multimodal_wrapper& mm,
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

// What a family's own reading (family_config::read_own) sees: the reader's view of config.json.
class own_view final : public config_view {
 public:
  own_view(const reader& r, const json& root, std::vector<std::string>& notes) : r_(r), root_(root), notes_(notes) {}
  std::optional<double> number(std::string_view path) const override {
    const json* at = find(path);
    if (at == nullptr) return std::nullopt;
    if (!at->is_number()) r_.fail(path, "expected a number, got " + describe_json(*at), "write it as a plain JSON number");
    return at->get<double>();
  }
  void note(const std::string& text) const override { notes_.push_back(text); }
  [[noreturn]] void fail(std::string_view path, const std::string& problem, std::string_view fix) const override {
    r_.fail(path, problem, fix);
  }
  std::string shown(double v) const override { return format_double(v); }
  std::optional<std::int64_t> integer(std::string_view path, std::int64_t least) const override {
    const json* at = find(path);
    if (at == nullptr) return std::nullopt;
    return r_.integer(*at, path, least);
  }
  std::optional<std::vector<std::string>> strings(std::string_view path) const override {
    const json* at = find(path);
    if (at == nullptr) return std::nullopt;
    if (!at->is_array()) r_.fail(path, "expected a list of strings, got " + describe_json(*at), "write a JSON list of strings");
    std::vector<std::string> out;
    for (const json& v : *at) {
      if (!v.is_string()) r_.fail(path, "holds " + describe_json(v) + " among its entries", "write a JSON list of strings");
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  bool has_object(std::string_view path) const override {
    const json* at = find(path);
    return at != nullptr && at->is_object();
  }

 private:
  // The value at the dotted path, or null where a key on the way is absent or null.
  const json* find(std::string_view path) const {
    const json* at = &root_;
    for (std::size_t from = 0; at != nullptr;) {
      const std::size_t dot = path.find('.', from);
      const std::string_view key = path.substr(from, dot == std::string_view::npos ? std::string_view::npos : dot - from);
      at = at->is_object() ? r_.find(*at, key) : nullptr;
      if (dot == std::string_view::npos) break;
      from = dot + 1;
    }
    return at;
  }

  const reader& r_;
  const json& root_;
  std::vector<std::string>& notes_;
};

hf_config parse_config_object(const json& root, const std::filesystem::path& file, const std::string& key_prefix) {
  hf_config out;
  out.file = file;
  const std::string fname = file.string();
  reader r(root, fname, out.notes, key_prefix);
  if (!root.is_object())
    r.fail("", "expected a JSON object, got " + describe_json(root), "an HF config.json is one JSON object");

  const json* mt = r.find(root, "model_type");
  std::string types, names;  // the model_types megadsl reads, and their displays, for the fix
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
  // A multimodal checkpoint whose text model is a family (the family says which: its
  // family_config::multimodal): megadsl reads and trains the text model.
  if (const json* text = r.find(root, "text_config"); fam == nullptr && text != nullptr && text->is_object()) {
    const auto it = text->find("model_type");
    const family_config* text_family = it != text->end() && it->is_string() ? family_named(it->get<std::string>()) : nullptr;
    if (text_family != nullptr && key_prefix.empty() && text_family->multimodal.model_type == out.model_type)
      return parse_multimodal(root, *text, text_family->multimodal, file);
    if (text_family != nullptr) {
      std::vector<std::string_view> wrappers;
      for (const family_config* f : families)
        if (!f->multimodal.model_type.empty()) wrappers.push_back(f->multimodal.model_type);
      std::string read;
      for (std::size_t i = 0; i < wrappers.size(); ++i)
        read += (i == 0 ? "" : i + 1 == wrappers.size() ? " and " : ", ") + ("\"" + std::string(wrappers[i]) + "\"");
      r.fail("model_type", "\"" + printable(out.model_type) + "\" is a multimodal checkpoint, its text model (text_config) a \"" +
                               printable(it->get<std::string>()) + "\", but megadsl reads the text models of " + read +
                               " checkpoints only (whose classes it knows run the text model as it is)",
             "save the text model alone with transformers (<Class>.from_pretrained(dir).language_model, or "
             ".model.language_model, .save_pretrained(out)) and give megadsl that");
    }
  }
  if (fam == nullptr)
    r.fail("model_type", "\"" + printable(out.model_type) + "\" is not a family megadsl composes",
           "megadsl reads model_type " + types + " (" + names + ")");

  // Architecture switches the family's blocks do not have: refuse rather than mis-load.
  // The activation is the family's composition's (or the family's legacy spelling of it,
  // family_config::legacy_activation: "gelu" for the tanh approximation, which transformers rewrites).
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
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); },
      /*note=*/fam->head_dim != 0 && fam->head_dim_key.empty());
  if (!fam->head_dim_key.empty()) read_head_dim_key(r, *fam, s);
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
  // 4.x configs may name the theta otherwise (family_config::theta_key) and keep the rotated share
  // at the top level (partial_rotary_key).
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
  const auto flag = [&](std::string_view key, bool fallback, bool note) {
    return r.optional<bool>(key, fallback, [&](const json& v, std::string_view k) { return r.boolean(v, k); }, note);
  };
  // The bias switches: each its key's (read once where several share it) or the family's fixed value.
  const bias_switch* switches[3] = {&fam->bias.qkv, &fam->bias.out, &fam->bias.mlp};
  bool on[3]{};
  for (int i = 0; i < 3; ++i) {
    const bias_switch& b = *switches[i];
    int same = -1;  // an earlier switch of the same key
    for (int j = 0; j < i && !b.key.empty() && same < 0; ++j)
      if (switches[j]->key == b.key) same = j;
    on[i] = same >= 0 ? on[same] : b.key.empty() ? b.fallback : flag(b.key, b.fallback, b.note);
  }
  s.qkv_bias = on[0];
  s.out_bias = on[1];
  s.mlp_bias = on[2];
  // The family's rotation, or its key's (with the family's as its default).
  s.rope_interleave = fam->rope_interleave_key.empty() ? fam->interleaved_rope
                                                       : flag(fam->rope_interleave_key, fam->interleaved_rope, /*note=*/true);
  s.tie_embeddings = flag("tie_word_embeddings", fam->tie_embeddings, /*note=*/false);
  // A score scale and soft-caps (family_config::score_caps; null: no cap); 0 = off elsewhere.
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
  s.arch = fam->arch;
  read_block_settings(r, *fam->arch, s);
  if (fam->moe != nullptr) read_experts(r, *fam, s);

  if (fam->reads_no_rope_layers) read_no_rope_layers(r, s, fam->empty_no_rope_is_default);
  s.linear_layers = 0;  // (set by a family's own reading: Qwen3-Next's)
  if (fam->read_own != nullptr) fam->read_own(own_view(r, root, out.notes), s);
  if (fam->layer_type != nullptr) check_layer_types(r, *fam, s);
  out.attention_window = read_attention_window(r, *fam, s);
  out.dropout = read_dropout(r, *fam, out.notes);
  // RoPE on the sliding layers only, always or where a window is set (family_config::rope_on).
  if (fam->rope_on != rope_layers::every_layer) {
    const json* w = r.find(root, "sliding_window");
    std::int64_t nope = 0;
    if (fam->rope_on == rope_layers::sliding || (w != nullptr && !w->is_null()))
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

}  // namespace megadsl
