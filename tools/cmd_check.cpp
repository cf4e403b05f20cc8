// `megadsl check MODEL [layout]`, `megadsl presets` and `megadsl families`.
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

// The registry's families, one line each: the table docs/families.md and the README point to.
int cmd_families(std::ostream& out) {
  table t({"model_type", "transformers class", "checkpoints", "presets"});
  for (const family_config* f : families) {
    std::string names;
    for (const preset_entry& p : presets)
      if (p.family == f->model_type) names += (names.empty() ? "" : ", ") + std::string(p.name);
    t.add({std::string(f->model_type), std::string(f->hf_class) + "ForCausalLM", std::string(f->display),
           names.empty() ? "-" : names});
  }
  t.print(out, "");
  return exit_ok;
}

}  // namespace megadsl::cli
