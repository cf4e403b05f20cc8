// libFuzzer harness: config.json text -> parse_hf_config. Any input must give an hf_config or a
// config_error whose message is one line; anything else (a crash, a sanitizer report, another
// exception type) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "megadsl/hf_config.hpp"
#include "one_line.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const megadsl::hf_config c = megadsl::parse_hf_config(text, "fuzz/config.json");
    for (const std::string& n : c.notes) megadsl::fuzz::require_one_line(n);
  } catch (const megadsl::config_error& e) {
    megadsl::fuzz::require_one_line(e.what());
  }
  return 0;
}
