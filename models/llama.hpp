// Meta's Llama 2, 3, 3.1 and 3.2, and TinyLlama, as strong preset types.
//
//   using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.tp = 8, .pp = 4}>;
//
// Each preset is its own struct (not an alias), so a diagnostic names `llama3_8b`, not the shape.
// Values are the published HF `config.json` of the repository in `hf_repo`; `published_params` is
// the parameter count of that checkpoint (tests/static/presets_static.cpp recomputes it from the
// shape).
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/family_config.hpp"
#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// The Llama composition: RMSNorm pre-norms, RoPE, GQA (q/k/v bias per the shape), SwiGLU.
using llama_blocks =
    blocks::decoder<blocks::embedding<>,
                    blocks::block<blocks::pre_norm<blocks::rms_norm<>, blocks::attention<>>,
                                  blocks::pre_norm<blocks::rms_norm<>, blocks::gated_mlp<activation::silu>>>,
                    blocks::rms_norm<>>;

// ---- config.json (megadsl/family_config.hpp) ----

inline constexpr config_key_rule llama_keys[] = {
    {"rms_norm_eps", key_use::read},
    {"attention_bias", key_use::read},        // q/k/v and o_proj biases
    {"mlp_bias", key_use::read},              // gate/up/down biases
    {"pretraining_tp", key_use::no_effect},   // HF's sliced matmuls: the same product
};
inline constexpr family_config llama_config{
    .model_type = "llama", .hf_class = "Llama", .display = "Llama 2/3/3.1/3.2, TinyLlama",
    .arch = &architecture_of<llama_blocks>, .max_positions = 2048, .rms_eps = 1e-6,
    .bias = {.qkv = attention_bias_key, .out = attention_bias_key, .mlp = {"mlp_bias"}}, .keys = llama_keys};

// The Llama family (Llama 2/3/3.1/3.2, TinyLlama); Mistral and Qwen2 are the same composition
// under their own names (models/mistral.hpp, models/qwen.hpp).
template <shape S>
struct llama : decoder_family<llama_blocks, S> {
  static constexpr std::string_view family = llama_config.model_type;
  static constexpr std::string_view name = "llama";
};

// ---- Llama 2: MHA for 7B/13B, GQA (8 kv heads) for 70B; 4k context, theta 1e4 ----
// rms_norm_eps is 1e-5 in the repositories' current config.json (early uploads said 1e-6).

struct llama2_7b : llama<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 32,
                               .ffn = 11008, .vocab = 32000, .max_positions = 4096,
                               .rms_eps = 1e-5, .rope_theta = 10000.0}> {
  static constexpr std::string_view name = "llama2-7b";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-2-7b-hf";
  static constexpr std::int64_t published_params = 6'738'415'616;
};

struct llama2_13b : llama<shape{.hidden = 5120, .layers = 40, .heads = 40, .kv_heads = 40,
                                .ffn = 13824, .vocab = 32000, .max_positions = 4096,
                                .rms_eps = 1e-5, .rope_theta = 10000.0}> {
  static constexpr std::string_view name = "llama2-13b";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-2-13b-hf";
  static constexpr std::int64_t published_params = 13'015'864'320;
};

struct llama2_70b : llama<shape{.hidden = 8192, .layers = 80, .heads = 64, .kv_heads = 8,
                                .ffn = 28672, .vocab = 32000, .max_positions = 4096,
                                .rms_eps = 1e-5, .rope_theta = 10000.0}> {
  static constexpr std::string_view name = "llama2-70b";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-2-70b-hf";
  static constexpr std::int64_t published_params = 68'976'648'192;
};

// ---- Llama 3: 128k-token vocabulary, GQA with 8 kv heads, theta 5e5 ----

struct llama3_8b : llama<shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8,
                               .ffn = 14336, .vocab = 128256, .max_positions = 8192,
                               .rms_eps = 1e-5, .rope_theta = 500000.0}> {
  static constexpr std::string_view name = "llama3-8b";
  static constexpr std::string_view hf_repo = "meta-llama/Meta-Llama-3-8B";
  static constexpr std::int64_t published_params = 8'030'261'248;
};

struct llama3_70b : llama<shape{.hidden = 8192, .layers = 80, .heads = 64, .kv_heads = 8,
                                .ffn = 28672, .vocab = 128256, .max_positions = 8192,
                                .rms_eps = 1e-5, .rope_theta = 500000.0}> {
  static constexpr std::string_view name = "llama3-70b";
  static constexpr std::string_view hf_repo = "meta-llama/Meta-Llama-3-70B";
  static constexpr std::int64_t published_params = 70'553'706'496;
};

// ---- Llama 3.1 / 3.2: 128k context through llama3 rope scaling (original context 8192) ----

struct llama3_1_405b
    : llama<shape{.hidden = 16384, .layers = 126, .heads = 128, .kv_heads = 8, .ffn = 53248,
                  .vocab = 128256, .max_positions = 131072, .rms_eps = 1e-5,
                  .rope_theta = 500000.0,
                  .rope = {.type = rope_type::llama3, .factor = 8.0, .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0, .original_max_positions = 8192}}> {
  static constexpr std::string_view name = "llama3.1-405b";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-3.1-405B";
  static constexpr std::int64_t published_params = 405'853'388'800;
};

// head_dim 64 = 2048 / 32, given explicitly in config.json; embeddings tied.
struct llama3_2_1b
    : llama<shape{.hidden = 2048, .layers = 16, .heads = 32, .kv_heads = 8, .ffn = 8192,
                  .vocab = 128256, .head_dim = 64, .max_positions = 131072, .rms_eps = 1e-5,
                  .rope_theta = 500000.0,
                  .rope = {.type = rope_type::llama3, .factor = 32.0, .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0, .original_max_positions = 8192},
                  .tie_embeddings = true}> {
  static constexpr std::string_view name = "llama3.2-1b";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-3.2-1B";
  static constexpr std::int64_t published_params = 1'235'814'400;
};

// head_dim 128 = 3072 / 24; embeddings tied.
struct llama3_2_3b
    : llama<shape{.hidden = 3072, .layers = 28, .heads = 24, .kv_heads = 8, .ffn = 8192,
                  .vocab = 128256, .head_dim = 128, .max_positions = 131072, .rms_eps = 1e-5,
                  .rope_theta = 500000.0,
                  .rope = {.type = rope_type::llama3, .factor = 32.0, .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0, .original_max_positions = 8192},
                  .tie_embeddings = true}> {
  static constexpr std::string_view name = "llama3.2-3b";
  static constexpr std::string_view hf_repo = "meta-llama/Llama-3.2-3B";
  static constexpr std::int64_t published_params = 3'212'749'824;
};

// ---- TinyLlama: the Llama 2 architecture at 1.1B, 22 layers (only 1, 2, 11, 22 split evenly) ----

struct tinyllama_1_1b : llama<shape{.hidden = 2048, .layers = 22, .heads = 32, .kv_heads = 4,
                                    .ffn = 5632, .vocab = 32000, .max_positions = 2048,
                                    .rms_eps = 1e-5, .rope_theta = 10000.0}> {
  static constexpr std::string_view name = "tinyllama-1.1b";
  static constexpr std::string_view hf_repo = "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T";
  static constexpr std::int64_t published_params = 1'100'048'384;
};

}  // namespace megadsl
