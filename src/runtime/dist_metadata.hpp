// metadata.json of a distributed checkpoint, read (src/runtime/dist_metadata.cpp): the files, the pieces
// of each HF tensor (key, global shape and offset, dtype, FNV-1a checksum), the model and layout
// that saved them, and the training scalars. Internal to the runtime; kept in its own TU so that
// the fuzzing harness (tests/fuzz) can take the parser alone.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include <type_traits>

#include "megadsl/runtime/trainer.hpp"

namespace megadsl::dist_metadata {

inline constexpr const char* manifest_name = "metadata.json";

std::string one_line(std::string s);

// ---- geometry: axis-aligned boxes in a tensor of rank 1 or 2 ------------------------------------

struct box {
  int rank = 2;
  std::array<std::int64_t, 2> off{0, 0}, len{1, 1};
  [[nodiscard]] std::int64_t numel() const { return len[0] * len[1]; }
  [[nodiscard]] bool empty() const { return len[0] <= 0 || len[1] <= 0; }
};

box whole(const std::vector<std::int64_t>& shape);
std::string region_text(const box& b);
std::string shape_text(const std::vector<std::int64_t>& v);

// ---- the manifest -------------------------------------------------------------------------------

struct saved_piece {
  std::string key, tensor;
  std::size_t file = 0;
  box where;  // in the global tensor
  std::vector<std::int64_t> global_shape;
  std::string dtype;
  std::uint64_t checksum = 0;
};

struct saved_file {
  std::string name;
  std::uint64_t bytes = 0;
  std::vector<std::size_t> pieces;
};

// A file of the checkpoint's hf/ folder (tokenizer, generation_config.json, config.json, a
// multimodal source's other tensors), with its size and the FNV-1a of its bytes.
struct saved_extra {
  std::string name;  // "hf/tokenizer.json"
  std::uint64_t bytes = 0, checksum = 0;
};

struct manifest {
  std::filesystem::path dir;
  nlohmann::json model, layout;
  std::optional<training_state> training;  // scalars only
  bool moments = false;
  std::vector<saved_file> files;
  // hf/'s files; nullopt in checkpoints saved before they were listed (format version 1 still).
  std::optional<std::vector<saved_extra>> hf_files;
  std::vector<saved_piece> pieces;
  std::map<std::string, std::vector<std::size_t>> by_tensor;

  [[nodiscard]] std::string where() const { return "megadsl: distributed checkpoint " + dir.string(); }
};

// metadata.json's text -> the manifest; every problem is a one-line checkpoint_error. Names from
// the file are escaped (printable) before they reach a message.
// A layout's or shape's field as metadata.json holds it: its value, an enum by its name.
template <class T>
nlohmann::json value_json(const maybe<T>& v) {
  if constexpr (std::is_enum_v<T>) return std::string(name_of(v.get()));
  else return v.get();
}

// A shape as metadata.json's model.shape holds it: every field that has a value, by its name in
// `shape` (Hana's reflection, megadsl/reflection.hpp), enums by their names.
nlohmann::json shape_json(const shape& s);

// metadata.json's model.shape with the fields added to `shape` after format version 1 was first
// written, where missing, set to their value in every model saved before them: shape{}'s defaults,
// derived from the struct (a field is added with the default that keeps the old behaviour). Used by
// parse_manifest and by `megadsl convert`.
void fill_fields_added_later(nlohmann::json& shape);

manifest parse_manifest(std::string_view text, const std::filesystem::path& dir);

}  // namespace megadsl::dist_metadata
