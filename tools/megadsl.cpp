// megadsl: check, describe, plan, run and convert a model of any composed family under a parallel layout.
//
//   megadsl check llama3-8b --tp 8 --pp 4 --sp          exit 0: valid, 1: rules violated, 2: usage
//   megadsl describe path/to/hf-model --tp 4             per-parameter shard plan
//   megadsl plan llama3-8b --tp 8 --pp 4 --seq 8192      memory, FLOPs, communication
//   megadsl run path/to/hf-model --tp 2 --input batch.json --output out.safetensors
//   megadsl convert --from path/to/hf-model --to ckpt --tp 2 --pp 2
//
// run and convert need the LibTorch runtime (MEGADSL_BUILD_RUNTIME, which defines MEGADSL_TOOL_RUNTIME);
// without it they say so and exit 2.
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/models/registry.hpp"
#include "megadsl/plan_report.hpp"

namespace megadsl::cli {
namespace {

constexpr std::string_view usage = R"(usage: megadsl <command> MODEL [options]

commands:
  check MODEL [layout]      validate the model under the layout; exit 0 when valid, 1 with one
                            line per violated rule (its name, the values, the valid alternatives)
  describe MODEL [layout]   the shard plan: every parameter's HF name(s), kind, global and per-rank
                            shape, pipeline stage; the stages' layers; the per-rank fused QKV
  plan MODEL [layout] [--seq N] [--micro-batch N]
                            memory per rank, FLOPs per token, communication per step
  presets                   the preset models and their published parameter counts
  families                  the families (HF model_type) megadsl composes, and their presets
  run MODEL_DIR [layout] --input FILE --output FILE [--ranks N] [--temperature T] [--logits] [--lora-adapter DIR]
      [--device cpu|cuda] [--compute fp32|bf16]
                            run the model on a batch: the actor's log_probs and entropy (and
                            logits with --logits), or with --critic the values; plus the valid mask
  convert --from PATH --to PATH [--to-format hf|dist] [layout] [--dtype fp32|bf16|fp16] [--merge-lora DIR] [--ranks N]
                            HF checkpoint <-> distributed checkpoint, any layout to any layout
  help                      this text

MODEL is a preset name (megadsl presets), an HF model directory, or its config.json
(model_type MODEL_TYPES). A path that looks like a preset name: write ./name.

layout:
  --tp N                    tensor-parallel degree (default 1)
  --pp N                    pipeline-parallel degree (default 1)
  --vpp N                   virtual pipeline chunks per pipeline rank (default 1)
  --first-stage-layers N    layers on the first pipeline stage (default 0: even split)
  --last-stage-layers N     layers on the last pipeline stage (default 0: even split)
  --sp                      sequence parallelism (needs tp > 1)
  --cp N                    context-parallel degree: each rank 1/cp of every sequence (default 1)
  --cp-comm KIND            its attention: a2a (heads all-to-all, Ulysses; default), ring (p2p: k/v
                            blocks around a ring over a load-balanced split, any head count) or
                            a2a+ring (a2a+p2p: all-to-all within groups of --cp-a2a ranks, ring across)
  --cp-a2a N                a2a+ring: the all-to-all groups' size, 1 < N < cp dividing cp (default 1)
  --ep N                    expert-parallel degree: whole experts per rank (mixtures of experts; default 1)
  --etp N                   expert tensor-parallel degree (default 0: etp = tp)
  --rmpad                   remove padding (packed sequences)
  --invariant               invariant arithmetic: a sequence's outputs the same bits whatever its
                            batch, padding and layout (CPU; slower)
  --recompute KIND          activations the backward recomputes: none (default), selective (the
                            attention core: RoPE and attention), full (each layer from its input)
  --vocab-pad-multiple N    vocab padded to a multiple of N * tp (default 128)
  --critic                  value model (value head h -> 1) instead of the LM head
  --no-value-bias           with --critic: the value head has no bias
run facts (checked when given):
  --world N                 number of ranks (a multiple of tp * pp)
  --global-batch N          sequences per step (a multiple of micro batch * dp)
  --micro-batch N           sequences per micro-batch
  --microbatches N          micro-batches per step and dp rank (a multiple of pp when vpp > 1)
run:
  MODEL_DIR                 an HF model directory: config.json + safetensors (a preset has no weights)
  --input FILE              .json {"input_ids": [[...], ...], "attention_mask": [[...], ...]}
                            (rows of equal length; attention_mask optional, default all 1, left or
                            right padding), or .safetensors with tensors input_ids, attention_mask
  --output FILE             .json (nested lists) or .safetensors, by its extension; rank 0 writes it
  --temperature T           divide the logits by T before log-probs and entropy (default 1)
  --device cpu|cuda         where the model runs (cuda: GPU LOCAL_RANK % count, NCCL groups)
  --compute fp32|bf16       bf16: compute in bf16 over fp32 weights; log-probs in fp32
  --logits                  also the full logits (batch, seq, vocab)
  --lora-adapter DIR        a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors)
                            applied in the forward, each rank its shards of it
  --ranks N                 local processes to start (default tp * cp * pp, with ep; a multiple adds data
                            parallelism). Under torchrun/srun (RANK, WORLD_SIZE set) the job's ranks
                            are used instead and nothing is started.
