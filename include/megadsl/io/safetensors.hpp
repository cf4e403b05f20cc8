// safetensors files (https://github.com/huggingface/safetensors): a memory-mapped reader that
// validates the whole header before handing out a byte, and an atomic writer (DESIGN §6: a rank
// reads only the byte ranges of its own slices).
//
// Layout: 8-byte little-endian header length N | N bytes of JSON | data section. The JSON maps each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data section),
// plus an optional "__metadata__" string->string map.
//
//   auto f = megadsl::safetensors_file::open("model.safetensors");
//   at::Tensor w = f.view("model.layers.0.self_attn.q_proj.weight");   // (q, h), no copy
//   at::Tensor mine = w.narrow(0, tp_rank * q / tp, q / tp).clone();   // touches 1/tp of the pages
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megadsl/io/checkpoint_error.hpp"

namespace megadsl {

struct tensor_info {
  std::string name;
  at::ScalarType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin, end;  // [begin, end) in the data section
  std::uint64_t bytes() const { return end - begin; }
};

// The safetensors spelling of a dtype ("BF16") and back. Accepted: F64 F32 F16 BF16 I64 I32 I16 I8
// U8 BOOL; `safetensors_dtype_name` returns "" for any other ScalarType.
std::string_view safetensors_dtype_name(at::ScalarType t);
std::optional<at::ScalarType> parse_safetensors_dtype(std::string_view name);

namespace detail {
struct file_mapping;
}

class safetensors_file {
 public:
  // Maps the file read-only and validates the header: throws checkpoint_error on any defect, and
  // never reads outside the file (sizes and offsets use checked arithmetic).
  static safetensors_file open(const std::filesystem::path& path);

  // Tensors in data-section order.
  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const tensor_info* find(std::string_view name) const;
  // Throws checkpoint_error naming the file and the tensor when it is absent.
  const tensor_info& at(std::string_view name) const;

  // A CPU tensor over the mapping, no copy. It shares ownership of the mapping, so it stays valid
  // after this object is gone. It is READ-ONLY memory: writing into it faults; clone() or read()
  // first. (A tensor whose bytes are not aligned to its element size, which neither this writer
  // nor the reference one produces, comes back as an aligned copy.)
  at::Tensor view(std::string_view name) const;
  // A copy converted to `to`.
  at::Tensor read(std::string_view name, at::ScalarType to) const;
  at::Tensor read(std::string_view name) const;
  // A contiguous copy of view(name).narrow(dim, start, length), converted to `to`: what a tp rank
  // loads. It first tells the kernel the exact bytes it will touch (madvise WILLNEED), so a cold
  // read fetches those and not the read-around of an mmap page fault (read_ahead_kb, often MiBs,
  // around every faulting page). A dim-0 slice is one contiguous range; a slice of a later dim
  // spans the tensor. Throws std::out_of_range naming the tensor for a bad dim or range.
  at::Tensor read_slice(std::string_view name, std::int64_t dim, std::int64_t start, std::int64_t length,
                        at::ScalarType to) const;
  at::Tensor read_slice(std::string_view name, std::int64_t dim, std::int64_t start, std::int64_t length) const;
  // Asks the kernel to start reading a tensor's bytes now (asynchronous; errors ignored).
  void prefetch(std::string_view name) const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::uint64_t data_bytes() const { return data_bytes_; }
  std::uint64_t file_bytes() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  safetensors_file() = default;
  [[noreturn]] void missing(std::string_view name) const;
  void advise(std::uint64_t begin, std::uint64_t end) const;  // [begin, end) of the data section

  std::filesystem::path path_;
  std::shared_ptr<const detail::file_mapping> map_;
  std::uint64_t data_start_ = 0, data_bytes_ = 0;
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any device, any strides; dtypes as above) contiguously in the given order, the
// header padded with spaces to a multiple of 8 bytes as the reference writer does. Atomic: the
// bytes go to `<path>.tmp.<pid>` in the same directory, which is fsynced and renamed over `path`;
// on failure nothing is left behind. Names must be unique and not "__metadata__".
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace megadsl
