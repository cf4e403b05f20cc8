// `megadsl convert --from PATH --to PATH`: HF checkpoint <-> megadsl distributed checkpoint, any
// layout to any layout (HF -> dist, dist -> HF, dist -> dist reshards, HF -> HF e.g. a dtype
// change). The model is loaded into the target layout on its ranks (load_hf reads each rank's
// slices, load_distributed reshards), then saved (save_hf gathers to HF names, save_distributed
// writes layout-independent pieces). The source's own layout never matters.
#include <ATen/ATen.h>

#include <boost/hana/at_key.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/keys.hpp>
#include <boost/hana/string.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../src/runtime/dist_metadata.hpp"
#include "../src/spec/json_bounded.hpp"
#include "cli.hpp"
#include "megadsl/io/printable.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/models/checkpoint_model.hpp"
#include "megadsl/models/registry.hpp"
#include "megadsl/reflection.hpp"
#include "megadsl/io/hf_checkpoint.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/runtime/dist_checkpoint.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/runtime/lora_io.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl::cli {

namespace fs = std::filesystem;
namespace hana = boost::hana;
using json = nlohmann::json;

namespace {


enum class format { hf, dist };
const char* name_of(format f) { return f == format::hf ? "HF checkpoint" : "distributed checkpoint"; }

struct dtype_entry {
  std::string_view flag, safetensors;
  at::ScalarType type;
};
constexpr dtype_entry dtypes[] = {
    {"fp32", "F32", at::kFloat}, {"bf16", "BF16", at::kBFloat16}, {"fp16", "F16", at::kHalf}};

struct source {
  format kind = format::hf;
  fs::path dir;
  shape s;
  head_info head;
  std::string model_type;  // HF source: its model_type ("" for a distributed one: derived)
  std::string dtype;       // fp32 / bf16 / fp16
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;
  std::vector<fs::path> files;
  std::vector<std::string> notes;
};

[[noreturn]] void bad(const std::string& what) { throw input_error("megadsl convert: " + what); }

// metadata.json's "model"."shape" (save_distributed writes every field of megadsl::shape).
shape shape_from_json(const json& j, const std::string& file) {
  shape s = dynamic_shape;
  auto read = [&](auto& field, const json& v, const std::string& name) {
    using T = std::decay_t<decltype(field.get())>;
    if constexpr (std::is_enum_v<T>) {
      const std::string t = v.get<std::string>();
      bool found = false;
      for (T r : enum_values<T>)
        if (name_of(r) == t) field = r, found = true;
      if (!found) bad(file + ": model.shape." + name + ": unknown value \"" + printable(t) + "\"");
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      T n{};
      std::string why;
      if (!json_as_integer(v, n, why)) bad(file + ": model.shape." + name + " " + why);
      field = n;
    } else {
      field = v.get<T>();
    }
  };
  try {
    const std::string arch = j.at("architecture").get<std::string>();
    for (const family_config* f : families)
      if (f->arch->name == arch) s.arch = f->arch;
    if (s.arch == nullptr)
      bad(file + ": model.shape.architecture \"" + printable(arch) + "\" is no composition of megadsl's families "
          "(models/registry.hpp); convert it with the program that declares it (load_distributed, then save_hf)");
    hana::for_each(hana::keys(s), [&](auto key) {
      const std::string name = hana::to<char const*>(key);
      auto& v = hana::at_key(s, key);
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, rope_scaling>) {
        hana::for_each(hana::keys(v), [&](auto rkey) {
          const std::string rname = hana::to<char const*>(rkey);
          read(hana::at_key(v, rkey), j.at(name).at(rname), name + "." + rname);
        });
      } else {
        read(v, j.at(name), name);
      }
    });
    // The blocks' own config keys (a model whose composition declares them), by key: known now,
    // not dynamic (a dynamic shape's would take whatever a config gives, and the checkpoint's
    // recorded ones would be missing from the model it describes).
    s.settings = {};
    if (j.contains("settings"))
      for (const auto& [key, value] : j.at("settings").items()) {
        if (setting_index(*s.arch, key) < 0 || !value.is_number())
          bad(file + ": model.shape.settings." + printable(key) + " is no number of a config key the composition's blocks declare");
        s.settings.set(key, value.get<double>());
      }
  } catch (const json::exception& e) {
    bad(file + ": model.shape is not what save_distributed writes (" + e.what() + ")");
  }
  return s;
}

