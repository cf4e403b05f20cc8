// The shape of a model: its sizes and config.json's numbers, every field static (part of the type)
// or `dynamic`, and the architecture its family's composition lowers to (architecture.hpp).
//
//   using tiny = megadsl::llama<megadsl::shape{.hidden = 256, .layers = 4, .heads = 8, ...}>;
//
// A field left out is `dynamic` for sizes (filled from config.json at run time) and the HF default
// for the rest. `head_dim = 0` means hidden / heads (HF's default when config.json has no head_dim).
// The family sets `arch`; a user's shape leaves it out.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "megadsl/static_value.hpp"

namespace megadsl {

struct architecture;  // architecture.hpp

enum class rope_type : std::int8_t { none, linear, dynamic_ntk, llama3, yarn };

constexpr std::string_view name_of(rope_type t) {
  switch (t) {
    case rope_type::none: return "none";
    case rope_type::linear: return "linear";
    case rope_type::dynamic_ntk: return "dynamic";
    case rope_type::llama3: return "llama3";
    case rope_type::yarn: return "yarn";
  }
  return "?";
}

// Every value of an enum field of the shape, for parsing names back (metadata.json).
template <class E>
inline constexpr auto enum_values = std::array<E, 0>{};
template <>
inline constexpr auto enum_values<rope_type> = std::array{rope_type::none, rope_type::linear,
                                                          rope_type::dynamic_ntk, rope_type::llama3, rope_type::yarn};

// HF `rope_scaling`; the llama3 variant uses factor, the two frequency factors and the original
// context, linear and dynamic only `factor`, YaRN (DeepSeek-V3, Kimi K2, gpt-oss, Qwen's long
// context) factor, the original context and its own five.
struct rope_scaling {
  maybe<rope_type> type = rope_type::none;
  real factor = 1.0;
  real low_freq_factor = 1.0;
  real high_freq_factor = 4.0;
  dim original_max_positions = 8192;
  real beta_fast = 32.0;         // YaRN: the ramp's ends, in rotations over the original context
  real beta_slow = 1.0;
  real mscale = 0.0;             // YaRN: cos and sin scaled by m(factor, mscale) / m(factor, mscale_all_dim)
  real mscale_all_dim = 0.0;     //       (0: unset; both unset: m(factor)); DeepSeek's MLA scores also by m(factor, mscale_all_dim)^2
  real attention_factor = 0.0;   // YaRN: that scale given outright (0: derived)
  flag truncate = true;          // YaRN: the ramp's ends rounded to whole dimensions (gpt-oss: false)
};

// YaRN's m(s, mu) = 0.1 mu ln s + 1 (1 for s <= 1), as transformers' get_mscale.
inline double yarn_mscale(double factor, double mu = 1.0) { return factor <= 1 ? 1.0 : 0.1 * mu * std::log(factor) + 1.0; }
// The scale of YaRN's cos and sin (transformers' attention_factor); 1 for every other RoPE.
inline double rope_attention_factor(const rope_scaling& r) {
  if (r.type.get() != rope_type::yarn) return 1.0;
  if (r.attention_factor.get() != 0) return r.attention_factor.get();
  if (r.mscale.get() != 0 && r.mscale_all_dim.get() != 0)
    return yarn_mscale(r.factor.get(), r.mscale.get()) / yarn_mscale(r.factor.get(), r.mscale_all_dim.get());
  return yarn_mscale(r.factor.get());
}

// Numbers blocks read from config.json under keys they declare themselves (architecture.hpp's
// config_setting), by key: those config.json (or the declaration) gave; any other key the
// composition declares has its default (megadsl::setting). `dynamic`: not known until config.json
// gives them (dynamic_shape's), so any value config.json holds is taken. Keys are held as text of
// their own (a shape is a template argument), in key order, so that equal settings compare equal.
//
//   .settings = settings_given({{"use_qk_norm", 1}, {"logit_scale", 0.25}})
inline constexpr int max_settings = 8;
inline constexpr std::size_t max_setting_key = 40;
struct given_setting {
  std::array<char, max_setting_key> key{};  // NUL-padded
  double value = 0;
  constexpr std::string_view name() const {
    std::size_t n = 0;
    while (n < key.size() && key[n] != '\0') ++n;
    return {key.data(), n};
  }
  constexpr bool operator==(const given_setting&) const = default;
};
struct block_settings {
  std::array<given_setting, max_settings> given{};
  int count = 0;
  bool dynamic = false;
  constexpr bool operator==(const block_settings&) const = default;

