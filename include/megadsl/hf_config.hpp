// HF `config.json` -> a fully static megadsl::shape, and the field-by-field check of a declared
// (static) model against a checkpoint's config.
//
//   auto cfg = megadsl::read_hf_config("Meta-Llama-3-8B");            // a directory or config.json
//   megadsl::shape s = megadsl::resolve(llama3_8b::shape, cfg.s, cfg.file.string());
//
// Implemented in src/spec/hf_config.cpp and its config_*.cpp (target megadsl::core: nlohmann_json, no LibTorch). Every
// error is a `config_error` whose text names the file, the field and the fix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megadsl/dropout.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/sliding_window.hpp"

namespace megadsl {

// A config.json that cannot be read, is not a family's megadsl composes (models/registry.hpp:
// `families`), or disagrees with a declaration.
struct config_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct hf_config {
  std::filesystem::path file;       // the config.json that was read
  std::string model_type;           // one of models/registry.hpp's `families` (a multimodal checkpoint's: its text model's)
  // A multimodal checkpoint's own model_type ("qwen3_5", "qwen3_5_moe", "gemma3", "llama4"): its
  // text model (text_config) is what was read, with the LM head tied as the multimodal class ties
  // it; the checkpoint stores it under a prefix (io/hf_name_map.hpp). Empty for a text checkpoint.
  std::string wrapper;
  shape s;                          // every field static; HF's defaults where config.json is silent
  std::vector<std::string> notes;   // what was defaulted or is worth knowing (e.g. sliding windows)
  // The sliding-window attention HF applies and on which layers (sliding_window.hpp); a model
  // built for this checkpoint takes it as `model_options::attention_window`.
  sliding_window attention_window;
  // The dropout HF applies in training (dropout.hpp), from the family's keys or their class
  // defaults (Seed-OSS's 0.1); a model built for this checkpoint takes it as `model_options::dropout`.
  dropout_rates dropout;
  // The multi-token-prediction layers the checkpoint stores after the decoder's (family_config::
  // mtp_key): their tensors are not loaded (load_hf reports them as ignored).
  std::int64_t mtp_layers = 0;
  // Tensors whose names hold this are not loaded (family_config::ignored_tensors: ERNIE 4.5's
  // "mtp" modules, which its class ignores on load); empty: none.
  std::string_view ignored_tensors;
};

// HF's config key for a shape field ("hidden" -> "hidden_size"); the field name itself if none.
std::string_view hf_key_of(std::string_view field);

// Reads `path`: a config.json, or a model directory holding one.
hf_config read_hf_config(const std::filesystem::path& path);

// Parses config.json text; `file` is the name the messages use.
hf_config parse_hf_config(std::string_view json_text, const std::filesystem::path& file = "config.json");

// One line per field where a static declared value disagrees with the config (empty: they agree).
// Dynamic declared fields never disagree; fields the model does not use (rope parameters of an
// unscaled rope, head_dim 0 vs the same explicit value) are compared by what they mean.
std::vector<std::string> mismatches(const shape& declared, const shape& from_config,
                                    std::string_view file = "config.json");

// The declared shape with its dynamic fields taken from the config; throws config_error listing
// every mismatch ("hidden (hidden_size): declared 4096, config.json has 2048; ...").
shape resolve(const shape& declared, const shape& from_config, std::string_view file = "config.json",
              std::string_view model_name = "the declared model");

// The config.json of a fully static shape, as transformers writes it: an actor is
// `<Family>ForCausalLM`, a critic `<Family>ForTokenClassification` with one label (its value head
// is `score`). `model_type` is one of models/registry.hpp's `families`, which must describe the
// model (qwen2 implies the q/k/v bias, ...). A window is written as the family writes it
// (`sliding_window`, with `layer_types` where the family has them); a family without windows
// refuses one. The dropout rates are written in the family's keys; a rate it has no key for is refused.
std::string hf_config_json(const shape& s, std::string_view model_type, bool critic,
                           std::string_view torch_dtype = "float32", const sliding_window& window = {},
                           const dropout_rates& dropout = {});

// The model_type whose config class describes this model with this window: the first of the
// registry's families (models/registry.hpp) with the model's blocks whose config can say its
// biases, window, rotary share and score caps (among Llama's blocks: llama, then mistral for a
// window on every layer, then qwen2 for a q/k/v bias). Empty when no config class describes it.
std::string_view model_type_for(const shape& s, const sliding_window& window = {}, const dropout_rates& dropout = {});

// A family declared outside megadsl (its own family_config, with its composition's architecture):
// from this call on, read_hf_config reads its model_type and save_hf / hf_config_json write it,
// as for the registry's families (models/registry.hpp). Registering one model_type twice keeps
// the first. Call it before the ranks start (examples/04_custom_block).
struct family_config;
void register_family(const family_config& family);

// `cfg`'s dropout with some of its family's dropout keys at other rates (verl's
// model.override_config, say {"attention_dropout": 0.0}); throws config_error naming a key that is
// not one of the family's dropout keys, or a rate outside [0, 1).
dropout_rates dropout_with(const hf_config& cfg, const std::vector<std::pair<std::string, double>>& keys);

// "a window of 4096 tokens on layers 0, 2, 4, ..." / "no sliding window" (messages).
std::string describe(const sliding_window& w);

// `shape{.hidden = 4096, .layers = 32, ...}`: every field, `dynamic` where unknown.
std::string to_string(const shape& s);

}  // namespace megadsl