convert:
  --from PATH               an HF model directory, or a megadsl distributed checkpoint (a directory
                            with metadata.json)
  --to PATH                 the directory to write (replaced when it exists)
  --to-format hf|dist       default: the other format than --from's (dist -> dist reshards)
  layout flags              the layout the model is loaded into while converting; a distributed
                            checkpoint written keeps it as its layout (any layout loads it back)
  --critic                  an HF source is a critic (value head); a distributed one says what it is
  --dtype fp32|bf16|fp16    dtype of what is written (default: the source's)
  --merge-lora DIR          a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors)
                            merged into the HF checkpoint written (W + scaling * B A)
  --ranks N                 as for run
other:
  --config PATH             with a preset: check that PATH (config.json or its directory)
                            matches the preset field by field, then use it
  --seq N                   plan: tokens per sequence (default 4096)

exit status: 0 ok, 1 invalid model or layout (or --config disagrees; run/convert: an unusable
input, checkpoint or output file, or a failed rank), 2 unusable command line or config.json.
)";

// The usage text with the model types of the registry's families.
std::string usage_text() {
  std::string types;
  for (std::size_t i = 0; i < megadsl::families.size(); ++i)
    types += (i == 0 ? "" : i + 1 == megadsl::families.size() ? " or " : ", ") + std::string(megadsl::families[i]->model_type);
  std::string text(usage);
  text.replace(text.find("MODEL_TYPES"), 11, types);
  return text;
}

}  // namespace

int cmd_plan(const options& o, std::ostream& out, std::ostream& err) {
  const model_arg m = load_model(o);
  if (!validate(m, o, err)) return exit_invalid;
  plan_options p;
  p.seq = o.seq;
  p.micro_batch = o.facts.micro_batch.is_static() ? o.facts.micro_batch.get() : 1;
  p.world = o.facts.world.is_static() ? o.facts.world.get() : 0;
  // The formulas count in 64-bit integers and doubles, exact up to 2^53: a micro-batch of more
  // than 2^40 tokens (a trillion) is past any model's and past where the counts stay exact.
  constexpr std::int64_t max_tokens = std::int64_t{1} << 40;
  if (p.seq > max_tokens / p.micro_batch)
    throw usage_error("megadsl plan: --seq " + std::to_string(p.seq) + " x micro batch " + std::to_string(p.micro_batch) +
                      " is more than 2^40 (" + std::to_string(max_tokens) +
                      ") tokens, beyond what the memory and FLOPs formulas count exactly; plan a shorter sequence");
  p.actor = o.head.actor;
  p.value_bias = o.head.value_bias;
  print_plan(out, m.name, m.s, o.l, p);
  return exit_ok;
}

#ifndef MEGADSL_TOOL_RUNTIME
int cmd_run(const options&, const std::vector<std::string>&, std::ostream&, std::ostream& err) {
  err << "megadsl run needs the LibTorch runtime; this megadsl was built with -DMEGADSL_BUILD_RUNTIME=OFF\n";
  return exit_usage;
}
int cmd_convert(const options&, const std::vector<std::string>&, std::ostream&, std::ostream& err) {
  err << "megadsl convert needs the LibTorch runtime; this megadsl was built with -DMEGADSL_BUILD_RUNTIME=OFF\n";
  return exit_usage;
}
#endif

int run(const std::vector<std::string_view>& args, const std::vector<std::string>& argv, std::ostream& out,
        std::ostream& err) {
  if (args.empty()) {
    err << usage_text();
    return exit_usage;
  }
  const std::string_view command = args[0];
  const std::vector<std::string_view> rest(args.begin() + 1, args.end());
  if (command == "help" || command == "--help" || command == "-h") {
    out << usage_text();
    return exit_ok;
  }
  for (std::string_view a : rest)
    if (a == "--help" || a == "-h") {
      out << usage_text();
      return exit_ok;
    }
  try {
    if (command == "presets") {
      if (!rest.empty()) throw usage_error("megadsl presets takes no arguments");
      return cmd_presets(out);
    }
    if (command == "families") {
      if (!rest.empty()) throw usage_error("megadsl families takes no arguments");
      return cmd_families(out);
    }
    if (command == "check") return cmd_check(parse_args(command, rest), out, err);
    if (command == "describe") return cmd_describe(parse_args(command, rest), out, err);
    if (command == "plan") return cmd_plan(parse_args(command, rest), out, err);
    if (command == "run") return cmd_run(parse_args(command, rest), argv, out, err);
    if (command == "convert") return cmd_convert(parse_args(command, rest), argv, out, err);
    throw usage_error("megadsl: unknown command '" + std::string(command) +
                      "'; the commands are check, describe, plan, presets, families, run, convert, help");
  } catch (const usage_error& e) {
    err << e.what() << '\n';
    return exit_usage;
  } catch (const config_error& e) {
    err << e.what() << '\n';
    return exit_usage;
  } catch (const mismatch_error& e) {
    err << e.what() << '\n';
    return exit_invalid;
  } catch (const std::invalid_argument& e) {  // a rule, thrown by require_valid inside a command
    err << e.what() << '\n';
    return exit_invalid;
  }
}

}  // namespace megadsl::cli

int main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  const std::vector<std::string> whole(argv, argv + argc);
  try {
    return megadsl::cli::run(args, whole, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "megadsl: internal error: " << e.what() << '\n';
    return 3;
  }
}
