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

#include <filesystem>
#include <memory>
#include <vector>

#include "megadsl/io/hf_name_map.hpp"
#include "megadsl/lora.hpp"
#include "megadsl/runtime/parallel_model.hpp"

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

}  // namespace megadsl