source read_source(const options& o) {
  source src;
  const fs::path from(o.from);
  std::error_code ec;
  if (!fs::exists(from, ec)) bad(o.from + ": no such file or directory");
  src.dir = fs::is_directory(from) ? from : from.parent_path();
  if (fs::exists(src.dir / "metadata.json")) {
    src.kind = format::dist;
    const std::string file = (src.dir / "metadata.json").string();
    std::ifstream in(file);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      std::string what = e.what();
      if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
      bad(file + ": not valid JSON: " + what);
    }
    if (!j.is_object() || j.value("format", std::string()) != dist_checkpoint_format)
      bad(file + ": not a megadsl distributed checkpoint (its \"format\" is not \"" +
          std::string(dist_checkpoint_format) + "\")");
    if (!j.contains("model") || !j["model"].contains("shape"))
      bad(file + ": model.shape is missing");
    if (j["model"]["shape"].is_object()) dist_metadata::fill_fields_added_later(j["model"]["shape"]);
    src.s = shape_from_json(j["model"]["shape"], file);
    const std::string head = j["model"].value("head", std::string("actor"));
    src.head.actor = head != "critic";
    src.head.value_bias = !src.head.actor && j["model"].value("value_bias", true);
    const std::string dt = j.value("dtype", std::string("F32"));
    for (const dtype_entry& d : dtypes)
      if (d.safetensors == dt) src.dtype = std::string(d.flag);
    if (src.dtype.empty()) src.dtype = "fp32";
    for (const json& f : j.value("files", json::array())) {
      src.files.push_back(src.dir / f.value("file", std::string()));
      src.bytes += f.value("bytes", std::uint64_t{0});
      src.tensors += f.value("pieces", json::array()).size();
    }
    if (o.critic_given && src.head.actor)
      throw usage_error("megadsl convert: --critic, but " + o.from + " holds an actor (an LM head); drop --critic");
    if (o.critic_given && o.head.value_bias != src.head.value_bias)
      throw usage_error("megadsl convert: " + o.from + " holds a critic " +
                        (src.head.value_bias ? "with" : "without") + " a value-head bias; drop --no-value-bias");
    return src;
  }
  if (!fs::exists(src.dir / "config.json"))
    bad(o.from + " is neither an HF model directory (config.json and safetensors) nor a megadsl distributed "
                 "checkpoint (metadata.json)");
  hf_config cfg = read_hf_config(src.dir);
  src.kind = format::hf;
  src.s = cfg.s;
  src.model_type = cfg.model_type;
  src.notes = std::move(cfg.notes);
  src.head = o.head;
  const hf_checkpoint c = hf_checkpoint::open(src.dir);
  src.tensors = c.size();
  src.bytes = c.total_bytes();
  for (const safetensors_file& f : c.files()) src.files.push_back(f.path());
  const std::vector<std::string> names = c.names();
  const tensor_info* t = c.find("model.embed_tokens.weight");
  if (t == nullptr && !names.empty()) t = &c.at(names.front());
  src.dtype = "fp32";
  if (t != nullptr)
    for (const dtype_entry& d : dtypes)
      if (d.type == t->dtype) src.dtype = std::string(d.flag);
  return src;
}

std::string size_text(std::uint64_t bytes) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  if (bytes >= (1ull << 30)) s << static_cast<double>(bytes) / (1ull << 30) << " GiB";
  else if (bytes >= (1ull << 20)) s << static_cast<double>(bytes) / (1ull << 20) << " MiB";
  else s << static_cast<double>(bytes) / 1024.0 << " KiB";
  return s.str();
}

struct plan {
  source src;
  format target = format::dist;
  std::string dtype;
  at::ScalarType type = at::kFloat;
};

struct rules_violated {};

plan prepare(const options& o, const job& j, std::ostream& err) {
  plan p;
  p.src = read_source(o);
  p.target = o.to_format.empty() ? (p.src.kind == format::hf ? format::dist : format::hf)
                                  : (o.to_format == "hf" ? format::hf : format::dist);
  p.dtype = o.dtype.empty() ? p.src.dtype : o.dtype;
  for (const dtype_entry& d : dtypes)
    if (d.flag == p.dtype) p.type = d.type;

  model_arg m;
  m.name = o.from;
  m.s = p.src.s;
  m.notes = p.src.notes;
  options checked = o;
  checked.facts.world = j.world;
  checked.head = p.src.head;
  std::ostringstream said;
  const bool ok = validate(m, checked, said);
  if (j.speaks()) err << said.str() << std::flush;
  if (!ok) throw rules_violated{};

  const fs::path to(o.to);
  std::error_code ec;
  if (fs::exists(to, ec) && !fs::is_directory(to, ec)) bad(o.to + ": exists and is not a directory");
  if (fs::exists(to, ec) && fs::equivalent(to, p.src.dir, ec))
    throw usage_error("megadsl convert: --to " + o.to + " is the source itself; write to another directory");
  try {  // a --to that holds the source (or lies inside it) would delete it when replaced
    refuse_target_over_source(to, p.src.dir, p.target == format::hf ? "an HF checkpoint" : "a distributed checkpoint",
                              /*overwrite_checkpoint=*/false);
  } catch (const checkpoint_error& e) {
    throw usage_error(e.what());
  }
  if (!o.merge_lora.empty() && p.target != format::hf)
    throw usage_error("megadsl convert: --merge-lora writes an HF checkpoint with the adapter merged; use --to-format hf "
                      "(a distributed checkpoint does not carry adapters yet)");
  if (fs::exists(to, ec) && p.target == format::hf && fs::exists(to / "metadata.json", ec))
    bad(o.to + " holds a distributed checkpoint; write the HF checkpoint to another directory");
  if (fs::exists(to, ec) && p.target == format::dist && !fs::exists(to / "metadata.json", ec) &&
      !fs::is_empty(to, ec))
    bad(o.to + " exists and is not a distributed checkpoint; writing one there would replace the whole directory");
  const fs::path parent = to.has_parent_path() ? to.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  if (!fs::is_directory(parent, ec)) bad(o.to + ": cannot create its directory " + parent.string());
  return p;
}

