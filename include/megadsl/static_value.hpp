// Static-or-dynamic values: one vocabulary for what the type fixes and what a config.json fills in.
//
// Like CuTe's Int<N>/int or Eigen's Dynamic: every dimension and degree of a model or layout is a
// `maybe<T>` that is either known in the type (`.hidden = 4096`) or `dynamic` (read at run time).
// Reading a dynamic value where a static one is required is a compile error in constant
// evaluation and a `megadsl::unresolved_value` (a std::exception) at run time.
#pragma once

#include <cstdint>
#include <exception>

namespace megadsl {

// Thrown when a dynamic value is read before config.json or the command line filled it in. Not a
// std::logic_error: <stdexcept> would bring <string> into every spec-only translation unit.
struct unresolved_value final : std::exception {
  [[nodiscard]] const char* what() const noexcept override {
    return "megadsl: a dynamic value was read before it was resolved";
  }
};

struct dynamic_t {
  explicit constexpr dynamic_t(int) {}
};
// Marks a field as known only at run time (e.g. from an HF config.json).
inline constexpr dynamic_t dynamic{0};

template <class T>
struct maybe {
  T value{};
  bool known = true;

  constexpr maybe() = default;
  constexpr maybe(T v) : value(v) {}  // NOLINT: implicit by design (`.tp = 4`)
  constexpr maybe(dynamic_t) : known(false) {}

  [[nodiscard]] constexpr bool is_static() const { return known; }
  [[nodiscard]] constexpr bool is_dynamic() const { return !known; }
  [[nodiscard]] constexpr T get() const {
    if (!known) throw unresolved_value{};
    return value;
  }
  constexpr operator T() const { return get(); }  // NOLINT: reads like a plain value
};

using dim = maybe<std::int64_t>;  // a size or a parallel degree
using real = maybe<double>;       // eps, theta, scaling factors
using flag = maybe<bool>;         // on/off switches

// True when `a` and `b` are both static and equal, or both dynamic.
template <class T>
constexpr bool same_value(const maybe<T>& a, const maybe<T>& b) {
  return a.known == b.known && (!a.known || a.value == b.value);
}

}  // namespace megadsl
