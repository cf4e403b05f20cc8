// Distributed checkpoints (include/megadsl/runtime/dist_checkpoint.hpp): pieces of HF tensors
// with global offsets, written by their main replicas; any layout reads them back.
// Over 600 lines on purpose: writing, reading and resharding share the pieces' geometry and the
// manifest's checks (one anonymous namespace); apart, those helpers would become an interface.
#include "megadsl/runtime/dist_checkpoint.hpp"
#include "megadsl/runtime/lora_io.hpp"
#include "megadsl/reflection.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <unistd.h>

#include <boost/hana/at_key.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/keys.hpp>
#include <boost/hana/string.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <optional>
#include <set>
#include <sstream>

#include "megadsl/hf_config.hpp"
#include "megadsl/io/atomic_file.hpp"
#include "megadsl/io/printable.hpp"
#include "checkpoint_dir.hpp"
#include "dist_metadata.hpp"
#include "../spec/json_bounded.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/runtime/shard_io.hpp"

namespace megadsl {
namespace {

using namespace dist_metadata;
using dist_metadata::whole;  // beside whole(const dims&) below

namespace fs = std::filesystem;
namespace hana = boost::hana;
using json = nlohmann::json;

constexpr const char* moment_names[] = {"optimizer.exp_avg/", "optimizer.exp_avg_sq/"};

// 64-bit FNV-1a of the bytes of a contiguous CPU tensor.
std::uint64_t fnv1a64(const at::Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  const std::size_t n = static_cast<std::size_t>(t.numel()) * t.element_size();
  std::uint64_t h = 14695981039346656037ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

// The same hash over a file's bytes, read in 1 MB blocks.
std::uint64_t fnv1a64_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw checkpoint_error("megadsl: cannot read " + path.string());
  std::vector<char> block(std::size_t{1} << 20);
  std::uint64_t h = 14695981039346656037ULL;
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(block[i])) * 1099511628211ULL;
  }
  return h;
}

std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- geometry: axis-aligned boxes in a tensor of rank 1 or 2 ------------------------------------

box whole(const dims& d) { return {d.rank, {0, 0}, {d.rows, d.rank == 2 ? d.cols : 1}}; }
box along(box b, int dim, std::int64_t offset, std::int64_t extent) {
  b.off[static_cast<std::size_t>(dim)] = offset;
  b.len[static_cast<std::size_t>(dim)] = extent;
  return b;
}
box intersect(const box& a, const box& b) {
  box out = a;
  for (std::size_t d = 0; d < 2; ++d) {
    const std::int64_t lo = std::max(a.off[d], b.off[d]), hi = std::min(a.off[d] + a.len[d], b.off[d] + b.len[d]);
    out.off[d] = lo;
    out.len[d] = std::max<std::int64_t>(0, hi - lo);
  }
  return out;
}
// `b` shifted by -from.off + to.off (a region of one tensor seen in another's coordinates).
box moved(box b, const box& from, const box& to) {
  for (std::size_t d = 0; d < 2; ++d) b.off[d] += to.off[d] - from.off[d];
  return b;
}
at::Tensor narrow(at::Tensor t, const box& b) {
  for (int d = 0; d < b.rank; ++d)
    t = t.narrow(d, b.off[static_cast<std::size_t>(d)], b.len[static_cast<std::size_t>(d)]);
  return t;
}
std::vector<std::int64_t> offsets(const box& b) {
  return b.rank == 1 ? std::vector<std::int64_t>{b.off[0]} : std::vector<std::int64_t>{b.off[0], b.off[1]};
}
std::vector<std::int64_t> extents(const box& b) {
  return b.rank == 1 ? std::vector<std::int64_t>{b.len[0]} : std::vector<std::int64_t>{b.len[0], b.len[1]};
}
std::vector<std::int64_t> dims_vec(const dims& d) {
  return d.rank == 1 ? std::vector<std::int64_t>{d.rows} : std::vector<std::int64_t>{d.rows, d.cols};
}