template <class Spec>
void convert(parallel_groups& groups, std::int64_t world, const options& o, const plan& p, bool speak, std::ostream& out,
             std::ostream& err) {
  model_options mo;
  // A distributed checkpoint stores the parameters as they are; save_hf gathers them first (Gloo
  // gathers no bf16) and converts what it writes.
  mo.dtype = p.target == format::dist ? p.type : at::kFloat;
  // The source's dropout rates are written back as they were (a conversion trains nothing).
  if (p.src.kind == format::hf) {
    const hf_config cfg = read_hf_config(p.src.dir);
    mo.attention_window = cfg.attention_window;
    mo.dropout = cfg.dropout;
    check_before_load(p.src.dir, p.src.s, o.l, p.src.head, at::elementSize(mo.dtype), local_world_size());
  } else if (const fs::path carried = hf_files_of(p.src.dir); !carried.empty() && fs::is_regular_file(carried / "config.json")) {
    // The HF checkpoint it was made from: its dropout, and its attention window (a windowed family's
    // config class cannot describe the model without it).
    const hf_config cfg = read_hf_config(carried);
    mo.dropout = cfg.dropout;
    mo.attention_window = cfg.attention_window;
  }
  parallel_model<Spec> model(groups, mo, p.src.s, o.l);
  progress bar(err, speak);
  bar.start("megadsl convert: loading " + std::string(name_of(p.src.kind)) + " " + p.src.dir.string() + " (" +
                std::to_string(p.src.tensors) + (p.src.kind == format::hf ? " tensors, " : " pieces, ") +
                size_text(p.src.bytes) + ")",
            p.src.files);
  hf_name_map names;  // where an HF source stores its text model (a multimodal one's adapters are named so)
  if (p.src.kind == format::hf) {
    const hf_load_report r = load_hf(model, groups, p.src.dir);
    names = r.names;
    bar.finish();
    if (speak) {
      for (const std::string& n : r.notes) err << "note: " << n << '\n';
      std::string used;  // a critic's value head is listed among the other heads' tensors
      for (const std::string& n : r.notes)
        if (n.starts_with("value head loaded from ")) used = n.substr(23, n.find('*', 23) - 23);
      std::string names;
      for (const std::string& n : r.ignored)
        if (used.empty() || !n.starts_with(used)) names += (names.empty() ? "" : ", ") + printable(n);
      if (!names.empty()) {
        err << "note: not converted, this model does not use them: " << names << '\n';
      }
    }
  } else {
    load_distributed(model.parameters(), model.config(), groups, p.src.dir, {.training_state = false});
    bar.finish();
  }
  bar.start("megadsl convert: writing " + std::string(name_of(p.target)) + " " + o.to);
  // The tokenizer files, generation_config.json and config.json's other fields come along.
  // A distributed checkpoint keeps them in its hf/ folder, from which they come back.
  if (!o.merge_lora.empty())  // this rank's shards of the adapter, merged by save_hf
    model.attach_lora(load_peft_adapter(o.merge_lora, model.config(), groups.me.tp, model.parameters(), names));
  if (p.target == format::hf) {
    save_hf(model, groups, o.to, p.type, p.src.model_type, hf_files_of(p.src.dir), /*merge_lora=*/!o.merge_lora.empty());
  } else {
    checkpoint_extras extras;
    extras.hf_files = hf_files_of(p.src.dir);
    save_distributed(model.parameters(), model.config(), groups, o.to, extras);
  }
  groups.world->barrier();  // every rank has written its part
  bar.finish();
  if (speak)
    out << "megadsl convert: wrote " << name_of(p.target) << " " << o.to << " (" << p.dtype << ", "
        << (p.src.head.actor ? "actor" : "critic") << ") from " << name_of(p.src.kind) << " " << o.from
        << ", through the layout tp=" << o.l.tp.get() << " pp=" << o.l.pp.get() << " vpp=" << o.l.vpp.get() << " on "
        << world << " rank(s)\n"
        << std::flush;
}

}  // namespace

int cmd_convert(const options& o, const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  job j;
  plan p;
  if (int rc = report_errors(err, true, [&] {
        j = job_of(o);
        return 0;
      }))
    return rc;
  if (int rc = report_errors(err, j.speaks() || !j.launched, [&] {
        try {
          p = prepare(o, j, err);
        } catch (const rules_violated&) {
          return exit_invalid;
        }
        return 0;
      }))
    return rc;
  return run_job(j, argv, err, [&](distributed& d) {
    auto groups = parallel_groups::build(d, o.l);
    const bool speak = d.rank() == 0;
    with_checkpoint_model(p.src.head, [&](auto spec) {
      convert<typename decltype(spec)::type>(groups, d.world(), o, p, speak, out, err);
    });
    return 0;
  });
}

}  // namespace megadsl::cli
