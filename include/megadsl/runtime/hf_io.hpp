// HuggingFace checkpoints in and out of any layout (DESIGN §4-§7).
//
// Load: config.json is checked against the running model field by field; each rank reads only
// the slices of its own shards from the memory-mapped safetensors (fused QKV and gate/up
// assembled per rank, vocab padded, tied embeddings, q/k/v bias, fp32/bf16/fp16 on disk converted
// to the model's dtype). A critic takes its value head from score.*, v_head.*, value_head.*,
// reward_head.* or an lm_head.weight of shape (1, h); when none exists the head keeps its
// initialisation and the report says so.
// Save: the shards gathered back to HF names and shapes with the true vocab, one safetensors file
// per pipeline stage (with model.safetensors.index.json when pp > 1) and config.json, every file
// written atomically. HF -> any layout -> HF is bit-exact.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "megadsl/io/hf_name_map.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {

struct hf_load_report {
  std::vector<std::string> notes;    // e.g. "value head initialised: ..."
  std::vector<std::string> ignored;  // checkpoint tensors this model does not use (another head's, stale buffers)
  // Where the checkpoint stores the model's tensors (a multimodal checkpoint, hf_config::wrapper:
  // under its own prefix; identity for a text checkpoint). Give it to weight export
  // (export_options::names) so the rollout engine gets the names it loads from the checkpoint.
  hf_name_map names;
};

hf_load_report load_hf(std::vector<named_parameter>& params, const runtime_config& c,
                       const parallel_groups& g, const std::filesystem::path& dir);

// Before a model for the HF checkpoint `dir` is built (nothing allocated yet): config.json's sizes
// must describe the weights (the embedding's, the first layer's projections' shapes and the
// number of layers, from the safetensors headers alone), and the parameters this machine's
// `local_ranks` processes would hold (`bytes_per_parameter` each, split by tp x pp) must fit in
// its available memory. Throws checkpoint_error naming config.json, the sizes and the fix.
void check_before_load(const std::filesystem::path& dir, const shape& s, const layout& l, head_info head,
                       double bytes_per_parameter = 4, std::int64_t local_ranks = 1);

// `model_type`: one of models/registry.hpp's families; empty: the one model_type_for picks.
// Written into a staging directory beside `dir` under a lock (`<dir>.lock`), then swapped in: a
// reader sees the old checkpoint or the new one, a second writer gets a clear error, no file of
// an earlier layout survives. `carry_from` (an HF directory, usually the source of a conversion,
// or hf_files_of(a distributed checkpoint)): its tokenizer files and generation_config.json are
// copied, and its config.json's other fields (token ids, ...) kept under megadsl's; `dir` may not
// be `carry_from` itself (refused: saving would replace the source). An actor whose `carry_from`
// is a multimodal checkpoint of its text model (hf_config::wrapper: Qwen3.5's, Gemma 3's, Llama
// 4's) is written as that checkpoint: its tensors under the source's names, the source's other
// tensors (vision tower, ...) copied in `dtype`, config.json's text_config updated; a distributed
// checkpoint's hf/ serves as well when it carries that part (carry_multimodal_part). A critic, or a
// source without those tensors, is written as the text model alone.
// `merge`: LoRA adapters merged into their bases' tensors (W + s B A, in fp32 before the cast).
void save_hf(std::vector<named_parameter>& params, const runtime_config& c, const parallel_groups& g,
             const std::filesystem::path& dir, at::ScalarType dtype = at::kFloat, std::string model_type = "",
             const std::filesystem::path& carry_from = {}, const lora_set* merge = nullptr);

// Where the HF files that travel with a model's weights are (config.json, tokenizer files,
// generation_config.json): an HF directory itself, or the `hf/` folder of a distributed checkpoint
// that carries them; empty when there is none.
std::filesystem::path hf_files_of(const std::filesystem::path& dir);

// Throws checkpoint_error (naming both) when writing a checkpoint to `target` would lose the
// model's `source` (an HF directory, or hf_files_of a distributed checkpoint): `target` is the
// source, a folder holding it or a folder inside it, by real path. With `overwrite_checkpoint`, a
// distributed checkpoint may be saved over the one it came from. save_hf and save_distributed
// call it; a tool checks with it before any rank starts.
void refuse_target_over_source(const std::filesystem::path& target, const std::filesystem::path& source,
                               const std::string& what, bool overwrite_checkpoint);
// Copies those files (and config.json with `with_config`) from `from` into `to` (created); nothing
// when `from` is empty. Throws checkpoint_error naming the file that cannot be copied.
void copy_hf_files(const std::filesystem::path& from, const std::filesystem::path& to, bool with_config);
// The part of a multimodal checkpoint outside its text model (vision tower, projector, Qwen3.5's
// mtp.*), which the model does not hold, kept in a distributed checkpoint's hf/ as
// `multimodal.safetensors` (the tensors as stored, under their names; the text model's prefix in
// its metadata), so that converting the checkpoint back to HF writes the multimodal checkpoint
// whole. `from`: an HF directory holding a multimodal checkpoint of `model_type`'s text model (the
// part is read from it), or a distributed checkpoint's hf/ holding one (copied); else nothing.
void carry_multimodal_part(const std::filesystem::path& from, const std::filesystem::path& to,
                           const std::string& model_type);

template <class Spec>
hf_load_report load_hf(parallel_model<Spec>& model, const parallel_groups& g, const std::filesystem::path& dir) {
  return load_hf(model.parameters(), model.config(), g, dir);
}
template <class Spec>
void save_hf(parallel_model<Spec>& model, const parallel_groups& g, const std::filesystem::path& dir,
             at::ScalarType dtype = at::kFloat, std::string model_type = "", const std::filesystem::path& carry_from = {},
             bool merge_lora = false) {
  save_hf(model.parameters(), model.config(), g, dir, dtype, std::move(model_type), carry_from,
          merge_lora ? model.lora() : nullptr);
}

}  // namespace megadsl
