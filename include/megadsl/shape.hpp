// The shape of a Llama-family model: every field static (part of the type) or `dynamic`.
//
//   using tiny = megadsl::llama<megadsl::shape{.hidden = 256, .layers = 4, .heads = 8, ...}>;
//
// A field left out is `dynamic` for sizes (filled from config.json at run time) and the HF default
// for the rest. `head_dim = 0` means hidden / heads (HF's default when config.json has no head_dim).
#pragma once

#include <boost/hana/adapt_struct.hpp>

#include <cstdint>
#include <string_view>

#include "megadsl/static_value.hpp"

namespace megadsl {

enum class rope_type : std::int8_t { none, linear, dynamic_ntk, llama3 };

constexpr std::string_view name_of(rope_type t) {
  switch (t) {
    case rope_type::none: return "none";
    case rope_type::linear: return "linear";
    case rope_type::dynamic_ntk: return "dynamic";
    case rope_type::llama3: return "llama3";
  }
  return "?";
}

// HF `rope_scaling`; the llama3 variant uses all four parameters, linear and dynamic only `factor`.
struct rope_scaling {
  maybe<rope_type> type = rope_type::none;
  real factor = 1.0;
  real low_freq_factor = 1.0;
  real high_freq_factor = 4.0;
  dim original_max_positions = 8192;
};

struct shape {
  dim hidden = dynamic;
  dim layers = dynamic;
  dim heads = dynamic;
  dim kv_heads = dynamic;
  dim ffn = dynamic;  // intermediate_size
  dim vocab = dynamic;
  dim head_dim = 0;   // 0: hidden / heads
  dim max_positions = dynamic;
  real rms_eps = 1e-5;
  real rope_theta = 10000.0;
  rope_scaling rope = {};
  flag qkv_bias = false;        // Qwen2-style bias on q/k/v projections
  flag tie_embeddings = false;  // lm_head shares the embedding weight
};

// Every field dynamic: the form the command-line tool uses for any HF checkpoint.
inline constexpr shape dynamic_shape = {
    .hidden = dynamic, .layers = dynamic, .heads = dynamic, .kv_heads = dynamic,
    .ffn = dynamic, .vocab = dynamic, .head_dim = dynamic, .max_positions = dynamic,
    .rms_eps = dynamic, .rope_theta = dynamic,
    .rope = {.type = dynamic, .factor = dynamic, .low_freq_factor = dynamic,
             .high_freq_factor = dynamic, .original_max_positions = dynamic},
    .qkv_bias = dynamic, .tie_embeddings = dynamic};

// head_dim as the model uses it; dynamic while it cannot be known yet.
constexpr dim effective_head_dim(const shape& s) {
  if (s.head_dim.is_dynamic()) return dynamic;
  if (s.head_dim.get() != 0) return s.head_dim;
  if (s.hidden.is_dynamic() || s.heads.is_dynamic() || s.heads.get() <= 0) return dynamic;
  return s.hidden.get() / s.heads.get();
}

}  // namespace megadsl

// Field names and order are read through Hana (config.json mapping, field-by-field diffs, printing).
BOOST_HANA_ADAPT_STRUCT(megadsl::rope_scaling, type, factor, low_freq_factor, high_freq_factor,
                        original_max_positions);
BOOST_HANA_ADAPT_STRUCT(megadsl::shape, hidden, layers, heads, kv_heads, ffn, vocab, head_dim,
                        max_positions, rms_eps, rope_theta, rope, qkv_bias, tie_embeddings);
