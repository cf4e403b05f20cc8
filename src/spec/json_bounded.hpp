// JSON from files a user hands megadsl (config.json, an input batch, a checkpoint's metadata.json
// and index): parsed with bounds, so a hostile or broken file is one line, never a crash.
//   - nesting deeper than max_json_depth is refused while parsing (no deep recursion later);
//   - text longer than the caller's limit is refused before parsing;
//   - every parser error, including numbers out of range (1e999), is reported the same way.
// Internal to megadsl (needs nlohmann-json).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>

namespace megadsl {

inline constexpr int max_json_depth = 64;

// `fail(problem)` must throw (the caller's error type, naming the file); it gets e.g.
// "not valid JSON: syntax error while parsing value - invalid literal; last read: 'x' (line 1,
// column 3)" or "nested deeper than 64 levels of JSON, ...". Returns the parsed document otherwise.
nlohmann::json parse_json_bounded(std::string_view text, std::size_t max_bytes,
                                  const std::function<void(const std::string&)>& fail);

// A JSON integer that fits T, or the reason it is not one (nlohmann's get<T>() would convert a
// float such as 1e86 with undefined behaviour, and wrap a negative into an unsigned type).
template <class T>
bool json_as_integer(const nlohmann::json& v, T& out, std::string& why) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      why = "is too large";
      return false;
    }
    out = static_cast<T>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if (std::is_unsigned_v<T> || i < static_cast<std::int64_t>(std::numeric_limits<T>::min())) {
      why = std::is_unsigned_v<T> ? "is negative" : "is too small";
      return false;
    }
    if (i > static_cast<std::int64_t>(std::numeric_limits<T>::max())) {
      why = "is too large";
      return false;
    }
    out = static_cast<T>(i);
    return true;
  }
  why = std::string("is ") + v.type_name() + (v.is_number_float() ? " with a fraction or exponent" : "") + ", not an integer";
  return false;
}

}  // namespace megadsl
