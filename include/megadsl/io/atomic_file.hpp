// A file written all-or-nothing: readers see the old file or the complete new one, never a
// prefix. Used for every checkpoint file (safetensors shards, the shard index).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string_view>

#include "megadsl/io/checkpoint_error.hpp"

namespace megadsl {

// Bytes go to `<path>.tmp.<pid>` in the same directory (so the rename cannot cross file systems);
// commit() fsyncs it, renames it over `path` and fsyncs the directory. Destroying an uncommitted
// atomic_file removes the temporary. Every failure throws checkpoint_error naming `path`.
class atomic_file {
 public:
  explicit atomic_file(const std::filesystem::path& path);
  ~atomic_file();
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;

  void write(const void* data, std::size_t bytes);
  void commit();

  const std::filesystem::path& temporary() const { return tmp_; }

 private:
  [[noreturn]] void fail(std::string_view what, int err);
  void discard() noexcept;

  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

void write_file_atomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace megadsl