std::string piece_key(const std::string& tensor, const box& global) {
  std::string k = tensor + "@";
  const auto off = offsets(global);
  for (std::size_t i = 0; i < off.size(); ++i) k += (i ? "," : "") + std::to_string(off[i]);
  return k;
}

// ---- parameters and their HF names ---------------------------------------------------------------

// The HF tensor behind slot `slot` of a parameter; a tied lm_head's copy is the embedding.
std::string source_name(const param_plan& p, int slot, param_instance at) {
  if (p.tied) return std::string(p.tied_source);
  return hf_key(*p.row, slot, at);  // an expert's slice of a stack (gpt-oss): "name[e]"
}

// Which ranks write: the main replica of each dense parameter is dp (and cp) rank 0's; an
// expert's, with ep > 1, is its expert-data-parallel rank 0's: dp-cp ranks 0 .. ep - 1 (cp +
// cp_size * dp), each holding other experts (the expert grid's ep rank is the dp-cp rank % ep).
bool writes_dense(const rank_coords& rc) { return rc.dp == 0 && rc.cp == 0; }
bool writes_experts(const rank_coords& rc, const layout& l) { return rc.cp + l.cp.get() * rc.dp < l.ep.get(); }

struct needed_tensor {
  std::string name;
  dims shape;
};

// Every HF tensor of the model (a tied lm_head is the embedding), in table order.
std::vector<needed_tensor> model_tensors(const runtime_config& c) {
  std::vector<needed_tensor> out;
  for (const param_plan& p : plan_params(c.s, c.l, c.head)) {
    if (p.tied) continue;
    for (std::int64_t k = 0; k < instances(*p.row, c.s); ++k)
      for (int i = 0; i < p.row->hf_count && exists(*p.row, c.s, k); ++i)
        out.push_back({source_name(p, i, instance_of(*p.row, c.s, k)), p.hf_shapes[static_cast<std::size_t>(i)]});
  }
  return out;
}

// ---- the model as metadata.json describes it -----------------------------------------------------

json model_json(const runtime_config& c) {
  json shape_j = dist_metadata::shape_json(c.s);
  shape_j["head_dim"] = effective_head_dim(c.s).get();  // what it means, not how it was declared
  shape_j["architecture"] = std::string(arch_of(c.s).name);
  return {{"shape", shape_j},
          {"head", c.head.actor ? "actor" : "critic"},
          {"value_bias", !c.head.actor && c.head.value_bias}};
}

json layout_json(const layout& l) {
  json j = json::object();
  hana::for_each(hana::keys(l), [&](auto key) { j[hana::to<char const*>(key)] = dist_metadata::value_json(hana::at_key(l, key)); });
  return j;
}

// "layers: checkpoint 8, this model 4" for every leaf where the two differ.
void diff_json(const json& saved, const json& mine, const std::string& path, std::vector<std::string>& out) {
  if (saved.is_object() && mine.is_object()) {
    std::set<std::string> keys;
    for (auto it = saved.begin(); it != saved.end(); ++it) keys.insert(it.key());
    for (auto it = mine.begin(); it != mine.end(); ++it) keys.insert(it.key());
    for (const auto& k : keys) {
      const std::string sub = path.empty() ? printable(k) : path + "." + printable(k);
      if (!saved.contains(k)) out.push_back(sub + ": not in the checkpoint, this model " + mine[k].dump(-1, ' ', true));
      else if (!mine.contains(k)) out.push_back(sub + ": checkpoint " + saved[k].dump(-1, ' ', true) + ", not in this model");
      else diff_json(saved[k], mine[k], sub, out);
    }
    return;
  }
  if (saved != mine) out.push_back(path + ": checkpoint " + saved.dump(-1, ' ', true) + ", this model " + mine.dump(-1, ' ', true));
}

// ---- agreement: every rank throws the same error, or none does ------------------------------------

const comm_group& world_of(const parallel_groups& g) {
  if (g.world == nullptr)
    throw std::logic_error("megadsl: distributed checkpoints need parallel_groups::world (built by "
                           "parallel_groups::build and ::single)");
  return *g.world;
}

