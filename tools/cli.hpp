// The `megadsl` tool's shared pieces: the parsed command line, the model argument (a preset or an
// HF config.json), validation and the aligned-table printer. Torch-free.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "megadsl/layout.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/shard_plan.hpp"

namespace megadsl::cli {

// Exit codes: 0 valid / done, 1 the model or layout is invalid, 2 the command line or an input
// file is unusable.
inline constexpr int exit_ok = 0;
inline constexpr int exit_invalid = 1;
inline constexpr int exit_usage = 2;

// A command line or input the tool cannot work with (exit 2); the text says what to change.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A preset that disagrees with the config.json given by --config (exit 1: the check failed).
struct mismatch_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  std::string command;
  std::string model;   // preset name, HF model directory or config.json
  std::string config;  // --config: check a preset against this config.json
  layout l;            // every field static
  run_facts facts;     // dynamic unless given
  head_info head;      // actor unless --critic
  std::int64_t seq = 4096;  // plan only
};

// Parses everything after the subcommand name.
options parse_args(std::string_view command, const std::vector<std::string_view>& args);

struct model_arg {
  std::string name;                   // as the user wrote it
  std::string origin;                 // "preset, meta-llama/Meta-Llama-3-8B" or "path/config.json (llama)"
  shape s;                            // fully static
  std::int64_t published_params = 0;  // 0: not a preset
  std::vector<std::string> notes;     // from reading config.json
};

// A preset name or a path; throws usage_error or config_error (exit 2: nothing to check) or
// mismatch_error (exit 1: --config disagrees with the preset).
model_arg load_model(const options& o);

// "tp=8 pp=4 vpp=1 sp=on rmpad=off" and any run facts given.
std::string layout_summary(const options& o);

// Runs the rules; prints one line per violated rule to `err` and returns false when any fails.
bool validate(const model_arg& m, const options& o, std::ostream& err);

// "(1536, 4096)" / "(4096)".
std::string to_string(const dims& d);
// "8,030,261,248".
std::string grouped(std::int64_t v);
// "8.03B".
std::string short_count(std::int64_t v);

// Columns padded to their widest cell, two spaces apart; rows may span several lines.
class table {
 public:
  explicit table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& out, std::string_view indent = "  ") const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

int cmd_check(const options& o, std::ostream& out, std::ostream& err);
int cmd_describe(const options& o, std::ostream& out, std::ostream& err);
int cmd_plan(const options& o, std::ostream& out, std::ostream& err);
int cmd_presets(std::ostream& out);

}  // namespace megadsl::cli
