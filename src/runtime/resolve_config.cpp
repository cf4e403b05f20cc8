#include <boost/hana/accessors.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>

#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "megadsl/require_valid.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/reflection.hpp"

namespace megadsl::detail {
namespace {

template <class T>
std::string show(const maybe<T>& v) {
  if (v.is_dynamic()) return "dynamic";
  std::ostringstream os;
  if constexpr (std::is_enum_v<T>) os << name_of(v.value);
  else if constexpr (std::is_same_v<T, bool>) os << (v.value ? "true" : "false");
  else os << v.value;
  return os.str();
}

// Walks the Hana-adapted fields of `declared` and `actual` side by side.
template <class S>
void merge(const S& declared, const S& actual, S& out, const std::string& prefix, std::ostringstream& diff) {
  boost::hana::for_each(boost::hana::accessors<S>(), [&](auto pair) {
    const auto name = prefix + boost::hana::to<char const*>(boost::hana::first(pair));
    const auto get = boost::hana::second(pair);
    const auto& d = get(declared);
    const auto& a = get(actual);
    auto& o = get(out);
    using field = std::decay_t<decltype(d)>;
    if constexpr (std::is_same_v<field, rope_scaling>) {
      merge(d, a, o, name + ".", diff);
    } else {
      if (a.is_dynamic()) {
        if (d.is_dynamic()) diff << name << ": dynamic in the type and not given at run time; ";
        o = d;
      } else if (d.is_static() && d.value != a.value) {
        diff << name << ": the type says " << show(d) << ", the run-time value is " << show(a) << "; ";
      } else {
        o = a;
      }
    }
  });
}

}  // namespace

runtime_config resolve_config(const shape& declared_shape, const layout& declared_layout,
                              const shape& actual_shape, const layout& actual_layout, head_info head,
                              const model_options& options) {
  // head_dim 0 means hidden / heads: compare the values it stands for.
  auto explicit_head_dim = [](shape s) {
    if (s.head_dim.is_static() && s.head_dim.get() == 0 && effective_head_dim(s).is_static())
      s.head_dim = effective_head_dim(s);
    return s;
  };
  const shape declared = explicit_head_dim(declared_shape), actual = explicit_head_dim(actual_shape);
  runtime_config c{declared, declared_layout, head, options};
  std::ostringstream diff;
  merge(declared, actual, c.s, "", diff);
  // The architecture (the family's composition): the type's, or the run-time one's when dynamic.
  if (declared.arch == nullptr) c.s.arch = actual.arch;
  else if (actual.arch != nullptr && actual.arch != declared.arch)
    diff << "architecture: the type says " << declared.arch->name << ", the run-time value is " << actual.arch->name << "; ";
  // The blocks' own config keys: the type's, or the run-time ones where the type leaves them dynamic.
  if (declared.settings.dynamic) {
    c.s.settings = actual.settings;
  } else if (!actual.settings.dynamic && c.s.arch != nullptr && declared.arch == actual.arch) {
    for (const config_setting& k : c.s.arch->settings)
      if (setting(declared, k.key) != setting(actual, k.key))
        diff << k.key << ": the type says " << setting(declared, k.key) << ", the run-time value is " << setting(actual, k.key) << "; ";
  }
  merge(declared_layout, actual_layout, c.l, "layout.", diff);
  if (!diff.str().empty())
    throw std::invalid_argument("megadsl: the run-time model does not match the declared type: " + diff.str() +
                                "declare those fields `dynamic` or pass matching values");
  require_valid(c.s, c.l);
  return c;
}

}  // namespace megadsl::detail
