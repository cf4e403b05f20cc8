// The run-time twin of the static layout check (rules.hpp), in its own header: it needs <string>
// and <stdexcept>, which spec-only translation units that check statically do not.
#pragma once

#include <stdexcept>
#include <string>

#include "megadsl/rules.hpp"

namespace megadsl {

// The run-time twin of the static check: throws std::invalid_argument with the same text.
inline void require_valid(const shape& s, const layout& l, const run_facts& f = {}) {
  const violations v = check(s, l, f);
  if (!v.ok()) throw std::invalid_argument("megadsl: invalid layout: " + std::string(v.joined().view()));
}

}  // namespace megadsl
