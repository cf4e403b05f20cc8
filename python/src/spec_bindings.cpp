// megadsl.Layout and the torch-free questions about a model under a layout: check, describe, plan,
// presets. They reuse the command-line tool's own code (tools/cli_model.cpp, cmd_check.cpp,
// cmd_describe.cpp are compiled into this module), so the words are the CLI's, byte for byte.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <optional>
#include <sstream>
#include <string>

#include "bindings.hpp"
#include "cli.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/models/registry.hpp"
#include "megadsl/plan_report.hpp"
#include "megadsl/require_valid.hpp"
#include "megadsl/rank_grid.hpp"

namespace py = pybind11;

namespace megadsl::python {
namespace {

// The model argument and the layout, as the tool's parse_args would have filled them.
struct question {
  std::string model;
  layout l;
  bool critic = false;
  bool value_bias = true;
  std::optional<std::int64_t> world, global_batch, micro_batch, microbatches;
  std::string config;
  std::int64_t seq = 4096;
};

cli::options options_of(const std::string& command, const question& q) {
  cli::options o;
  o.command = command;
  o.model = q.model;
  o.config = q.config;
  o.l = q.l;
  o.head.actor = !q.critic;
  o.head.value_bias = q.value_bias;
  // Run facts have no positive_sizes rule; the tool refuses a non-positive one, and so do we.
  auto fact = [&](dim& to, const std::optional<std::int64_t>& v, const char* name) {
    if (!v) return;
    if (*v <= 0) throw py::value_error(std::string("megadsl: ") + name + " must be positive, got " + std::to_string(*v));
    to = *v;
  };
  fact(o.facts.world, q.world, "world");
  fact(o.facts.global_batch, q.global_batch, "global_batch");
  fact(o.facts.micro_batch, q.micro_batch, "micro_batch");
  fact(o.facts.microbatches, q.microbatches, "microbatches");
  if (q.seq <= 0) throw py::value_error("megadsl: seq must be positive, got " + std::to_string(q.seq));
  o.seq = q.seq;
  if (!q.value_bias && !q.critic) throw py::value_error("megadsl: value_bias=False goes with critic=True (the value head's bias)");
  return o;
}

std::string trimmed(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Runs one of the tool's commands; an unusable model argument is a ValueError, an unusable
// config.json a ConfigError (config_error passes through).
template <class F>
int run_command(F&& f) {
  try {
    return f();
  } catch (const cli::usage_error& e) {
    throw py::value_error(e.what());
  }
}

std::pair<bool, std::string> check_model(const question& q) {
  const cli::options o = options_of("check", q);
  std::ostringstream out, err;
  int rc = 0;
  try {
    rc = run_command([&] { return cli::cmd_check(o, out, err); });
  } catch (const cli::mismatch_error& e) {  // the preset disagrees with config=
    return {false, e.what()};
  }
  std::string message = err.str() + out.str();
  return {rc == cli::exit_ok, trimmed(message)};
}

// describe / plan: the text, or LayoutError (a ValueError) with the violated rules.
template <class Command>
std::string report(const char* name, const question& q, Command command) {
  const cli::options o = options_of(name, q);
  std::ostringstream out, err;
  int rc = 0;
  try {
    rc = run_command([&] { return command(o, out, err); });
  } catch (const cli::mismatch_error& e) {
    throw config_error(e.what());
  }
  if (rc == cli::exit_invalid) throw layout_error(trimmed(err.str()));
  if (rc != cli::exit_ok) throw py::value_error(trimmed(err.str()));
  return out.str();
}

// `megadsl plan` (its body lives next to the tool's main(), so it is repeated here).
int plan_command(const cli::options& o, std::ostream& out, std::ostream& err) {
  const cli::model_arg m = cli::load_model(o);
  if (!cli::validate(m, o, err)) return cli::exit_invalid;
  plan_options p;
  p.seq = o.seq;
  p.micro_batch = o.facts.micro_batch.is_static() ? o.facts.micro_batch.get() : 1;
  p.microbatches = o.facts.microbatches.is_static() ? o.facts.microbatches.get() : 0;
  p.world = o.facts.world.is_static() ? o.facts.world.get() : 0;
  p.actor = o.head.actor;
  p.value_bias = o.head.value_bias;
  print_plan(out, m.name, m.s, o.l, p);
  return cli::exit_ok;
}

std::string layout_repr(const layout& l) {
  std::ostringstream s;
  s << "Layout(tp=" << l.tp.get() << ", pp=" << l.pp.get() << ", vpp=" << l.vpp.get()
    << ", sp=" << (l.sp.get() ? "True" : "False") << ", rmpad=" << (l.rmpad.get() ? "True" : "False");
  if (l.first_stage_layers.get() != 0) s << ", first_stage_layers=" << l.first_stage_layers.get();
  if (l.last_stage_layers.get() != 0) s << ", last_stage_layers=" << l.last_stage_layers.get();
  if (l.vocab_pad_multiple.get() != 128) s << ", vocab_pad_multiple=" << l.vocab_pad_multiple.get();
  if (l.cp.get() != 1) s << ", cp=" << l.cp.get();
  if (l.cp_comm.get() != cp_comm_kind::a2a) s << ", cp_comm=\"" << name_of(l.cp_comm.get()) << "\"";
  if (l.cp_a2a.get() != 1) s << ", cp_a2a=" << l.cp_a2a.get();
  if (l.ep.get() != 1) s << ", ep=" << l.ep.get();
  if (l.etp.get() != 0) s << ", etp=" << l.etp.get();
  if (l.recompute.get() != recompute_kind::none) s << ", recompute=\"" << name_of(l.recompute.get()) << "\"";
  if (l.invariant.get()) s << ", invariant=True";
  s << ")";
  return s.str();
}

bool same_layout(const layout& a, const layout& b) {
  return a.tp.get() == b.tp.get() && a.pp.get() == b.pp.get() && a.vpp.get() == b.vpp.get() &&
         a.first_stage_layers.get() == b.first_stage_layers.get() &&
         a.last_stage_layers.get() == b.last_stage_layers.get() && a.sp.get() == b.sp.get() &&
         a.rmpad.get() == b.rmpad.get() && a.vocab_pad_multiple.get() == b.vocab_pad_multiple.get() &&
         a.cp.get() == b.cp.get() && a.cp_comm.get() == b.cp_comm.get() && a.cp_a2a.get() == b.cp_a2a.get() && a.ep.get() == b.ep.get() && a.etp.get() == b.etp.get() &&
         a.recompute.get() == b.recompute.get() && a.invariant.get() == b.invariant.get();
}

}  // namespace

py::dict dict_of(const dropout_rates& r) {
  py::dict d;
  d["attention"] = r.attention;
  d["residual"] = r.residual;
  d["embedding"] = r.embedding;
  return d;
}

cp_comm_kind cp_comm_of(const std::string& name) {
  if (cp_comm_kind k{}; cp_comm_from_name(name, k)) return k;
  throw py::value_error("megadsl: cp_comm is \"a2a\" (Ulysses: heads all-to-all), \"ring\" (\"p2p\": k/v passed around "
                        "a ring over a load-balanced split) or \"a2a+ring\" (\"a2a+p2p\": all-to-all within groups of "
                        "cp_a2a ranks, a ring across them), got \"" + name + "\"");
}

recompute_kind recompute_of(const std::string& name) {
  if (recompute_kind r{}; recompute_from_name(name, r)) return r;
  throw py::value_error("megadsl: recompute is \"none\", \"selective\" or \"full\", got \"" + name + "\"");
}

namespace {

template <class T>
auto property(T layout::*field) {
  return py::cpp_function([field](const layout& l) { return (l.*field).get(); });
}

}  // namespace

void bind_spec(py::module_& m) {
  py::class_<layout>(m, "Layout", R"(A parallel layout: tensor-, pipeline- and sequence-parallel degrees,
virtual pipeline chunks, remove-padding, context-parallel degree (cp: each rank 1/cp of every sequence's
tokens) and its attention (cp_comm "a2a": all-to-all over heads, Ulysses; "ring" or "p2p": k/v passed
around a ring over a load-balanced split, any head count; "a2a+ring" or "a2a+p2p": all-to-all within
groups of cp_a2a consecutive cp ranks, a ring across the groups), expert-parallel degree (ep: whole experts per rank of an ep
group; etp 0 = tp), activation recompute ("none", "selective", "full"), invariant arithmetic (a
sequence's outputs the same bits whatever its batch, padding and layout; CPU). Every field is a concrete value.)")
      .def(py::init([](std::int64_t tp, std::int64_t pp, std::int64_t vpp, bool sp, bool rmpad,
                       std::int64_t first_stage_layers, std::int64_t last_stage_layers,
                       std::int64_t vocab_pad_multiple, std::int64_t ep, std::int64_t etp,
                       const std::string& recompute, std::int64_t cp, bool invariant, const std::string& cp_comm,
                       std::int64_t cp_a2a) {
             layout l;
             l.cp_a2a = cp_a2a;
             l.invariant = invariant;
             l.cp = cp;
             l.cp_comm = cp_comm_of(cp_comm);
             l.recompute = recompute_of(recompute);
             l.ep = ep;
             l.etp = etp;
             l.tp = tp;
             l.pp = pp;
             l.vpp = vpp;
             l.sp = sp;
             l.rmpad = rmpad;
             l.first_stage_layers = first_stage_layers;
             l.last_stage_layers = last_stage_layers;
             l.vocab_pad_multiple = vocab_pad_multiple;
             return l;
           }),
           py::arg("tp") = 1, py::arg("pp") = 1, py::arg("vpp") = 1, py::arg("sp") = false, py::arg("rmpad") = false,
           py::arg("first_stage_layers") = 0, py::arg("last_stage_layers") = 0, py::arg("vocab_pad_multiple") = 128,
           py::arg("ep") = 1, py::arg("etp") = 0, py::arg("recompute") = "none", py::arg("cp") = 1,
           py::arg("invariant") = false, py::arg("cp_comm") = "a2a", py::arg("cp_a2a") = 1)
      .def_property(
          "recompute", [](const layout& l) { return std::string(name_of(l.recompute.get())); },
          [](layout& l, const std::string& v) { l.recompute = recompute_of(v); },
          "activations the backward recomputes: \"none\", \"selective\" (the attention core) or \"full\" (each layer)")
      .def_property("cp", property(&layout::cp), [](layout& l, std::int64_t v) { l.cp = v; })
      .def_property(
          "cp_comm", [](const layout& l) { return std::string(name_of(l.cp_comm.get())); },
          [](layout& l, const std::string& v) { l.cp_comm = cp_comm_of(v); },
          "context parallelism's attention: \"a2a\" (heads all-to-all, Ulysses), \"ring\" (k/v around a ring) or "
          "\"a2a+ring\" (all-to-all within groups of cp_a2a ranks, a ring across them)")
      .def_property("cp_a2a", property(&layout::cp_a2a), [](layout& l, std::int64_t v) { l.cp_a2a = v; })
      .def_property("ep", property(&layout::ep), [](layout& l, std::int64_t v) { l.ep = v; })
      .def_property("etp", property(&layout::etp), [](layout& l, std::int64_t v) { l.etp = v; })
      .def_property("tp", property(&layout::tp), [](layout& l, std::int64_t v) { l.tp = v; })
      .def_property("pp", property(&layout::pp), [](layout& l, std::int64_t v) { l.pp = v; })
      .def_property("vpp", property(&layout::vpp), [](layout& l, std::int64_t v) { l.vpp = v; })
      .def_property("sp", property(&layout::sp), [](layout& l, bool v) { l.sp = v; })
      .def_property("rmpad", property(&layout::rmpad), [](layout& l, bool v) { l.rmpad = v; })
      .def_property("invariant", property(&layout::invariant), [](layout& l, bool v) { l.invariant = v; })
      .def_property("first_stage_layers", property(&layout::first_stage_layers),
                    [](layout& l, std::int64_t v) { l.first_stage_layers = v; })
      .def_property("last_stage_layers", property(&layout::last_stage_layers),
                    [](layout& l, std::int64_t v) { l.last_stage_layers = v; })
      .def_property("vocab_pad_multiple", property(&layout::vocab_pad_multiple),
                    [](layout& l, std::int64_t v) { l.vocab_pad_multiple = v; })
      .def_property_readonly("model_parallel_size", [](const layout& l) { return l.tp.get() * l.pp.get(); },
                             "tp * pp: the ranks of one model replica")
      .def(
          "coords",
          [](const layout& l, std::int64_t rank, std::int64_t world) {
            rank_grid g;
            try {
              g = rank_grid::from(l, world);
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
            if (rank < 0 || rank >= world)
              throw py::value_error("megadsl: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world) + ")");
            const rank_coords c = g.coords(rank);
            py::dict d;
            d["tp"] = c.tp;
            d["cp"] = c.cp;
            d["dp"] = c.dp;
            d["pp"] = c.pp;
            d["dp_size"] = g.dp;
            return d;
          },
          py::arg("rank"), py::arg("world"),
          "This rank's place in Megatron's tp-cp-dp-pp grid of `world` ranks: tp, cp, dp, pp and dp_size "
          "(a ValueError, rule world_fits_layout, when world is not a multiple of tp * pp * cp).")
      .def("__eq__", [](const layout& a, const layout& b) { return same_layout(a, b); }, py::is_operator())
      .def("__repr__", &layout_repr)
      .def(py::pickle([](const layout& l) {
                        return py::make_tuple(l.tp.get(), l.pp.get(), l.vpp.get(), l.sp.get(), l.rmpad.get(),
                                              l.first_stage_layers.get(), l.last_stage_layers.get(),
                                              l.vocab_pad_multiple.get(), l.ep.get(), l.etp.get(),
                                              std::string(name_of(l.recompute.get())), l.cp.get(), l.invariant.get(),
                                              std::string(name_of(l.cp_comm.get())), l.cp_a2a.get());
                      },
                      [](const py::tuple& t) {
                        layout l;
                        l.tp = t[0].cast<std::int64_t>();
                        l.pp = t[1].cast<std::int64_t>();
                        l.vpp = t[2].cast<std::int64_t>();
                        l.sp = t[3].cast<bool>();
                        l.rmpad = t[4].cast<bool>();
                        l.first_stage_layers = t[5].cast<std::int64_t>();
                        l.last_stage_layers = t[6].cast<std::int64_t>();
                        l.vocab_pad_multiple = t[7].cast<std::int64_t>();
                        if (t.size() > 8) {  // pickled before experts existed: ep 1, etp 0
                          l.ep = t[8].cast<std::int64_t>();
                          l.etp = t[9].cast<std::int64_t>();
                        }
                        if (t.size() > 10) l.recompute = recompute_of(t[10].cast<std::string>());
                        if (t.size() > 11) l.cp = t[11].cast<std::int64_t>();
                        if (t.size() > 12) l.invariant = t[12].cast<bool>();
                        if (t.size() > 13) l.cp_comm = cp_comm_of(t[13].cast<std::string>());
                        if (t.size() > 14) l.cp_a2a = t[14].cast<std::int64_t>();
                        return l;
                      }));

  auto q = [](std::string model, const layout& l, bool critic, bool value_bias, std::optional<std::int64_t> world,
              std::optional<std::int64_t> global_batch, std::optional<std::int64_t> micro_batch,
              std::optional<std::int64_t> microbatches, std::optional<std::string> config, std::int64_t seq) {
    return question{std::move(model), l,          critic,       value_bias, world, global_batch,
                    micro_batch,      microbatches, config.value_or(""), seq};
  };
#define MEGADSL_QUESTION_ARGS                                                                                  \
  py::arg("model"), py::arg("layout"), py::arg("critic") = false, py::arg("value_bias") = true,             \
      py::arg("world") = py::none(), py::arg("global_batch") = py::none(), py::arg("micro_batch") = py::none(), \
      py::arg("microbatches") = py::none(), py::arg("config") = py::none()

  m.def(
      "_check",
      [q](std::string model, const layout& l, bool critic, bool value_bias, std::optional<std::int64_t> world,
          std::optional<std::int64_t> global_batch, std::optional<std::int64_t> micro_batch,
          std::optional<std::int64_t> microbatches, std::optional<std::string> config) {
        return check_model(q(std::move(model), l, critic, value_bias, world, global_batch, micro_batch, microbatches,
                             std::move(config), 4096));
      },
      MEGADSL_QUESTION_ARGS);
  m.def(
      "_describe",
      [q](std::string model, const layout& l, bool critic, bool value_bias, std::optional<std::int64_t> world,
          std::optional<std::int64_t> global_batch, std::optional<std::int64_t> micro_batch,
          std::optional<std::int64_t> microbatches, std::optional<std::string> config) {
        return report("describe",
                      q(std::move(model), l, critic, value_bias, world, global_batch, micro_batch, microbatches,
                        std::move(config), 4096),
                      cli::cmd_describe);
      },
      MEGADSL_QUESTION_ARGS);
  m.def(
      "_plan",
      [q](std::string model, const layout& l, bool critic, bool value_bias, std::optional<std::int64_t> world,
          std::optional<std::int64_t> global_batch, std::optional<std::int64_t> micro_batch,
          std::optional<std::int64_t> microbatches, std::optional<std::string> config, std::int64_t seq) {
        return report("plan",
                      q(std::move(model), l, critic, value_bias, world, global_batch, micro_batch, microbatches,
                        std::move(config), seq),
                      plan_command);
      },
      MEGADSL_QUESTION_ARGS, py::arg("seq") = 4096);
#undef MEGADSL_QUESTION_ARGS

  m.def(
      "presets",
      [] {
        py::list names;
        for (const preset_entry& p : presets) names.append(std::string(p.name));
        return names;
      },
      "The names of the preset models (megadsl presets).");
  m.def(
      "presets_table",
      [] {
        std::ostringstream out;
        cli::cmd_presets(out);
        return out.str();
      },
      "The table `megadsl presets` prints: name, published parameter count, shape, source.");
  m.def(
      "families_table",
      [] {
        std::ostringstream out;
        cli::cmd_families(out);
        return out.str();
      },
      "The table `megadsl families` prints: model_type, transformers class, checkpoints, presets.");
  m.def(
      "read_hf_config",
      [](const std::filesystem::path& path) {
        const hf_config c = read_hf_config(path);  // config_error: megadsl.ConfigError
        py::dict d;
        d["file"] = c.file.string();
        d["model_type"] = c.model_type;
        d["shape"] = to_string(c.s);
        d["notes"] = c.notes;
        d["dropout"] = dict_of(c.dropout);
        return d;
      },
      py::arg("path"), "config.json (or its directory) as megadsl reads it: file, model_type, shape, notes, dropout (the rates\n"
      "training steps apply: attention, residual, embedding).");
}

}  // namespace megadsl::python