template <class F>
std::string attempt(F&& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return one_line(e.what());
  }
}

// ---- saving -------------------------------------------------------------------------------------

fs::path normalized(const fs::path& dir) {
  fs::path d = fs::absolute(dir).lexically_normal();
  if (!d.has_filename()) d = d.parent_path();
  return d;
}

fs::path rank_file(std::int64_t rank) { return "rank_" + std::to_string(rank) + ".safetensors"; }

bool is_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / manifest_name, ec)) return false;
  std::ifstream in(dir / manifest_name);
  if (!in) return false;
  try {
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const json j = parse_json_bounded(text, std::size_t{256} << 20, [](const std::string& p) { throw std::runtime_error(p); });
    return j.is_object() && j.value("format", std::string()) == dist_checkpoint_format;
  } catch (const std::exception&) {
    return false;
  }
}

// This rank's pieces: values, and AdamW's moments when `training` holds them.
std::vector<std::pair<std::string, at::Tensor>> main_pieces(const std::vector<named_parameter>& params,
                                                            const runtime_config& c, const rank_coords& me,
                                                            const training_state* training, json& described) {
  const std::int64_t tp_rank = me.tp;
  const bool moments = training != nullptr && !training->exp_avg.empty();
  if (moments && (training->exp_avg.size() != params.size() || training->exp_avg_sq.size() != params.size()))
    throw std::invalid_argument("megadsl: save_distributed: the training state has " +
                                std::to_string(training->exp_avg.size()) + " AdamW moments for " +
                                std::to_string(params.size()) + " parameters; expected one per parameter");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const named_parameter& p = params[i];
    const param_plan& plan = *p.plan;
    if (!(plan.row->where == placement::expert ? writes_experts(me, c.l) : writes_dense(me))) continue;
    std::vector<std::pair<std::string, at::Tensor>> sources{{"", p.tensor}};
    if (moments) {
      sources.emplace_back(moment_names[0], training->exp_avg[i]);
      sources.emplace_back(moment_names[1], training->exp_avg_sq[i]);
    }
    for (const auto& [prefix, t] : sources) {
      if (!t.defined() || t.sizes() != p.tensor.sizes())
        throw std::invalid_argument("megadsl: save_distributed: " +
                                    (prefix.empty() ? std::string("parameter ")
                                                    : "the AdamW " + prefix.substr(10, prefix.size() - 11) + " of ") +
                                    p.name + " has shape " + (t.defined() ? c10::str(t.sizes()) : "(undefined)") +
                                    ", expected the parameter's " + c10::str(p.tensor.sizes()));
      const at::Tensor src = t.detach();
      for (const shard_piece& x : shard_pieces(plan, c.s, c.l, tp_rank, piece_set::main_replica)) {
        const dims& hf = plan.hf_shapes[static_cast<std::size_t>(x.slot)];
        const box global = along(whole(hf), x.dim, x.global_offset, x.extent);
        const box local = along(whole(plan.local), x.dim, x.local_offset, x.extent);
        const std::string tensor = prefix + source_name(plan, x.slot, p.at);
        const std::string key = piece_key(tensor, global);
        at::Tensor piece = narrow(src, local).to(at::kCPU).contiguous();
        const std::string_view dtype = safetensors_dtype_name(piece.scalar_type());
        if (dtype.empty())
          throw std::invalid_argument("megadsl: save_distributed: " + p.name + " has dtype " +
                                      std::string(c10::toString(piece.scalar_type())) + ", which safetensors cannot store");
        described[key] = json{{"tensor", tensor},
                              {"global_shape", dims_vec(hf)},
                              {"global_offset", offsets(global)},
                              {"dtype", std::string(dtype)},
                              {"fnv1a64", hex16(fnv1a64(piece))}}
                             .dump();
        out.emplace_back(key, std::move(piece));
      }
    }
  }
  return out;
}

