// The `megadsl` tool's shared pieces: the parsed command line, the model argument (a preset or an
// HF config.json), validation and the aligned-table printer. Torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "megadsl/layout.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/shard_plan.hpp"

namespace megadsl {
class distributed;
}

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

  // run and convert (need the LibTorch runtime)
  std::string input, output;  // run: --input, --output
  std::int64_t ranks = 0;     // --ranks: local processes to start; 0: the layout's fewest (tp * cp * pp, and ep)
  double temperature = 1.0;   // run: --temperature
  bool logits = false;        // run: --logits
  bool critic_given = false;  // --critic was on the command line (convert: check it against the source)
  std::string from, to;       // convert: --from, --to
  std::string merge_lora;     // convert: --merge-lora, a PEFT adapter directory merged into what is written
  std::string lora_adapter;   // run: --lora-adapter, a PEFT adapter directory applied in the forward
  std::string to_format;      // convert: --to-format hf|dist ("": the other format than --from's)
  std::string dtype;          // convert: --dtype fp32|bf16|fp16 ("": the source's)
  std::string device = "cpu"; // run: --device cpu|cuda (CUDA: NCCL groups, GPU LOCAL_RANK % count)
  std::string compute = "fp32";  // run: --compute fp32|bf16 (bf16 over fp32 weights, fp32 log-probs)
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
int cmd_families(std::ostream& out);

// `run` and `convert` (tools/cmd_run.cpp, tools/cmd_convert.cpp; LibTorch). `argv` is the whole
// command line: without a launcher's environment they start their local ranks by re-executing it.
// Exit 1 when an input, the model's weights or the job fails (one line naming the file).
int cmd_run(const options& o, const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);
int cmd_convert(const options& o, const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

// ---- shared by run and convert (implemented in cmd_run.cpp) ----------------------------------

// An input, checkpoint or output file run/convert cannot use (exit 1); the text names the file.
struct input_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where this process stands: under a launcher (torchrun, srun, or the tool's own local launch) it
// is one rank of `world`; otherwise it is the parent that starts `world` local ranks.
struct job {
  std::int64_t world = 1;
  std::int64_t rank = 0;
  bool launched = false;    // RANK / WORLD_SIZE are set
  bool own_child = false;   // started by this tool's local launch (the parent already reported)
  bool speaks() const { return rank == 0 && !own_child; }  // prints notes once per job
};
job job_of(const options& o);

// Maps an exception to its exit code (usage_error, config_error: 2; anything else: 1) and prints
// its one line when `print`.
int report_errors(std::ostream& err, bool print, const std::function<int()>& f);

// Runs `body` on every rank: here when launched, else in `j.world` local processes re-executing
// `argv` (returns the first failing rank's exit code). The body's errors are printed by rank 0.
int run_job(const job& j, const std::vector<std::string>& argv, std::ostream& err,
            const std::function<int(distributed&)>& body);

// One phase of a long job on stderr. On a terminal the line is rewritten with \r four times a
// second: elapsed time, and while files are read, how much of them is in memory. Otherwise one
// plain line when it ends. Does nothing when not `enabled` (ranks other than 0).
class progress {
 public:
  progress(std::ostream& err, bool enabled);
  ~progress();
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  // `reading`: files whose pages in memory are shown as a percentage (a load's source).
  void start(std::string what, std::vector<std::filesystem::path> reading = {});
  // The phase is done: "done (1.2 s)". A phase still running when the object is destroyed (an
  // exception left it) ends as "failed" on a terminal and prints nothing otherwise.
  void finish();

 private:
  void stop(bool done);
  struct state;
  std::unique_ptr<state> s_;
};

}  // namespace megadsl::cli
