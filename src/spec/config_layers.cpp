// The blocks' own keys, head_dim under a family's other key for it, NoPE layers, the attention
// window, layer types and the linear-attention layers, as config.json gives them.
#include "config_reader.hpp"

namespace megadsl::hf_read {

// The blocks' own config keys (architecture.hpp's config_setting), whatever the family: each read
// and checked as its block declares it; a key config.json does not give keeps its default.
void read_block_settings(const reader& r, const architecture& a, shape& s) {
  s.settings = {};
  for (std::size_t i = 0; i < a.settings.size(); ++i) {
    const config_setting& c = a.settings[i];
    const std::string_view key = setting_key_in(r.root(), c);
    if (key.empty()) continue;
    const json& v = r.root().at(std::string(key));  // (reader::find reads null as absent; here null says something)
    const std::string what = std::string(c.meaning.empty() ? "" : " (" + std::string(c.meaning) + ")");
    double x = 0;
    if (c.kind == setting_kind::truthy) {  // as Python's `if config.key:` tests it
      if (v.is_boolean()) x = v.get<bool>() ? 1.0 : 0.0;
      else if (v.is_number()) x = v.get<double>() != 0 ? 1.0 : 0.0;
      else if (!v.is_null()) r.fail(key, "expected true or false, got " + describe_json(v) + what, "write true or false");
    } else if (v.is_null() && c.kind == setting_kind::integer_or_null) {
      x = 0;  // none (a 0 written as a number is refused below, as the config class would build it empty)
    } else if (v.is_null()) {
      r.fail(key, "is null" + what + ": the config class would use it as it is and fail",
             "give a value, or leave the key out for its default " +
                 (c.kind == setting_kind::flag ? std::string(c.fallback != 0 ? "true" : "false") : format_double(c.fallback)));
    } else if (c.kind == setting_kind::flag) {
      x = r.boolean(v, key) ? 1.0 : 0.0;
    } else {
      if (!v.is_number()) r.fail(key, "expected a number, got " + describe_json(v) + what, "write it as a plain JSON number");
      x = v.get<double>();
      if ((c.kind == setting_kind::integer || c.kind == setting_kind::integer_or_null) && std::trunc(x) != x)
        r.fail(key, "expected an integer, got " + describe_json(v) + what, "write it as a plain JSON integer");
      if (!std::isfinite(x) || x < c.least || x > c.most)
        r.fail(key, "is " + format_double(x) + what + ", where the block takes " +
                        (c.least <= -1e300 ? "at most " + format_double(c.most)
                         : c.most >= 1e300 ? "at least " + format_double(c.least)
                                           : "[" + format_double(c.least) + ", " + format_double(c.most) + "]"),
               "give a value in that range (default " + format_double(c.fallback) + ")");
    }
    s.settings.set(c.key, x);
  }
}

// head_dim under the family's other key for it (family_config::head_dim_key, which its config
// class sets head_dim from): that key wins, and a head_dim key must agree.
void read_head_dim_key(const reader& r, const family_config& fam, shape& s) {
  const std::string_view key = fam.head_dim_key;
  const std::int64_t d = r.optional<std::int64_t>(key, fam.head_dim, [&](const json& v, std::string_view k) { return r.integer(v, k, 2); });
  if (const json* hd = r.find(r.root(), "head_dim"); hd != nullptr && !hd->is_null() && r.integer(*hd, "head_dim", 1) != d)
    r.fail("head_dim", "is " + describe_json(*hd) + " but " + std::string(key) + " is " + std::to_string(d),
           std::string(fam.hf_class) + "Config sets head_dim to " + std::string(key) + ": make them equal");
  s.head_dim = d;
}

// NoPE layers (family_config::reads_no_rope_layers): `no_rope_layers` holds one 0/1 per layer (1:
// the layer applies RoPE); without it, every `no_rope_layer_interval`-th layer (4 by default) has
// none, as the config class derives it.
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
  if (list != nullptr && empty_is_default && list->is_array() && list->empty()) list = nullptr;  // the config class's fallback
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
      // Under window_rule::nope_layers the config class keeps sliding_window then, and transformers'
      // eager and sdpa masks slide the layers an explicit layer_types calls sliding while its flash
      // attention does not: refused.
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
  if (family.window == window_rule::nope_layers && w->is_null()) return {};  // no window, no sliding layer
  // An explicit null (not an absent key: the class default) leaves the patterned families' attention
  // without a window for its sliding layers, and transformers fails (a mask of window None, or a
  // sliding layer given None): refused below unless every layer is full.
  const auto null_key = root.find("sliding_window");
  const bool null_window = alternate && null_key != root.end() && null_key->is_null();
  sliding_window out;
  out.size = w ? r.integer(*w, "sliding_window", 1) : family.default_window;
  out.layers.assign(static_cast<std::size_t>(layers), true);
  if (family.window == window_rule::from_max_window_layers) {
    const json* mwl = r.find(root, "max_window_layers");
    const std::int64_t first = mwl ? r.integer(*mwl, "max_window_layers", 0) : 28;
    for (std::int64_t i = 0; i < layers; ++i) out.layers[static_cast<std::size_t>(i)] = i >= first;
  }
  if (alternate) {  // every full_every-th layer full (or its key's: sliding_window_pattern)
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

// The layer_types a composition fixes per layer (family_config::layer_type: chunked attention on
// the RoPE layers, say): an explicit list must say it (transformers' attention follows one key, its mask the other).
void check_layer_types(const reader& r, const family_config& family, const shape& s) {
  const json* types = r.find(r.root(), "layer_types");
  if (types == nullptr) return;
  const auto expected = [&] {
    std::string list;
    for (std::int64_t i = 0; i < s.layers.get(); ++i) list += (i ? ", \"" : "[\"") + std::string(family.layer_type(s, i)) + "\"";
    return list + "]";
  };
  if (!types->is_array() || static_cast<std::int64_t>(types->size()) != s.layers.get())
    r.fail("layer_types", "expected one entry per layer (" + std::to_string(s.layers.get()) + "), got " + describe_json(*types),
           "write " + expected() + " (or leave layer_types out)");
  for (std::int64_t i = 0; i < s.layers.get(); ++i) {
    const json& t = (*types)[static_cast<std::size_t>(i)];
    const std::string_view want = family.layer_type(s, i);
    if (!t.is_string() || t.get<std::string>() != want)
      r.fail("layer_types", "makes layer " + std::to_string(i) + " " + describe_json(t) + " where the other keys make it \"" +
                 std::string(want) + "\" (" + std::string(family.display) + "'s layers are " + expected() + ")",
             "write \"" + std::string(want) + "\" there (or leave layer_types out)");
  }
}

}  // namespace megadsl::hf_read