// Rank 0, after every rank file exists: metadata.json from the files' own headers.
json build_manifest(const fs::path& staging, const runtime_config& c, const parallel_groups& g,
                    const std::vector<named_parameter>& params, const checkpoint_extras& extras) {
  json files = json::array();
  for (std::int64_t r = 0; r < g.grid.world(); ++r) {
    const rank_coords rc = g.grid.coords(r);
    if (!writes_dense(rc) && !writes_experts(rc, c.l)) continue;
    const safetensors_file f = safetensors_file::open(staging / rank_file(r));
    json pieces = json::array();
    for (const tensor_info& t : f.tensors()) {
      const auto it = f.metadata().find(t.name);
      if (it == f.metadata().end())
        throw checkpoint_error("megadsl: " + f.path().string() + ": piece " + printable(t.name) + " has no metadata entry");
      json piece = json::parse(it->second);
      piece["key"] = t.name;
      piece["shape"] = t.shape;
      pieces.push_back(piece);
    }
    files.push_back({{"file", rank_file(r).string()},
                     {"rank", r},
                     {"coords", {{"tp", rc.tp}, {"cp", rc.cp}, {"dp", rc.dp}, {"pp", rc.pp}}},
                     {"bytes", f.file_bytes()},
                     {"pieces", pieces}});
  }
  json m = json::object();
  m["format"] = dist_checkpoint_format;
  m["version"] = dist_checkpoint_version;
  m["checksum"] = "fnv1a64: 64-bit FNV-1a of each piece's bytes as stored, 16 hex digits";
  m["model"] = model_json(c);
  m["dtype"] = params.empty() ? std::string("F32") : std::string(safetensors_dtype_name(params.front().tensor.scalar_type()));
  m["layout"] = layout_json(c.l);
  m["grid"] = {{"tp", g.grid.tp}, {"cp", g.grid.cp}, {"dp", g.grid.dp}, {"pp", g.grid.pp}};
  if (extras.training) {
    const training_state& t = *extras.training;
    m["training"] = {{"steps", t.steps},
                     {"samples", t.samples},
                     {"adam_step", t.adam_step},
                     {"moments", !t.exp_avg.empty()}};
  } else {
    m["training"] = nullptr;
  }
  m["files"] = files;
  // hf/'s files (tokenizer, configs, a multimodal source's other tensors) with their sizes and
  // checksums, as the pieces have theirs: a load that finds one changed or gone says so.
  json hf = json::array();
  std::vector<fs::path> hf_files;
  std::error_code ec;
  if (fs::is_directory(staging / "hf", ec))
    for (const auto& e : fs::directory_iterator(staging / "hf", ec))
      if (e.is_regular_file(ec)) hf_files.push_back(e.path());
  std::sort(hf_files.begin(), hf_files.end());
  for (const fs::path& f : hf_files)
    hf.push_back({{"file", "hf/" + f.filename().string()}, {"bytes", fs::file_size(f)}, {"fnv1a64", hex16(fnv1a64_file(f))}});
  m["hf_files"] = hf;
  return m;
}

// ---- loading ------------------------------------------------------------------------------------

manifest read_manifest(const fs::path& dir) {
  manifest m;
  m.dir = dir;
  const fs::path path = dir / manifest_name;
  if (!fs::is_directory(dir))
    throw checkpoint_error("megadsl: distributed checkpoint " + dir.string() + " does not exist or is not a directory");
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))  // a FIFO would block the open
    throw checkpoint_error(m.where() + ": " + manifest_name + " is not a regular file (a FIFO, a device or a directory)");
  std::ifstream in(path);
  if (!in)
    throw checkpoint_error(m.where() + ": " + manifest_name + " is missing; a save that did not finish leaves none, "
                           "so this is not a complete megadsl distributed checkpoint");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_manifest(text, dir);
}

void check_model(const manifest& m, const runtime_config& c) {
  std::vector<std::string> diffs;
  diff_json(m.model, model_json(c), "", diffs);
  if (diffs.empty()) return;
  std::string msg = m.where() + " holds another model: ";
  for (std::size_t i = 0; i < diffs.size(); ++i) msg += (i ? "; " : "") + diffs[i];
  throw checkpoint_error(one_line(msg + "; fix: load it into the model that saved it (metadata.json \"model\")"));
}

