// HuggingFace checkpoint directories: `model.safetensors`, or `model.safetensors.index.json` whose
// weight_map names the shard files (`model-00001-of-00004.safetensors`, ...). Opening validates the
// index and every shard it names before any tensor is read; tensors are views over the mappings,
// so a rank that narrows one and copies its slice reads only those bytes (DESIGN §6).
//
//   auto ckpt = megadsl::hf_checkpoint::open("/models/Llama-3.2-1B");
//   at::Tensor q = ckpt.view("model.layers.0.self_attn.q_proj.weight");   // (q, h), no copy
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megadsl/io/hf_name_map.hpp"
#include "megadsl/io/safetensors.hpp"

namespace megadsl {

class hf_checkpoint {
 public:
  // Prefers model.safetensors, then model.safetensors.index.json (the order transformers uses).
  // With an index: every shard named must exist inside `dir` and be a valid safetensors file, and
  // every tensor listed must be in the shard the index names. Tensors a shard holds but the index
  // does not list are ignored, as transformers does. Throws checkpoint_error.
  static hf_checkpoint open(const std::filesystem::path& dir);

  const tensor_info* find(std::string_view name) const;
  // The tensor's info, or checkpoint_error naming the directory and the tensor.
  const tensor_info& at(std::string_view name) const;
  // Views and copies as safetensors_file::view/read; valid after this object is gone.
  at::Tensor view(std::string_view name) const;
  at::Tensor read(std::string_view name, at::ScalarType to) const;
  at::Tensor read_slice(std::string_view name, std::int64_t dim, std::int64_t start, std::int64_t length,
                        at::ScalarType to) const;
  // The file holding `name` (for error messages and reports).
  const safetensors_file& file_of(std::string_view name) const;

  std::vector<std::string> names() const;  // sorted

  // A multimodal checkpoint seen as its text model: the tensors `m` maps are found under the text
  // model's names (the checkpoint's own names no longer find them); the others (its vision
  // tower's, ...) leave names() for outside(). Throws checkpoint_error when no tensor is under
  // the map's stored prefixes.
  void as_text_model(const hf_name_map& m);
  // The stored names of the tensors outside the text model (sorted); empty for a text checkpoint.
  const std::vector<std::string>& outside() const { return outside_; }
  // The name `name` (a text model's name after as_text_model) is stored under.
  std::string stored_name(std::string_view name) const;
  std::size_t size() const { return where_.size(); }
  // Bytes of tensor data (the index's metadata.total_size), not file sizes.
  std::uint64_t total_bytes() const { return total_bytes_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<safetensors_file>& files() const { return files_; }
  bool sharded() const { return sharded_; }

 private:
  hf_checkpoint() = default;

  std::filesystem::path dir_;
  bool sharded_ = false;
  std::vector<safetensors_file> files_;
  std::map<std::string, std::size_t, std::less<>> where_;  // tensor -> index into files_
  std::map<std::string, std::string, std::less<>> stored_;  // a text model's name -> its stored name (as_text_model)
  std::vector<std::string> outside_;
  std::uint64_t total_bytes_ = 0;
};

// Writes `tensors` into `dir` (created if needed) as one `model.safetensors` when their bytes fit
// in `max_shard_bytes`, else as `model-0000i-of-0000N.safetensors` shards (filled in the given
// order, a new shard when the next tensor would overflow; a tensor larger than the limit gets a
// shard of its own) plus `model.safetensors.index.json`. Each file carries metadata
// {"format": "pt"} (transformers requires it) and is written atomically, the index last. Files of
// an earlier checkpoint in `dir` that the new one does not use (model.safetensors, the index,
// shards of another count) are removed: a stale model.safetensors would shadow a new index. Each
// file is atomic, the directory is not: a crash part-way can leave old and new files side by side.
// config.json is not touched.
void write_hf_checkpoint(const std::filesystem::path& dir,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         std::uint64_t max_shard_bytes = 2ull << 30);

}  // namespace megadsl
