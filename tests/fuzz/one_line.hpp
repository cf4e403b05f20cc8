// What every harness asks of an error message: one line, and no byte that would drive a terminal
// (ESC, other controls) taken from the input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace megadsl::fuzz {

inline void require_one_line(std::string_view message) {
  for (const char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u == '\n' || u == '\r' || u == 0x1b || u == 0x7f || (u < 0x20 && u != '\t')) {
      std::fprintf(stderr, "message is not one printable line: %.*s\n", static_cast<int>(message.size()), message.data());
      std::abort();
    }
  }
}

}  // namespace megadsl::fuzz
