// JSON from files a user hands megadsl (config.json, an input batch, a checkpoint's metadata.json
// and index): parsed with bounds, so a hostile or broken file is one line, never a crash.
//   - nesting deeper than max_json_depth is refused while parsing (no deep recursion later);
//   - text longer than the caller's limit is refused before parsing;
//   - every parser error, including numbers out of range (1e999), is reported the same way.
// Internal to megadsl (needs nlohmann-json).
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace megadsl {

inline constexpr int max_json_depth = 64;

// `fail(problem)` must throw (the caller's error type, naming the file); it gets e.g.
// "not valid JSON: syntax error while parsing value - invalid literal; last read: 'x' (line 1,
// column 3)" or "nested deeper than 64 levels of JSON, ...". Returns the parsed document otherwise.
nlohmann::json parse_json_bounded(std::string_view text, std::size_t max_bytes,
                                  const std::function<void(const std::string&)>& fail);

}  // namespace megadsl
