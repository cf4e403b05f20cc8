// HF checkpoint directories over safetensors files: the single-file and the sharded (index) form.
#include "megadsl/io/hf_checkpoint.hpp"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

#include "megadsl/io/atomic_file.hpp"
#include "../spec/json_bounded.hpp"

namespace megadsl {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* single_name = "model.safetensors";
constexpr const char* index_name = "model.safetensors.index.json";
constexpr std::uint64_t max_index_bytes = 100'000'000;

std::string quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

[[noreturn]] void fail(const fs::path& where, const std::string& what) {
  std::string msg = "megadsl: " + where.string() + ": " + what;
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  throw checkpoint_error(msg);
}

// Whether `p` exists; a symbolic link that cannot be followed (a loop, a missing target) is an
// error naming it, not an absent file.
bool is_file(const fs::path& p) {
  std::error_code ec;
  if (fs::exists(p, ec)) return true;
  std::error_code link_ec;
  if (fs::is_symlink(fs::symlink_status(p, link_ec)))
    fail(p, "is a symbolic link that cannot be followed (" +
                (ec ? ec.message() : std::string("its target does not exist")) +
                "); point it at the checkpoint's file, or put the file itself there");
  return false;
}

// "model-00002-of-00004.safetensors": the shard names transformers writes.
bool is_shard_name(const std::string& n) {
  const std::string_view prefix = "model-", mid = "-of-", suffix = ".safetensors";
  if (n.size() != prefix.size() + 5 + mid.size() + 5 + suffix.size()) return false;
  auto digits = [&](std::size_t at) {
    for (std::size_t i = at; i < at + 5; ++i)
      if (n[i] < '0' || n[i] > '9') return false;
    return true;
  };
  return n.starts_with(prefix) && digits(prefix.size()) && n.compare(prefix.size() + 5, mid.size(), mid) == 0 &&
         digits(prefix.size() + 5 + mid.size()) && n.ends_with(suffix);
}

std::string shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

json read_index(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(path, "is not a regular file (a FIFO, a device or a directory); expected the JSON index");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the index; expected a readable JSON file");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  if (size > max_index_bytes)
    fail(path, "index is " + std::to_string(size) + " bytes, above the limit of " + std::to_string(max_index_bytes));
  in.seekg(0);
  std::string text(size, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) fail(path, "cannot read the index");
  return parse_json_bounded(text, max_index_bytes, [&](const std::string& problem) { fail(path, "index is " + problem); });
}

}  // namespace

hf_checkpoint hf_checkpoint::open(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail(dir, "does not exist; expected an HF checkpoint directory");
  if (!fs::is_directory(dir, ec))
    fail(dir, "is not a directory; expected an HF checkpoint directory holding model.safetensors or "
              "model.safetensors.index.json");
  hf_checkpoint c;
  c.dir_ = dir;
  const fs::path single = dir / single_name, index = dir / index_name;

  if (is_file(single)) {
    c.files_.push_back(safetensors_file::open(single));
    for (const auto& t : c.files_[0].tensors()) c.where_.emplace(t.name, 0);
  } else if (is_file(index)) {
    c.sharded_ = true;
    const json j = read_index(index);
    if (!j.is_object()) fail(index, "index is not a JSON object; expected {\"metadata\": ..., \"weight_map\": {...}}");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object())
      fail(index, "index has no \"weight_map\" object; expected \"weight_map\": {tensor name: shard file}");
    // Shard files in name order, each opened (and so validated) once.
    std::map<std::string, std::string> first_tensor;  // shard -> a tensor it should hold
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string())
        fail(index, "weight_map entry for tensor " + quote(tensor) + " is not a file name; expected a string");
      const auto& f = file.get_ref<const std::string&>();
      if (f.empty() || f == "." || f == ".." || f.find_first_of(std::string("/\\\0", 3)) != std::string::npos)
        fail(index, "weight_map puts tensor " + quote(tensor) + " in " + quote(f) +
                        ", not a file name inside the checkpoint directory; expected e.g. model-00001-of-00002.safetensors");
      first_tensor.emplace(f, tensor);
    }
    std::map<std::string, std::size_t> file_index;
    for (const auto& [f, tensor] : first_tensor) {
      const fs::path p = dir / f;
      if (!is_file(p))
        fail(index, "weight_map names shard " + quote(f) + " (for tensor " + quote(tensor) +
                        ") which is missing from " + dir.string() + "; expected every shard the index names");
      file_index.emplace(f, c.files_.size());
      c.files_.push_back(safetensors_file::open(p));
    }
    for (const auto& [tensor, file] : wm->items()) {
      const std::size_t i = file_index.at(file.get<std::string>());
      if (!c.files_[i].find(tensor))
        fail(index, "weight_map puts tensor " + quote(tensor) + " in " + quote(file.get<std::string>()) +
                        ", which does not hold it (it holds " + std::to_string(c.files_[i].tensors().size()) +
                        " tensors); expected every listed tensor in its shard");
      c.where_.emplace(tensor, i);
    }
    // A tensor stored in two shards is ambiguous (transformers and the index may pick different
    // copies): refused, as a name twice in one header is.
    std::vector<std::string> shard_of(c.files_.size());
    for (const auto& [f, i] : file_index) shard_of[i] = f;
    for (std::size_t i = 0; i < c.files_.size(); ++i)
      for (const tensor_info& t : c.files_[i].tensors()) {
        const auto it = c.where_.find(t.name);
        if (it != c.where_.end() && it->second != i)
          fail(dir, "tensor " + quote(t.name) + " is stored in two shards, " + quote(shard_of[it->second]) + " (where " +
                        index_name + " puts it) and " + quote(shard_of[i]) +
                        "; a checkpoint holds each tensor once: remove one copy, or re-save the checkpoint");
      }
  } else {
    fail(dir, std::string("holds neither model.safetensors nor model.safetensors.index.json; expected an HF "
                          "checkpoint in safetensors format") +
                  (is_file(dir / "pytorch_model.bin") || is_file(dir / "pytorch_model.bin.index.json")
                       ? " (pytorch_model.bin checkpoints are not read: convert them to safetensors)"
                       : ""));
  }
  for (const auto& [name, i] : c.where_) c.total_bytes_ += c.files_[i].find(name)->bytes();
  return c;
}