  // The value given for `key`, or null.
  constexpr const double* find(std::string_view key) const {
    for (int i = 0; i < count; ++i)
      if (given[static_cast<std::size_t>(i)].name() == key) return &given[static_cast<std::size_t>(i)].value;
    return nullptr;
  }
  constexpr void set(std::string_view key, double value) {
    if (key.empty() || key.size() >= max_setting_key) throw "megadsl: a config setting's key is empty or longer than max_setting_key (shape.hpp)";
    int at = 0;
    while (at < count && given[static_cast<std::size_t>(at)].name() < key) ++at;
    if (at < count && given[static_cast<std::size_t>(at)].name() == key) {
      given[static_cast<std::size_t>(at)].value = value;
      return;
    }
    if (count == max_settings) throw "megadsl: more config settings given than max_settings (shape.hpp)";
    for (int i = count; i > at; --i) given[static_cast<std::size_t>(i)] = given[static_cast<std::size_t>(i - 1)];
    given_setting g;
    for (std::size_t i = 0; i < key.size(); ++i) g.key[i] = key[i];
    g.value = value;
    given[static_cast<std::size_t>(at)] = g;
    ++count;
  }
};
// Settings given by key, for a shape literal.
constexpr block_settings settings_given(std::initializer_list<std::pair<std::string_view, double>> keys) {
  block_settings out;
  for (const auto& [key, value] : keys) out.set(key, value);
  return out;
}

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
  // The base of a plain RoPE on the sliding (local) layers, whose RoPE differs from the full
  // layers' (Gemma 3, OLMo 3: RoPE per layer type; the scaling applies to the full layers only).
  // 0: every layer takes rope_theta and rope.
  real local_rope_theta = 0.0;
  flag qkv_bias = false;        // Qwen2-style bias on q/k/v projections
  flag tie_embeddings = false;  // lm_head shares the embedding weight
  flag out_bias = false;  // biases on o_proj and a plain MLP's projections (StarCoder2's use_bias, attention_bias)
  flag mlp_bias = false;  // biases on a gated MLP's gate, up and down projections (Llama's mlp_bias)
  // Attention and head numerics of Gemma2 (0 = off: the Llama behaviour).
  real query_pre_attn_scalar = 0.0;  // scores scaled by this^-0.5 instead of head_dim^-0.5
  real attn_softcap = 0.0;           // scores = cap * tanh(scores / cap) before the mask
  real final_softcap = 0.0;          // logits = cap * tanh(logits / cap) before log-softmax
  // The share of each head's dimensions RoPE rotates (the first head_dim * this, rounded down);
  // the rest pass through (GPT-NeoX's rotary_pct, HF's partial_rotary_factor).
  real rotary_fraction = 1.0;
  // (Multi-head latent attention's sizes are its block's own keys, `settings`; head_dim is then the
  // rotated share of each query and key head, qk_rope_head_dim.)
  flag rope_interleave = false;  // RoPE on interleaved pairs (DeepSeek's rope_interleave), not halves
  // A mixture of experts (0 and false for a dense MLP). Numbers from config.json:
  dim experts = 0;            // routed experts per layer (num_local_experts, num_experts)
  dim top_k = 0;              // experts per token (num_experts_per_tok)
  dim expert_ffn = 0;         // each expert's intermediate size (moe_intermediate_size; 0: ffn, Mixtral's)
  dim shared_expert_ffn = 0;  // the shared expert's (shared_expert_intermediate_size)
  flag norm_topk = false;     // the top-k weights renormalised to sum 1 (Mixtral always; norm_topk_prob)
  // Which layers have the mixture, as Qwen's configs say it: layer i does when (i + 1) % sparse_step
  // == 0 and bit i of dense_layers is clear (decoder_sparse_step, mlp_only_layers); the others have
  // a dense gated MLP of width ffn (intermediate_size). Read by the Qwen mixtures' layer choice.
  dim sparse_step = 1;
  dim dense_layers = 0;       // bit i: layer i (< 63) has the dense MLP
  // Layers whose attention applies no RoPE (SmolLM3's no_rope_layers zeros), bit i: layer i (< 64;
  // bit 63 is the sign bit: read it as unsigned, nope_layer).
  // Read by the choice of layer kind of the families that have NoPE layers.
  dim nope_layers = 0;
  // Qwen3-Next's gated DeltaNet layers (0 elsewhere): bit i of linear_layers says layer i (< 63)
  // mixes tokens by the gated delta rule instead of attention (layer_types "linear_attention").
  // Read by the families' choice of layer kind; the block's sizes are its own keys.
  dim linear_layers = 0;
  // The blocks' own config keys (block_settings above): read and written by the generic reader,
  // whatever the family.
  block_settings settings = {};
  // The family's composition lowered (architecture.hpp): its parameters, modules and layer kinds.
  // Set by the family (decoder_family), or from config.json's model_type; null: not known yet.
  const architecture* arch = nullptr;
};

