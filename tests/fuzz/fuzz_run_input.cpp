// libFuzzer harness: the JSON batch `megadsl run` reads -> parse_json_input + check_input (vocab
// 1000). Any input must give a batch or an input_error whose message is one line.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "../../tools/cli.hpp"
#include "../../tools/run_input.hpp"
#include "one_line.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    megadsl::cli::run_input r = megadsl::cli::parse_json_input(text, "fuzz/in.json");
    megadsl::cli::check_input(r, "fuzz/in.json", 1000);
  } catch (const megadsl::cli::input_error& e) {
    megadsl::fuzz::require_one_line(e.what());
  }
  return 0;
}