std::string hf_checkpoint::stored_name(std::string_view name) const {
  const auto it = stored_.find(name);
  return it == stored_.end() ? std::string(name) : it->second;
}

void hf_checkpoint::as_text_model(const hf_name_map& m) {
  if (m.identity()) return;
  std::map<std::string, std::size_t, std::less<>> text;
  std::map<std::string, std::string, std::less<>> stored;
  std::vector<std::string> outside;
  for (const auto& [name, i] : where_) {
    const std::string full = stored_name(name);
    if (const std::optional<std::string> t = m.text_name(full)) {
      text.emplace(*t, i);
      if (*t != full) stored.emplace(*t, full);
    } else {
      outside.push_back(full);
    }
  }
  if (text.empty())
    fail(dir_, "no tensor is stored under " + quote(m.prefixes.front().second) +
                   "*, where this multimodal checkpoint's config.json puts its text model; is config.json the "
                   "checkpoint's own?");
  where_ = std::move(text);
  stored_ = std::move(stored);
  outside_ = std::move(outside);
}

const tensor_info* hf_checkpoint::find(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second].find(stored_name(name));
}

const safetensors_file& hf_checkpoint::file_of(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    fail(dir_, "tensor " + quote(name) + ": not in this checkpoint (" + std::to_string(where_.size()) + " tensors)");
  return files_[it->second];
}

const tensor_info& hf_checkpoint::at(std::string_view name) const { return file_of(name).at(stored_name(name)); }
at::Tensor hf_checkpoint::view(std::string_view name) const { return file_of(name).view(stored_name(name)); }
at::Tensor hf_checkpoint::read(std::string_view name, at::ScalarType to) const {
  return file_of(name).read(stored_name(name), to);
}

at::Tensor hf_checkpoint::read_slice(std::string_view name, std::int64_t dim, std::int64_t start, std::int64_t length,
                                     at::ScalarType to) const {
  return file_of(name).read_slice(stored_name(name), dim, start, length, to);
}

std::vector<std::string> hf_checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

// ---- writer ------------------------------------------------------------------------------------

void write_hf_checkpoint(const fs::path& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         std::uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create the checkpoint directory: " + ec.message());

  // Shards filled in order, as transformers' shard_checkpoint does.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  std::set<std::string_view> names;
  std::uint64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    if (!names.insert(name).second)
      fail(dir, "cannot write the checkpoint: tensor " + quote(name) + " appears twice; expected unique names");
    const std::uint64_t bytes = t.defined() ? static_cast<std::uint64_t>(t.numel()) * t.element_size() : 0;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(name, t);
    in_shard += bytes;
    total += bytes;
  }

  const std::map<std::string, std::string> meta{{"format", "pt"}};
  std::set<std::string> written;
  auto remove_stale = [&](auto&& is_stale) {
    std::vector<fs::path> stale;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (!written.count(n) && is_stale(n)) stale.push_back(it->path());
    }
    for (const auto& p : stale)
      if (!fs::remove(p, ec) && ec) fail(p, "cannot remove this file of an earlier checkpoint: " + ec.message());
  };
  if (shards.size() == 1) {
    write_safetensors(dir / single_name, shards[0], meta);
    written.insert(single_name);
    remove_stale([](const std::string& n) { return n == index_name || is_shard_name(n); });
    return;
  }
  json weight_map = json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string f = shard_name(i, shards.size());
    write_safetensors(dir / f, shards[i], meta);
    written.insert(f);
    for (const auto& [name, t] : shards[i]) weight_map[name] = f;
  }
  // A stale model.safetensors would be preferred over the new index: it goes before the index.
  remove_stale([](const std::string& n) { return n == single_name; });
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomically(dir / index_name, index.dump(2) + "\n");
  written.insert(index_name);
  remove_stale([](const std::string& n) { return is_shard_name(n); });
}

}  // namespace megadsl
