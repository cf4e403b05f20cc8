// The run-time twin of the static layout check (rules.hpp), in its own header: it needs <string>
// and <stdexcept>, which spec-only translation units that check statically do not.
#pragma once

#include <stdexcept>
#include <string>

#include "megadsl/rules.hpp"

namespace megadsl {

// A layout the model, the world or the batch does not fit: the violated rules, one line.
// (Python: megadsl.LayoutError, a ValueError.)
struct layout_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The run-time twin of the static check: throws layout_error with the same text.
inline void require_valid(const shape& s, const layout& l, const run_facts& f = {}) {
  const violations v = check(s, l, f);
  if (!v.ok()) throw layout_error("megadsl: invalid layout: " + std::string(v.joined().view()));
}

}  // namespace megadsl
