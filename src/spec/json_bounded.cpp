#include "json_bounded.hpp"

#include <stdexcept>

#include "megadsl/io/printable.hpp"

namespace megadsl {
namespace {

struct too_deep {};

// "[json.exception.parse_error.101] parse error at line 1, column 3: ..." -> "parse error at ...",
// escaped: nlohmann quotes the bytes it last read ("last read: '...'"), which come from the file.
std::string plain(const std::string& what) {
  const auto p = what.find("] ");
  return printable(p == std::string::npos ? what : what.substr(p + 2), 400);
}

}  // namespace

nlohmann::json parse_json_bounded(std::string_view text, std::size_t max_bytes,
                                  const std::function<void(const std::string&)>& fail) {
  using json = nlohmann::json;
  if (text.size() > max_bytes) {
    fail("is " + std::to_string(text.size()) + " bytes, above the limit of " + std::to_string(max_bytes) +
         " for this file");
    throw std::logic_error("megadsl: parse_json_bounded: fail() returned");
  }
  try {
    return json::parse(text.begin(), text.end(), [](int depth, json::parse_event_t, json&) {
      if (depth > max_json_depth) throw too_deep{};
      return true;
    });
  } catch (const too_deep&) {
    fail("nested deeper than " + std::to_string(max_json_depth) + " levels of JSON, megadsl's limit for any file it reads");
  } catch (const json::out_of_range& e) {
    fail("not valid JSON: " + plain(e.what()) + " (a number outside the range of a double or a 64-bit integer)");
  } catch (const json::exception& e) {
    fail("not valid JSON: " + plain(e.what()));
  }
  throw std::logic_error("megadsl: parse_json_bounded: fail() returned");
}

}  // namespace megadsl
