// The config.json reader's shared parts, private to src/spec/: the reader and its message helpers,
// the comparisons of shape values, and what each of the reader's files gives the others:
//   hf_config.cpp       the registry, parse_hf_config / read_hf_config, mismatches, resolve
//   config_rope.cpp     RoPE in both generations of config.json, and per layer type
//   config_keys.cpp     which keys every config class has, the dropout keys, the unknown-key notes
//   config_layers.cpp   the blocks' own keys, MLA's sizes, NoPE layers, windows, layer types, linear layers
//   config_experts.cpp  a mixture of experts' keys
//   config_writer.cpp   which config class describes a model, and config.json as save_hf writes it
#pragma once

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
#include <optional>
#include <string>
#include <vector>

namespace megadsl::hf_read {

namespace hana = boost::hana;
using json = nlohmann::json;

// Shortest round-trip text: 500000.0, 0.02, 1e-05 (as config.json writes them).
inline std::string format_double(double v) {
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

inline std::string show(std::int64_t v) { return std::to_string(v); }
inline std::string show(double v) { return format_double(v); }
inline std::string show(bool v) { return v ? "true" : "false"; }
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
inline std::string describe_json(const json& v) {
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
           "every config.json of this family has it; point megadsl at the model's own config.json or add the key");
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

struct rope_read {
  rope_scaling scaling;
  std::optional<double> theta;  // from rope_parameters.rope_theta (5.x) or the top-level rope_theta (4.x)
  std::optional<double> partial;  // rope_parameters.partial_rotary_factor
};

inline bool close(double a, double b) { return a == b || std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); }

template <class T>
bool agree(const maybe<T>& d, const maybe<T>& c) {
  if (d.is_dynamic() || c.is_dynamic()) return true;
  if constexpr (std::is_same_v<T, double>) return close(d.value, c.value);
  else return d.value == c.value;
}

// Which rope_scaling fields a rope type reads.
inline bool rope_field_used(std::string_view field, const maybe<rope_type>& type) {
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
inline void fill(rope_scaling& d, const rope_scaling& c) {
  hana::for_each(hana::keys(d), [&](auto key) { fill(hana::at_key(d, key), hana::at_key(c, key)); });
}

// ---- what each file gives the others ----

// hf_config.cpp: the registry's families, then those registered by programs that declare their own.
const std::vector<const family_config*>& known_families();
const family_config* family_named(std::string_view model_type);

// config_rope.cpp
rope_scaling read_rope_object(const reader& r, const json& v, const std::string& where,
                              std::optional<double>* partial = nullptr);
bool same_rope(const rope_scaling& a, const rope_scaling& b);
rope_read read_rope(const reader& r);
rope_read read_rope_per_layer_type(const reader& r, const family_config& fam, double& local);

// config_keys.cpp
const config_key_rule* find_key(const family_config& family, std::string_view key);
std::vector<dropout_key> dropout_keys_of(const family_config& family);
const dropout_key* dropout_key_named(const family_config& family, std::string_view key);
dropout_rates read_dropout(const reader& r, const family_config& family, std::vector<std::string>& notes);
std::string_view setting_key_in(const json& root, const config_setting& c);
bool is_setting_key(const architecture& a, std::string_view key);
void check_keys(const reader& r, const family_config& family, std::vector<std::string>& notes);

// config_layers.cpp
void read_block_settings(const reader& r, const architecture& a, shape& s);
void read_head_dim_key(const reader& r, const family_config& fam, shape& s);
void read_no_rope_layers(const reader& r, shape& s, bool empty_is_default);
sliding_window read_attention_window(const reader& r, const family_config& family, const shape& s);
void check_layer_types(const reader& r, const family_config& family, const shape& s);

// config_experts.cpp
void read_experts(const reader& r, const family_config& family, shape& s);

}  // namespace megadsl::hf_read
