// libFuzzer harness: a distributed checkpoint's metadata.json -> the manifest reader that
// load_distributed runs first. Any input must parse or give a checkpoint_error in one line.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/runtime/dist_checkpoint.hpp"
#include "one_line.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    megadsl::check_distributed_metadata(text, "fuzz/ckpt");
  } catch (const megadsl::checkpoint_error& e) {
    megadsl::fuzz::require_one_line(e.what());
  }
  return 0;
}