std::string first_pieces(const manifest& m, const saved_file& f) {
  if (f.pieces.empty()) return "no pieces";
  std::string s = m.pieces[f.pieces.front()].key;
  if (f.pieces.size() > 1) s += " and " + std::to_string(f.pieces.size() - 1) + " more pieces";
  return s;
}

// hf/ as the manifest lists it: each file there, whole and unchanged, and no other (a checkpoint
// saved before hf/ was listed is not checked).
void check_hf_files(const manifest& m) {
  if (!m.hf_files) return;
  std::set<std::string> listed;
  for (const saved_extra& e : *m.hf_files) {
    listed.insert(e.name);
    const fs::path path = m.dir / e.name;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec)
      throw checkpoint_error(m.where() + ": " + printable(e.name) + " is missing (" + ec.message() +
                             "); metadata.json lists it, and a save back to HF would lose it");
    if (size != e.bytes)
      throw checkpoint_error(m.where() + ": " + printable(e.name) + " has " + std::to_string(size) +
                             " bytes, metadata.json records " + std::to_string(e.bytes) + " (truncated or replaced)");
    if (const std::uint64_t sum = fnv1a64_file(path); sum != e.checksum)
      throw checkpoint_error(m.where() + ": " + printable(e.name) + " fails its checksum (fnv1a64 " + hex16(sum) +
                             ", metadata.json records " + hex16(e.checksum) + "); the file is corrupted");
  }
  std::error_code ec;
  if (fs::is_directory(m.dir / "hf", ec))
    for (const auto& e : fs::directory_iterator(m.dir / "hf", ec))
      if (listed.count("hf/" + e.path().filename().string()) == 0)
        throw checkpoint_error(m.where() + ": hf/" + printable(e.path().filename().string()) +
                               " is not in metadata.json (added after the save); remove it, or save the checkpoint again");
}

void check_files(const manifest& m) {
  for (const saved_file& f : m.files) {
    const fs::path path = m.dir / f.name;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec)
      throw checkpoint_error(m.where() + ": " + f.name + " is missing (" + ec.message() + "); it holds " + first_pieces(m, f));
    if (size != f.bytes)
      throw checkpoint_error(m.where() + ": " + f.name + " has " + std::to_string(size) + " bytes, metadata.json records " +
                             std::to_string(f.bytes) + " (truncated or replaced); it holds " + first_pieces(m, f));
  }
}

