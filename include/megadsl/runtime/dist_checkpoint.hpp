// Distributed checkpoints: Megatron's dist_checkpointing semantics in megadsl's own format
// (DESIGN §6). Every piece is stored under a layout-independent key, so loading into any other
// layout (tp, pp, vpp, sp, rmpad, dp) is resharding for free.
//
//   megadsl::save_distributed(model, groups, "ckpt/step-100", &trainer);   // every rank calls it
//   megadsl::load_distributed(other_model, other_groups, "ckpt/step-100", &other_trainer);
//
// Format "megadsl.dist_checkpoint", version 1, in directory `dir`:
//   rank_<global rank>.safetensors  one per rank with dp rank 0, holding the pieces that rank is the
//       main replica of (shard_pieces(..., piece_set::main_replica): replicated parameters on tp
//       rank 0, a replicated kv head on the first rank holding it, no vocab padding, no tied
//       lm_head copy). A piece is stored under `<HF name>@<global offset>`, e.g.
//       `model.layers.3.self_attn.q_proj.weight@128,0`; AdamW's moments of the same elements under
//       `optimizer.exp_avg/<HF name>@...` and `optimizer.exp_avg_sq/<HF name>@...`. The file's
//       __metadata__ maps each key to {"tensor", "global_shape", "global_offset", "dtype",
//       "fnv1a64"} (the checksum: 64-bit FNV-1a of the piece's bytes as stored, 16 hex digits).
//   hf/  config.json, the tokenizer files and generation_config.json of the HF model the weights
//       came from, when the saver gave them (checkpoint_extras::hf_files): what save_hf writes back;
//       for a multimodal source also multimodal.safetensors, its tensors outside the text model
//       (vision tower, ...: hf_io.hpp carry_multimodal_part), which save_hf writes back beside it.
//   lora/  a model with LoRA adapters: adapter_config.json and adapter_model.safetensors (PEFT's
//       format) and AdamW's moments of them whole in optimizer.safetensors (runtime/lora_io.hpp).
//   metadata.json  written last by rank 0: format, version, the model (every shape field, the
//       head, the dtype), the layout and grid that wrote it, the training counters (steps,
//       samples, AdamW's step) when saved, and every file with its size and pieces (key, tensor,
//       global shape, global offset, shape, dtype, checksum).
//
// Saving is all-or-nothing: files go to a sibling directory `<dir>.tmp-<token>` (each file written
// atomically), metadata.json last, then the directory takes `dir`'s place in one rename
// (renameat2 RENAME_EXCHANGE when `dir` exists; the old checkpoint is then removed). Readers see
// the old checkpoint or the new one, never a mix. A SIGTERM removes the `<dir>.tmp-*` sibling
// before the process ends; a crash (SIGKILL) can leave it behind, never a damaged `dir`, and the
// next write beside it removes it. Where the file system cannot exchange (EINVAL), the old checkpoint is
// renamed aside first: `dir` is briefly absent, still never mixed.
//
// Loading checks before it uses anything: metadata.json parses and names this format; the model
// matches (every differing field is named); every file it lists exists with its recorded size;
// every HF tensor the model needs (and its moments, when loaded) is covered by the saved pieces
// exactly once (the error names the tensor and the first uncovered or doubly covered region).
// Then each rank reads only the pieces that overlap its own shards (memory-mapped; the whole of
// each piece it uses is read once to verify its checksum), builds its shards for ITS layout, and
// only when every rank has succeeded copies them into the parameters. Every error is one line,
// thrown on every rank (ranks that did not see it add "[reported by rank N]").
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/io/hf_name_map.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/runtime/trainer.hpp"

