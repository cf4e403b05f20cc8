// GPT-NeoX / Pythia as strong preset types: the gpt_neox composition (LayerNorms with biases, q/k/v
// interleaved per head, RoPE on a quarter of each head, parallel residual, exact-GELU MLP with
// biases), untied embed_in / embed_out.
#pragma once

#include <cstdint>
#include <string_view>

#include "megadsl/model.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

// GPT-NeoX (Pythia): LayerNorms, q/k/v interleaved per head in one tensor, attention and MLP side
// by side on the block's input, exact GELU; its HF names (gpt_neox.*, embed_out). Its partial
// rotary share is a number of the shape (rotary_fraction, config.json's partial_rotary_factor).
using gpt_neox_blocks = blocks::decoder<
    blocks::embedding<>,
    blocks::block<blocks::parallel<blocks::layer_norm, blocks::attention<blocks::attention_knobs{.storage = tensor_storage::interleaved}>>,
                  blocks::parallel<blocks::layer_norm, blocks::plain_mlp<activation::gelu>>>,
    blocks::layer_norm, name_scheme::gpt_neox>;

// The family: biases everywhere (qkv_bias, out_bias); the critic's head is HF's `classifier`.
template <shape S>
struct gpt_neox : decoder_family<gpt_neox_blocks, S> {
  static constexpr std::string_view family = "gpt_neox";
  static constexpr std::string_view name = "gpt_neox";
};

// 16 heads of 128, 32 of whose dims rotate; vocab 50304 (the tokenizer's 50277, padded by EleutherAI).
struct pythia_1_4b : gpt_neox<shape{.hidden = 2048, .layers = 24, .heads = 16, .kv_heads = 16, .ffn = 8192,
                                    .vocab = 50304, .max_positions = 2048, .rms_eps = 1e-5,
                                    .rope_theta = 10000.0, .qkv_bias = true, .tie_embeddings = false,
                                    .out_bias = true, .rotary_fraction = 0.25}> {
  static constexpr std::string_view name = "pythia-1.4b";
  static constexpr std::string_view hf_repo = "EleutherAI/pythia-1.4b";
  static constexpr std::int64_t published_params = 1'414'647'808;
};

}  // namespace megadsl