// Every element of every needed tensor in exactly one saved piece.
void check_coverage(const manifest& m, const std::string& tensor, const dims& want) {
  const auto it = m.by_tensor.find(tensor);
  if (it == m.by_tensor.end())
    throw checkpoint_error(m.where() + ": tensor " + tensor + " " + shape_text(dims_vec(want)) +
                           " is in no saved piece; the checkpoint does not hold it");
  const std::vector<std::size_t>& ids = it->second;
  for (std::size_t id : ids) {
    const saved_piece& p = m.pieces[id];
    if (p.global_shape != dims_vec(want))
      throw checkpoint_error(m.where() + ": piece " + p.key + " in " + m.files[p.file].name + " says tensor " + tensor +
                             " has shape " + shape_text(p.global_shape) + "; this model's is " + shape_text(dims_vec(want)));
  }
  // Cells between the pieces' boundaries: each must be covered exactly once.
  const box all = whole(want);
  std::array<std::vector<std::int64_t>, 2> cuts;
  for (std::size_t d = 0; d < 2; ++d) {
    cuts[d] = {0, all.len[d]};
    for (std::size_t id : ids) {
      cuts[d].push_back(m.pieces[id].where.off[d]);
      cuts[d].push_back(m.pieces[id].where.off[d] + m.pieces[id].where.len[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  const std::size_t nx = cuts[0].size() - 1, ny = cuts[1].size() - 1;
  std::vector<int> count(nx * ny, 0);
  auto index = [&](std::size_t d, std::int64_t v) {
    return static_cast<std::size_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), v) - cuts[d].begin());
  };
  for (std::size_t id : ids) {
    const box& b = m.pieces[id].where;
    if (b.empty()) continue;
    for (std::size_t x = index(0, b.off[0]); x < index(0, b.off[0] + b.len[0]); ++x)
      for (std::size_t y = index(1, b.off[1]); y < index(1, b.off[1] + b.len[1]); ++y) ++count[x * ny + y];
  }
  for (std::size_t x = 0; x < nx; ++x)
    for (std::size_t y = 0; y < ny; ++y) {
      const int n = count[x * ny + y];
      if (n == 1) continue;
      box cell = all;
      cell.off = {cuts[0][x], cuts[1][y]};
      cell.len = {cuts[0][x + 1] - cuts[0][x], cuts[1][y + 1] - cuts[1][y]};
      if (n == 0)
        throw checkpoint_error(m.where() + ": tensor " + tensor + " " + shape_text(dims_vec(want)) + ": elements " +
                               region_text(cell) + " are in no saved piece (a gap; metadata.json lists " +
                               std::to_string(ids.size()) + (ids.size() == 1 ? " piece" : " pieces") + " of it)");
      std::string holders;
      for (std::size_t id : ids)
        if (!intersect(m.pieces[id].where, cell).empty())
          holders += (holders.empty() ? "" : ", ") + m.pieces[id].key + " (" + m.files[m.pieces[id].file].name + ")";
      throw checkpoint_error(m.where() + ": tensor " + tensor + " " + shape_text(dims_vec(want)) + ": elements " +
                             region_text(cell) + " are in " + std::to_string(n) + " saved pieces (an overlap): " + holders);
    }
}

// Opens files on first use and verifies each piece (presence, dtype, shape, checksum) once.
class piece_reader {
 public:
  explicit piece_reader(const manifest& m) : m_(m) {}

  at::Tensor view(std::size_t id) {
    const saved_piece& p = m_.pieces[id];
    const std::string& file = m_.files[p.file].name;
    auto it = files_.find(p.file);
    if (it == files_.end()) {
      try {
        it = files_.emplace(p.file, safetensors_file::open(m_.dir / file)).first;
      } catch (const std::exception& e) {
        throw checkpoint_error(one_line(m_.where() + ": " + file + " (needed for " + p.key + ") cannot be read: " + e.what()));
      }
    }
    const safetensors_file& f = it->second;
    const tensor_info* t = f.find(p.key);
    if (t == nullptr)
      throw checkpoint_error(m_.where() + ": " + file + " does not hold piece " + p.key + ", which metadata.json lists in it");
    const std::vector<std::int64_t> shape = extents(p.where);
    if (t->shape != shape || safetensors_dtype_name(t->dtype) != p.dtype)
      throw checkpoint_error(m_.where() + ": " + file + ": piece " + p.key + " is " +
                             std::string(safetensors_dtype_name(t->dtype)) + " " + shape_text(t->shape) +
                             ", metadata.json records " + p.dtype + " " + shape_text(shape));
    at::Tensor v = f.view(p.key);
    if (verified_.insert(id).second) {
      const std::uint64_t sum = fnv1a64(v.contiguous());
      if (sum != p.checksum)
        throw checkpoint_error(m_.where() + ": " + file + ": piece " + p.key + " fails its checksum (fnv1a64 " + hex16(sum) +
                               ", metadata.json records " + hex16(p.checksum) + "); the file is corrupted");
    }
    return v;
  }

 private:
  const manifest& m_;
  std::map<std::size_t, safetensors_file> files_;
  std::set<std::size_t> verified_;
};

// This rank's local shard of `p` (values, or the moment under `prefix`), from the saved pieces.
at::Tensor build_local(const named_parameter& p, const runtime_config& c, std::int64_t tp_rank, const manifest& m,
                       piece_reader& reader, const std::string& prefix) {
  const param_plan& plan = *p.plan;
  at::Tensor out = at::zeros(dims_vec(plan.local), p.tensor.options().device(at::kCPU));  // vocab padding stays 0
  for (const shard_piece& x : shard_pieces(plan, c.s, c.l, tp_rank, piece_set::all)) {
    const dims& hf = plan.hf_shapes[static_cast<std::size_t>(x.slot)];
    const box global = along(whole(hf), x.dim, x.global_offset, x.extent);
    const box local = along(whole(plan.local), x.dim, x.local_offset, x.extent);
    const std::string tensor = prefix + source_name(plan, x.slot, p.at);
    for (std::size_t id : m.by_tensor.at(tensor)) {
      const box overlap = intersect(global, m.pieces[id].where);
      if (overlap.empty()) continue;
      narrow(out, moved(overlap, global, local)).copy_(narrow(reader.view(id), moved(overlap, m.pieces[id].where, whole(extents(m.pieces[id].where)))));
    }
  }
  return out;
}

}  // namespace

