// PEFT's LoRA adapter directory (adapter_config.json, adapter_model.safetensors) read into a
// model's adapters, each rank its own shards (layers/lora_linear.hpp) in any layout.
//
//   adapter_config.json   peft_type "LORA"; r, lora_alpha, use_rslora, lora_dropout and
//                         target_modules (a list, or "all-linear") are honoured; a key that would
//                         change the numbers and is not built (DoRA, a bias, rank or alpha patterns,
//                         layers_to_transform, modules_to_save, target_parameters, a regex
//                         target_modules, ...) is refused naming it
//   the tensors           "base_model.model.<HF module>.lora_A.weight" (r, in) and "...lora_B.weight"
//                         (out, r); every one must be an adapter this model applies (a mixture's
//                         experts and routers, the embedding and the LM head take none yet: refused)
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <memory>
#include <vector>

#include "megadsl/io/hf_name_map.hpp"
#include "megadsl/lora.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/runtime/trainer.hpp"

namespace megadsl {

class lora_set;

// adapter_config.json of `dir` as megadsl's lora settings; checkpoint_error naming the file and key.
lora read_peft_config(const std::filesystem::path& dir);

// This rank's adapters of `dir` for the model `c` whose parameters (this rank's shards) are
// `params`: checked against the model (names, shapes, the lora rules) on every rank alike. `names`:
// where the checkpoint stores its text model (a multimodal one under a prefix, as PEFT on it names
// the adapters).
std::shared_ptr<lora_set> load_peft_adapter(const std::filesystem::path& dir, const runtime_config& c, std::int64_t tp_rank,
                                            const std::vector<named_parameter>& params, const hf_name_map& names = {});

// A module's whole adapter (A (r, in), B (out, r), fp32 on the CPU), by its HF module name.
using whole_lora_source = std::function<std::pair<at::Tensor, at::Tensor>(const std::string& module)>;

// This rank's adapters, cut from each adapted module's whole A and B (`whole`, called for every
// module of this rank's layers, alike on every rank) as the base's shard is (DESIGN decision 21).
std::shared_ptr<lora_set> shard_adapters(const lora& settings, const runtime_config& c, std::int64_t tp_rank,
                                         const std::vector<named_parameter>& params, const whole_lora_source& whole);

// new_adapters (fresh adapters, PEFT's initialisation) is declared in parallel_model.hpp: a model
// whose type carries adapters attaches them at construction.

// adapter_config.json for `settings`, as PEFT's LoraConfig.to_dict writes the keys megadsl honours.
std::string peft_config_json(const lora& settings);

// Every adapter of the model (trained or not), whole, under PEFT's names
// ("base_model.model.<module>.lora_A.weight", the text model's names through `names`), in fp32 on
// the CPU, on every rank: a collective over the job (tp gathers the shards, pp the stages').
std::vector<std::pair<std::string, at::Tensor>> gather_peft_adapter(const lora_set& set, const runtime_config& c,
                                                                   const parallel_groups& g, const hf_name_map& names = {});

// Distributed checkpoints of a model with adapters (runtime/dist_checkpoint.hpp): the base as
// usual, and in the checkpoint's `lora/` folder the adapters in PEFT's format plus AdamW's moments
// of them, whole, in optimizer.safetensors ("exp_avg/<PEFT name>", "exp_avg_sq/<PEFT name>"):
// layout-free, so a run resumes in any layout.
inline constexpr std::string_view lora_checkpoint_folder = "lora";

// Collective over the job: the adapters and, when `state` holds moments (in the order of the
// model's trainable_parameters()), the moments, gathered whole; returns what rank 0 writes into
// the staging directory (checkpoint_extras::write_also).
std::function<void(const std::filesystem::path&)> lora_checkpoint_writer(const lora_set& set, const training_state* state,
                                                                        const runtime_config& c, const parallel_groups& g,
                                                                        const hf_name_map& names = {});

// Reads checkpoint `dir`'s `lora/` into `set` (the model's adapters: the same rank, alpha and
// targets, else checkpoint_error naming both), each rank its shards; with `state`, the moments in
// trainable order into state->exp_avg / exp_avg_sq (none when it was saved before AdamW's first
// step: AdamW starts fresh). Every rank checks every module's tensors alike before reading.
void load_lora_checkpoint(const std::filesystem::path& dir, lora_set& set, const runtime_config& c, std::int64_t tp_rank,
                          const std::vector<named_parameter>& params, const hf_name_map& names, training_state* state);

// The adapters `set` (trained or not) written in PEFT's format to `dir` (adapter_config.json,
// adapter_model.safetensors under "base_model.model.<module>.lora_A.weight", the text model's
// names through `names`): one file whatever the layout, which PEFT's PeftModel.from_pretrained
// loads. A collective over the job (the stages' adapters meet on the writer); atomic: `dir` holds
// the old adapter or the new one.
void save_peft_adapter(const std::filesystem::path& dir, const lora_set& set, const runtime_config& c,
                       const parallel_groups& g, const hf_name_map& names = {});

}  // namespace megadsl
