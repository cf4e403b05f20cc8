// HF `config.json` -> a fully static megadsl::shape, and the field-by-field check of a declared
// (static) model against a checkpoint's config.
//
//   auto cfg = megadsl::read_hf_config("Meta-Llama-3-8B");            // a directory or config.json
//   megadsl::shape s = megadsl::resolve(llama3_8b::shape, cfg.s, cfg.file.string());
//
// Implemented in src/spec/hf_config.cpp (target megadsl::core: nlohmann_json, no LibTorch). Every
// error is a `config_error` whose text names the file, the field and the fix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "megadsl/shape.hpp"

namespace megadsl {

// A config.json that cannot be read, is not a Llama-family config, or disagrees with a declaration.
struct config_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct hf_config {
  std::filesystem::path file;       // the config.json that was read
  std::string model_type;           // "llama", "mistral" or "qwen2"
  shape s;                          // every field static; HF's defaults where config.json is silent
  std::vector<std::string> notes;   // what was defaulted or is worth knowing (e.g. sliding windows)
  // The sliding-window attention HF applies (Mistral's `sliding_window`; Qwen2's with
  // `use_sliding_window` on its sliding layers), 0 = none. megadsl computes full causal attention,
  // which is the same for sequences no longer than the window; a model built for this checkpoint
  // takes it as `model_options::attention_window` and refuses longer sequences.
  std::int64_t attention_window = 0;
};

// The model types whose architecture is megadsl's Llama family.
inline constexpr std::string_view supported_model_types[] = {"llama", "mistral", "qwen2", "qwen3", "gemma", "olmo2", "phi3",
                                                             "starcoder2"};

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
// is `score`). `model_type` is "llama", "mistral" or "qwen2"; qwen2 implies the q/k/v bias. A
// non-zero `attention_window` is written as Mistral's `sliding_window` or Qwen2's (on every layer);
// Llama has none, and refuses it.
std::string hf_config_json(const shape& s, std::string_view model_type, bool critic,
                           std::string_view torch_dtype = "float32", std::int64_t attention_window = 0);

// `shape{.hidden = 4096, .layers = 32, ...}`: every field, `dynamic` where unknown.
std::string to_string(const shape& s);

}  // namespace megadsl