void save_distributed(const std::vector<named_parameter>& params, const runtime_config& config,
                      const parallel_groups& groups, const fs::path& dir, const checkpoint_extras& extras) {
  const comm_group& world = world_of(groups);
  const fs::path target = normalized(dir);
  const bool first = world.rank() == 0;

  // Every rank writes into the same fresh sibling directory: rank 0 names it.
  const fs::path staging = staging_name(world, target);
  const cleanup_on_signal staging_cleanup(staging, /*directory=*/true);  // a SIGTERM leaves no half-written copy
  std::optional<target_lock> lock;

  auto step = [&](const std::function<void()>& f) { save_step(world, staging, f); };

  step([&] {
    if (!first) return;
    refuse_target_over_source(target, extras.hf_files, "a distributed checkpoint", /*overwrite_checkpoint=*/true);
    lock.emplace(target);
    remove_stale_staging(target);
    std::error_code ec;
    if (fs::exists(target, ec)) {
      if (!fs::is_directory(target))
        throw checkpoint_error("megadsl: cannot save a distributed checkpoint to " + target.string() +
                               ": it exists and is not a directory");
      if (!fs::is_empty(target) && !is_checkpoint(target))
        throw checkpoint_error("megadsl: cannot save a distributed checkpoint to " + target.string() +
                               ": it holds files that are not a megadsl distributed checkpoint, which saving would "
                               "replace; choose a new or empty directory");
    }
    fs::create_directories(target.parent_path(), ec);
    if (!fs::create_directory(staging, ec) || ec)
      throw checkpoint_error("megadsl: cannot save a distributed checkpoint to " + target.string() + ": cannot create " +
                             staging.string() + (ec ? ": " + ec.message() : ": it exists"));
  });

  step([&] {
    if (!writes_dense(groups.me) && !writes_experts(groups.me, config.l)) return;  // dp replicas
    json described = json::object();
    const auto pieces = main_pieces(params, config, groups.me, extras.training ? &*extras.training : nullptr, described);
    std::map<std::string, std::string> meta{{"format", std::string(dist_checkpoint_format)},
                                            {"version", std::to_string(dist_checkpoint_version)},
                                            {"rank", std::to_string(world.ranks()[static_cast<std::size_t>(world.rank())])}};
    for (auto it = described.begin(); it != described.end(); ++it) meta[it.key()] = it.value().get<std::string>();
    write_safetensors(staging / rank_file(world.ranks()[static_cast<std::size_t>(world.rank())]), pieces, meta);
  });

  step([&] {
    if (!first) return;
    copy_hf_files(extras.hf_files, staging / "hf", /*with_config=*/true);
    carry_multimodal_part(extras.hf_files, staging / "hf",
                          std::string(model_type_for(config.s, config.options.attention_window)));
    if (extras.write_also) extras.write_also(staging);
    const json m = build_manifest(staging, config, groups, params, extras);
    write_file_atomically(staging / manifest_name, m.dump(1) + "\n");
    fsync_dir(staging);
    move_into_place(staging, target);
  });
}