namespace megadsl {

inline constexpr std::string_view dist_checkpoint_format = "megadsl.dist_checkpoint";
inline constexpr int dist_checkpoint_version = 1;

// What a checkpoint carries besides the parameters.
struct checkpoint_extras {
  // Saved when present (moments sharded like their parameters, scalars in metadata.json);
  // returned by load_distributed when the checkpoint has it and it was asked for.
  std::optional<training_state> training;
  // An HF model directory (or hf_files_of a distributed checkpoint) whose config.json, tokenizer
  // files and generation_config.json the checkpoint keeps in its `hf/` folder, so that converting
  // it back to HF (hf_files_of(dir) as save_hf's carry_from) loses none of them, nor a multimodal
  // source's vision tower (carried as hf/multimodal.safetensors). Saving only.
  std::filesystem::path hf_files;
  // More files rank 0 writes into the staging directory before metadata.json (so they land with
  // the checkpoint, atomically): a model's LoRA adapters and their moments (lora_io.hpp's
  // lora_checkpoint_writer, in `lora/`). Saving only.
  std::function<void(const std::filesystem::path& staging)> write_also;
};

struct dist_load_options {
  bool training_state = true;  // also read AdamW's moments (when the checkpoint holds them)
};

// Collective over every rank of `groups` (its `world` group). `params` are this rank's parameters
// (parallel_model::parameters()), `config` the model's resolved configuration.
void save_distributed(const std::vector<named_parameter>& params, const runtime_config& config,
                      const parallel_groups& groups, const std::filesystem::path& dir,
                      const checkpoint_extras& extras = {});

// Collective. Fills `params` in place (under NoGradGuard) from the checkpoint in `dir`, resharded
// to `config.l`; the model's shape and head must be the checkpoint's. Returns the training state
// with moments shaped like `params` (when saved and asked for). Throws checkpoint_error; `params`
// are untouched when it throws.
checkpoint_extras load_distributed(std::vector<named_parameter>& params, const runtime_config& config,
                                   const parallel_groups& groups, const std::filesystem::path& dir,
                                   const dist_load_options& options = {});

// A model's parameters and, with `adapters` (the model's LoRA adapters), their part in `lora/`:
// `extras.training` holds the trainer's state (its moments in the order of the model's
// trainable_parameters(): the adapters' when it has them). Collective.
void save_model_checkpoint(const std::vector<named_parameter>& params, const lora_set* adapters, const runtime_config& config,
                           const parallel_groups& groups, const std::filesystem::path& dir, checkpoint_extras extras,
                           const hf_name_map& names = {});
// Loads them back (adapters: the model's, built with the checkpoint's LoRA settings; a checkpoint
// with adapters for a model without, or the reverse, is refused); the training state's moments are
// in trainable order. Collective.
checkpoint_extras load_model_checkpoint(std::vector<named_parameter>& params, lora_set* adapters, const runtime_config& config,
                                        const parallel_groups& groups, const std::filesystem::path& dir, bool training_state,
                                        const hf_name_map& names = {});

// A model and, optionally, its trainer (with LoRA adapters: theirs too).
template <ModelSpec Spec>
void save_distributed(parallel_model<Spec>& model, const parallel_groups& groups, const std::filesystem::path& dir,
                      const trainer* t = nullptr) {
  checkpoint_extras extras;
  if (t != nullptr) extras.training = t->export_state();
  save_model_checkpoint(model.parameters(), model.lora(), model.config(), groups, dir, std::move(extras));
}

// With a trainer, the checkpoint must hold a training state, which the trainer continues from.
template <ModelSpec Spec>
void load_distributed(parallel_model<Spec>& model, const parallel_groups& groups, const std::filesystem::path& dir,
                      trainer* t = nullptr) {
  checkpoint_extras extras = load_model_checkpoint(model.parameters(), const_cast<lora_set*>(model.lora()), model.config(),
                                                   groups, dir, t != nullptr);
  if (t == nullptr) return;
  if (!extras.training)
    throw checkpoint_error("megadsl: distributed checkpoint " + dir.string() +
                           " holds no training state; load it without a trainer, or save it with one");
  t->import_state(*extras.training);
}

// Parses and checks the text of a metadata.json (what load_distributed reads first) and throws
// checkpoint_error on the first problem. For the fuzzing harness and tools that vet a file.
void check_distributed_metadata(std::string_view text, const std::filesystem::path& dir = ".");

}  // namespace megadsl
