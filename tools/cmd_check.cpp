// `megadsl check MODEL [layout]` and `megadsl presets`.
#include <ostream>

#include "cli.hpp"
#include "megadsl/models/registry.hpp"

namespace megadsl::cli {

int cmd_check(const options& o, std::ostream& out, std::ostream& err) {
  const model_arg m = load_model(o);
  if (!validate(m, o, err)) return exit_invalid;
  out << "ok: " << m.name << " at " << layout_summary(o) << " is valid\n";
  return exit_ok;
}

int cmd_presets(std::ostream& out) {
  table t({"preset", "family", "parameters", "", "shape", "source"});
  for (const preset_entry& p : presets) {
    const shape& s = p.s;
    std::string summary = std::to_string(s.layers.get()) + " x h" + std::to_string(s.hidden.get()) + ", " +
                          std::to_string(s.heads.get()) + "/" + std::to_string(s.kv_heads.get()) +
                          " heads, ffn " + std::to_string(s.ffn.get()) + ", vocab " + std::to_string(s.vocab.get());
    if (s.tie_embeddings.get()) summary += ", tied";
    t.add({std::string(p.name), std::string(p.family), grouped(p.published_params), short_count(p.published_params), summary,
           std::string(p.source)});
  }
  t.print(out, "");
  return exit_ok;
}

}  // namespace megadsl::cli
