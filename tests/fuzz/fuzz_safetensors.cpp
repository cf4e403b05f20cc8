// libFuzzer harness: bytes of a .safetensors file -> safetensors_file::open, then every tensor
// read. The bytes go into a memfd (a regular file, as open() requires) so the real mmap path runs.
// Any input must load or give a checkpoint_error naming the problem in one line.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/io/safetensors.hpp"
#include "one_line.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create("fuzz.safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  try {
    const megadsl::safetensors_file f = megadsl::safetensors_file::open(path);
    for (const megadsl::tensor_info& t : f.tensors()) (void)f.read(t.name, at::kFloat);
  } catch (const megadsl::checkpoint_error& e) {
    megadsl::fuzz::require_one_line(e.what());
  }
  return 0;
}
