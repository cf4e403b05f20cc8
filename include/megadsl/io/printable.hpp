// Text from files (tensor names, JSON keys, dtypes) made safe to print: a hostile checkpoint must
// not reach the user's terminal with escape sequences or break a one-line error across lines.
//
//   printable("model.\x1b[2Jembed")  ->  "model.\x1b[2Jembed" with the ESC byte written as `\x1b`
//
// Printable ASCII passes unchanged; every other byte (controls, DEL, and any byte >= 0x80, which
// also covers the C1 controls some terminals obey) becomes `\xNN`. Backslashes are doubled so the
// escaped text cannot be mistaken for the original. Long names are cut at `max` bytes with "...".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace megadsl {

inline std::string printable(std::string_view s, std::size_t max = 200) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() < max ? s.size() : max);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == max) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace megadsl