// Every field dynamic: the form the command-line tool uses for any HF checkpoint.
inline constexpr shape dynamic_shape = {
    .hidden = dynamic, .layers = dynamic, .heads = dynamic, .kv_heads = dynamic,
    .ffn = dynamic, .vocab = dynamic, .head_dim = dynamic, .max_positions = dynamic,
    .rms_eps = dynamic, .rope_theta = dynamic,
    .rope = {.type = dynamic, .factor = dynamic, .low_freq_factor = dynamic,
             .high_freq_factor = dynamic, .original_max_positions = dynamic, .beta_fast = dynamic, .beta_slow = dynamic,
             .mscale = dynamic, .mscale_all_dim = dynamic, .attention_factor = dynamic, .truncate = dynamic},
    .local_rope_theta = dynamic,
    .qkv_bias = dynamic, .tie_embeddings = dynamic, .out_bias = dynamic, .mlp_bias = dynamic,
    .query_pre_attn_scalar = dynamic, .attn_softcap = dynamic, .final_softcap = dynamic,
    .rotary_fraction = dynamic, .rope_interleave = dynamic, .experts = dynamic, .top_k = dynamic, .expert_ffn = dynamic,
    .shared_expert_ffn = dynamic, .norm_topk = dynamic, .sparse_step = dynamic, .dense_layers = dynamic, .nope_layers = dynamic,
    .linear_layers = dynamic, .settings = {.dynamic = true}};

// The dimensions of each head RoPE rotates: head_dim * rotary_fraction, rounded down as HF does.
constexpr std::int64_t rotary_dim(std::int64_t head_dim, double fraction) {
  return static_cast<std::int64_t>(static_cast<double>(head_dim) * fraction);
}

// Whether `layer` applies no RoPE (the shape's nope_layers).
constexpr bool nope_layer(const shape& s, std::int64_t layer) {
  return layer >= 0 && layer < 64 && ((static_cast<std::uint64_t>(s.nope_layers.get()) >> layer) & 1u) != 0;
}

// Whether `layer` is a gated DeltaNet layer (the shape's linear_layers).
constexpr bool linear_layer(const shape& s, std::int64_t layer) {
  return layer >= 0 && layer < 63 && ((static_cast<std::uint64_t>(s.linear_layers.get()) >> layer) & 1u) != 0;
}

// head_dim as the model uses it; dynamic while it cannot be known yet.
constexpr dim effective_head_dim(const shape& s) {
  if (s.head_dim.is_dynamic()) return dynamic;
  if (s.head_dim.get() != 0) return s.head_dim;
  if (s.hidden.is_dynamic() || s.heads.is_dynamic() || s.heads.get() <= 0) return dynamic;
  return s.hidden.get() / s.heads.get();
}

// Each expert's intermediate size: moe_intermediate_size, or intermediate_size (Mixtral's experts).
constexpr dim expert_ffn_of(const shape& s) {
  if (s.expert_ffn.is_dynamic()) return dynamic;
  return s.expert_ffn.get() != 0 ? s.expert_ffn : s.ffn;
}

}  // namespace megadsl
