// A fixed-capacity string that can be built in constant evaluation.
//
// Rule messages are formatted by the same constexpr code at compile time (where they end up inside
// a type name in the compiler's diagnostic) and at run time (where they become exception text).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace megadsl {

template <std::size_t N>
struct basic_text {
  char data[N]{};
  std::size_t size = 0;

  constexpr basic_text() = default;
  constexpr basic_text(std::string_view s) { append(s); }  // NOLINT

  constexpr basic_text& append(std::string_view s) {
    for (char c : s)
      if (size + 1 < N) data[size++] = c;
    return *this;
  }
  constexpr basic_text& append(std::int64_t v) {
    if (v < 0) {
      append("-");
      v = -v;
    }
    char digits[24]{};
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0) {
      char c[1] = {digits[--n]};
      append(std::string_view(c, 1));
    }
    return *this;
  }
  constexpr basic_text& append(int v) { return append(static_cast<std::int64_t>(v)); }
  // Enough for eps/theta/scaling factors: up to 6 significant decimals, no exponent notation
  // below 1e15 (values such as 1e-5 print as 1e-05).
  constexpr basic_text& append(double v) {
    if (v < 0) {
      append("-");
      v = -v;
    }
    if (v != 0 && v < 1e-3) {
      int e = 0;
      while (v < 1) {
        v *= 10;
        --e;
      }
      append_fixed(v, 6);
      append("e-");
      if (-e < 10) append("0");
      return append(static_cast<std::int64_t>(-e));
    }
    return append_fixed(v, 6);
  }
  template <class... A>
  constexpr basic_text& add(const A&... parts) {
    (append(parts), ...);
    return *this;
  }

  [[nodiscard]] constexpr std::string_view view() const { return {data, size}; }
  [[nodiscard]] constexpr bool empty() const { return size == 0; }

 private:
  constexpr basic_text& append_fixed(double v, int decimals) {
    auto whole = static_cast<std::int64_t>(v);
    append(whole);
    double frac = v - static_cast<double>(whole);
    std::int64_t scale = 1;
    for (int i = 0; i < decimals; ++i) scale *= 10;
    auto f = static_cast<std::int64_t>(frac * static_cast<double>(scale) + 0.5);
    if (f >= scale) f = scale - 1;
    if (f == 0) return *this;
    char buf[8]{};
    for (int i = decimals - 1; i >= 0; --i) {
      buf[i] = static_cast<char>('0' + f % 10);
      f /= 10;
    }
    int len = decimals;
    while (len > 0 && buf[len - 1] == '0') --len;
    append(".");
    return append(std::string_view(buf, static_cast<std::size_t>(len)));
  }
};

using text = basic_text<256>;

}  // namespace megadsl