checkpoint_extras load_distributed(std::vector<named_parameter>& params, const runtime_config& config,
                                   const parallel_groups& groups, const fs::path& dir, const dist_load_options& options) {
  const comm_group& world = world_of(groups);
  std::vector<at::Tensor> values;
  checkpoint_extras extras;
  const std::string error = attempt([&] {
    const manifest m = read_manifest(dir);
    check_model(m, config);
    check_files(m);
    if (world.rank() == 0) check_hf_files(m);  // one reader: the ranks agree on its verdict below
    const bool moments = options.training_state && m.training && m.moments;
    std::set<std::string> known;
    for (const needed_tensor& t : model_tensors(config)) {
      check_coverage(m, t.name, t.shape);
      known.insert(t.name);
      for (const char* prefix : moment_names) known.insert(prefix + t.name);
      if (moments)
        for (const char* prefix : moment_names) check_coverage(m, prefix + t.name, t.shape);
    }
    // The metadata and the pieces describe one model: a piece of a tensor that model does not
    // have (a layer beyond its count, another head) means they disagree.
    for (const auto& [tensor, ids] : m.by_tensor)
      if (known.count(tensor) == 0)
        throw checkpoint_error(one_line(m.where() + ": piece " + m.pieces[ids.front()].key + " in " +
                                        m.files[m.pieces[ids.front()].file].name + " holds tensor " + tensor +
                                        ", which is not part of the model metadata.json describes; the metadata and the "
                                        "pieces disagree (an edited or mixed checkpoint)"));
    piece_reader reader(m);
    const std::int64_t tp_rank = groups.me.tp;
    for (const named_parameter& p : params) {
      values.push_back(build_local(p, config, tp_rank, m, reader, ""));
      if (values.back().sizes() != p.tensor.sizes())
        throw std::invalid_argument("megadsl: load_distributed: parameter " + p.name + " has shape " +
                                    c10::str(p.tensor.sizes()) + ", but its plan under this layout gives " +
                                    c10::str(values.back().sizes()));
    }
    if (options.training_state && m.training) {
      extras.training = *m.training;
      for (const named_parameter& p : params) {
        if (!moments) break;
        extras.training->exp_avg.push_back(build_local(p, config, tp_rank, m, reader, moment_names[0]));
        extras.training->exp_avg_sq.push_back(build_local(p, config, tp_rank, m, reader, moment_names[1]));
      }
    }
  });
  agree(world, error);
  c10::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) params[i].tensor.detach().copy_(values[i]);
  return extras;
}

void save_model_checkpoint(const std::vector<named_parameter>& params, const lora_set* adapters, const runtime_config& config,
                           const parallel_groups& groups, const fs::path& dir, checkpoint_extras extras,
                           const hf_name_map& names) {
  if (adapters != nullptr) {
    // The adapters and their moments whole in lora/; the base's pieces carry no moments (frozen).
    extras.write_also = lora_checkpoint_writer(*adapters, extras.training ? &*extras.training : nullptr, config, groups, names);
    if (extras.training) {
      extras.training->exp_avg.clear();
      extras.training->exp_avg_sq.clear();
    }
  }
  save_distributed(params, config, groups, dir, extras);
}

checkpoint_extras load_model_checkpoint(std::vector<named_parameter>& params, lora_set* adapters, const runtime_config& config,
                                        const parallel_groups& groups, const fs::path& dir, bool training_state,
                                        const hf_name_map& names) {
  std::error_code ec;
  const bool saved_lora = fs::exists(dir / lora_checkpoint_folder / "adapter_config.json", ec);
  if (saved_lora != (adapters != nullptr))
    throw checkpoint_error("megadsl: load_distributed: " + dir.string() +
                           (saved_lora ? " holds LoRA adapters (lora/), and this model has none; build it with the "
                                         "checkpoint's LoRA settings (from_hf's lora_rank= or lora_adapter=)"
                                       : " holds no LoRA adapters, and this model has some; build it without them"));
  checkpoint_extras extras = load_distributed(params, config, groups, dir, {.training_state = training_state});
  if (adapters != nullptr)
    load_lora_checkpoint(dir, *adapters, config, groups.me.tp, params, names,
                         training_state && extras.training ? &*extras.training : nullptr);
  return extras;
}

}  // namespace megadsl
