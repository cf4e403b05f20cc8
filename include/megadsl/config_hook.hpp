// A family's own reading of config.json (family_config::read_own), for what is truly the family's
// and no block's key: HunYuan's fixed NTK-alpha RoPE (models/hunyuan/ntk_alpha_rope.hpp), which of
// Qwen3-Next's layers are the gated DeltaNet's (models/qwen3_next/linear_layers.hpp). It runs after
// the generic reader has read the shape's numbers and the blocks' keys, before the layer checks,
// sees config.json through this view (the reader implements it, src/spec/hf_config.cpp), and may
// change the shape, say a note or refuse. Torch- and JSON-free: a family's hook is a few lines in
// its own header. What it writes back is the generic writer's (a layer_types list: family_config::
// layer_type).
//
//   inline void my_read(const config_view& c, shape& s) {
//     if (const auto a = c.number("rope_parameters.alpha")) s.rope_theta = s.rope_theta.get() * *a;
//   }
//   inline constexpr family_config my_config{..., .read_own = &my_read};
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megadsl/shape.hpp"

namespace megadsl {

class config_view {
 public:
  // The number at `path`, keys joined by '.' ("rope_parameters.alpha"): nullopt where a key on the
  // way is absent or null; anything else than a number is refused, naming the path.
  [[nodiscard]] virtual std::optional<double> number(std::string_view path) const = 0;
  // The integer at `path` (at least `least`), nullopt where absent or null; others refused.
  [[nodiscard]] virtual std::optional<std::int64_t> integer(std::string_view path, std::int64_t least) const = 0;
  // The list of strings at `path`, nullopt where absent or null; others refused.
  [[nodiscard]] virtual std::optional<std::vector<std::string>> strings(std::string_view path) const = 0;
  // Whether `path` holds a JSON object.
  [[nodiscard]] virtual bool has_object(std::string_view path) const = 0;
  // Said to the user beside the model (the notes of hf_config).
  virtual void note(const std::string& text) const = 0;
  // Refuses the file: "megadsl: <file>: <path>: <problem>; <fix>" (a config_error).
  [[noreturn]] virtual void fail(std::string_view path, const std::string& problem, std::string_view fix) const = 0;
  // A number as config.json and the messages write it ("500000.0", "1e-05").
  [[nodiscard]] virtual std::string shown(double v) const = 0;

 protected:
  ~config_view() = default;
};

}  // namespace megadsl
