// Tiny test models: small enough for fp32 CPU runs under every layout the runtime tests use.
//
// tiny_llama:  GQA (8 q / 2 kv heads, so tp 4 and 8 exercise kv replication), ffn 688 = 16 * 43
//              (tp up to 16), vocab 1000 (not a multiple of 128: padding is exercised on every tp),
//              4 layers (pp 1, 2, 4; pp 2 x vpp 2).
// tiny_qwen:   the same sizes plus q/k/v bias and tied embeddings (the Qwen2 / Llama 3.2 paths).
// tiny_llama3: llama3 rope scaling with a short original context, so scaling changes the result
//              at the sequence lengths the tests use.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/models/llama.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

struct tiny_llama : llama<shape{.hidden = 256, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 688,
                                .vocab = 1000, .max_positions = 512, .rms_eps = 1e-5,
                                .rope_theta = 10000.0}> {
  static constexpr std::string_view name = "tiny";
  static constexpr std::string_view hf_repo = "(megadsl test model)";
  static constexpr std::int64_t published_params = 3'283'200;
};

struct tiny_qwen : llama<shape{.hidden = 256, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 688,
                               .vocab = 1000, .max_positions = 512, .rms_eps = 1e-6,
                               .rope_theta = 1000000.0, .qkv_bias = true,
                               .tie_embeddings = true}> {
  static constexpr std::string_view name = "tiny-qwen";
  static constexpr std::string_view hf_repo = "(megadsl test model)";
  static constexpr std::int64_t published_params = 3'028'736;
};

struct tiny_llama3
    : llama<shape{.hidden = 256, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 688,
                  .vocab = 1000, .max_positions = 512, .rms_eps = 1e-5, .rope_theta = 500000.0,
                  .rope = {.type = rope_type::llama3, .factor = 8.0, .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0, .original_max_positions = 64},
                  .tie_embeddings = true}> {
  static constexpr std::string_view name = "tiny-llama3";
  static constexpr std::string_view hf_repo = "(megadsl test model)";
  static constexpr std::int64_t published_params = 3'027'200;
};

}  // namespace megadsl
