// What a family's HF config.json holds and how megadsl reads it: the data each family declares in
// its own header beside its composition and presets (models/<family>.hpp), listed once in the
// registry (models/registry.hpp). The config reader (src/spec/hf_config.cpp, config_*.cpp) follows it and
// compares no family name. Torch-free.
//
//   inline constexpr config_key_rule olmo2_keys[] = {{"rms_norm_eps", key_use::read}, {"attention_bias", key_use::read}};
//   inline constexpr family_config olmo2_config{.model_type = "olmo2", .hf_class = "Olmo2", .display = "OLMo2",
//                                               .arch = &architecture_of<olmo2_blocks>, .max_positions = 2048,
//                                               .rms_eps = 1e-5, .bias = {.qkv = attention_bias_key, .out = attention_bias_key},
//                                               .keys = olmo2_keys};
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "megadsl/dropout.hpp"
#include "megadsl/layers/blocks.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

class config_view;  // (config_hook.hpp)

// What megadsl does with a config.json key. Every key of the family's transformers config class
// is in the family's rows or in every family's (src/spec/config_keys.cpp); a key in none is unknown
// to the class, ignored by transformers and so by megadsl, which says so in a note.
enum class key_use : std::int8_t {
  read,       // honoured: it sets a shape field, the window, or is checked against the weights
  refused,    // refused unless it holds its neutral value (0, false, {}, null)
  no_effect,  // cannot change the forward/backward numbers (ids, init, generation, bookkeeping)
};
struct config_key_rule {
  std::string_view key;
  key_use use;
  std::string_view note = {};  // said when the key holds something else than 0 or null
};

// Where the attention's sliding window applies, as the family's config class derives it.
enum class window_rule : std::int8_t {
  none,                    // no window (the key, if present, is not the class's, or is cleared)
  every_layer,             // `sliding_window` on every layer
  from_max_window_layers,  // the layers from `max_window_layers` on (28 by default)
  alternate,               // alternate layers from the first, 4096 tokens by default
  nope_layers,             // with `use_sliding_window`, the layers without RoPE (SmolLM3)
};

// Which layers apply RoPE, where the attention window decides it: the shape's nope_layers are then
// the layers that do not slide, always (`sliding`: with no window set no layer rotates) or only
// where a window is set (`sliding_if_windowed`: without one every layer rotates).
enum class rope_layers : std::int8_t { every_layer, sliding, sliding_if_windowed };

// Where one of the shape's bias switches (qkv_bias, out_bias, mlp_bias) comes from: a config.json
// key with its config class's default, or, with no key, the family's fixed value.
struct bias_switch {
  std::string_view key = {};
  bool fallback = false;  // the key's default where config.json leaves it out, or the fixed value
  bool note = false;      // say so when config.json leaves it out
};
// The three switches. Those that share a key are one switch of the config class: the reader sets
// them alike and the writer refuses a model where they differ.
//   {.qkv = {"attention_bias"}, .out = {"attention_bias"}, .mlp = {"mlp_bias"}}   (LlamaConfig's)
//   {.qkv = {"use_bias"}, .out = {"use_bias"}, .mlp = {"use_bias"}}             (one key for all three)
//   {.qkv = {{}, true}}                                                         (q/k/v biases always, no key)
struct bias_keys {
  bias_switch qkv, out, mlp;
};
// The usual one: `attention_bias` (default false) on q, k, v and o_proj (LlamaAttention).
inline constexpr bias_switch attention_bias_key{.key = "attention_bias"};

// A mixture of experts' keys and their defaults.
struct moe_config {
  std::string_view count_key;          // the one transformers' class reads: num_local_experts | num_experts
  bool reads_both_counts = false;      // the class maps num_experts and num_local_experts to one value
  std::int64_t top_k = 0;              // num_experts_per_tok
  std::string_view top_k_key = "num_experts_per_tok";  // (HunYuan's moe_topk: a number, or one per layer, all equal)
  bool shared_as_wide_as_ffn = false;  // one ungated shared MLP of intermediate_size (HunYuan's shared_mlp)
  bool experts_as_wide_as_ffn = false; // Mixtral, OLMoE: experts of intermediate_size, every layer sparse
  bool reads_norm_topk = true;         // norm_topk_prob is read; false: the class always renormalises (Mixtral)
  std::int64_t expert_ffn = 0;         // moe_intermediate_size
  std::string_view expert_ffn_key = "moe_intermediate_size";  // (Llama 4's intermediate_size)
  bool shared_as_wide_as_experts = false;  // the one shared expert as wide as each expert (Llama 4's)
  // Which layers are sparse: every decoder_sparse_step-th but the mlp_only_layers (Qwen), or
  // every interleave_moe_layer_step-th unless `moe_layers` lists them (Llama 4: sparse_layers_key).
  std::string_view sparse_step_key = "decoder_sparse_step";
  bool every_layer = false;  // every layer routes, no key says otherwise (Qwen3.5-MoE)
  std::string_view sparse_layers_key = {};
  std::int64_t shared_expert_ffn = 0;  // shared_expert_intermediate_size
  bool norm_topk = false;              // norm_topk_prob
  // DeepSeek's keys (GLM-4.5): the shared experts as a count of expert widths (n_shared_experts:
  // shared_expert_ffn = count x moe_intermediate_size), and the first layers dense
  // (first_k_dense_replace: dense_layers = the first k).
  std::string_view shared_count_key = {};
  std::int64_t shared_count = 1;
  std::int64_t shared_count_least = 1;  // (ERNIE 4.5: 0, no shared experts)
  std::string_view dense_first_key = {};
  std::int64_t dense_first = 0;
  // ERNIE 4.5's keys: the sparse layers those in [start, end] (end -1: the last) with (i + 1) %
  // sparse_step_key == 0; and the names its config
  // class maps onto count_key and top_k_key (attribute_map: num_experts, num_experts_per_tok).
  std::string_view sparse_first_key = {};
  std::int64_t sparse_first = 0;
  std::string_view sparse_last_key = {};
  std::string_view count_alias = {};
  std::string_view top_k_alias = {};
};

// The multimodal checkpoint whose text model a family is (its model_type and transformers' class),
// and how that class ties the LM head where its top-level tie_word_embeddings is absent: megadsl
// reads and trains the text model (hf_config::wrapper).
struct multimodal_wrapper {
  std::string_view model_type, hf_class;
  bool tie_default = false;
};

// A switch the composition has on: false is refused, saying what the composition does.
struct required_key {
  std::string_view key;
  std::string_view what;
};

struct family_config {
  std::string_view model_type;  // HF's model_type
  std::string_view hf_class;    // transformers' class prefix: <hf_class>ForCausalLM
  std::string_view display;     // the checkpoints it reads, for messages: "Llama 2/3/3.1/3.2, TinyLlama"
  const architecture* arch;     // its composition's (architecture_of<...>)
  // transformers' class defaults for the keys a config.json may leave out
  std::int64_t max_positions = 2048;
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  std::int64_t head_dim = 0;  // 0: hidden / heads
  std::string_view ffn_key = "intermediate_size";  // the dense MLP's width (Llama 4's intermediate_size_mlp)
  bool tie_embeddings = false;
  std::string_view eps_key = "rms_norm_eps";
  std::string_view activation_key = "hidden_act";
  std::string_view legacy_activation = {};  // also the composition's activation (Gemma's "gelu" for the tanh GELU)
  bias_keys bias = {};                      // none by default

  std::string_view theta_key = {};          // 4.x's other name of rope_theta (GPT-NeoX's rotary_emb_base)
  std::string_view partial_rotary_key = {}; // the top-level rotated share of each head; empty: the whole head only
  double partial_rotary_default = 1.0;
  // The config carries 4.x's rope keys (theta_key, partial_rotary_key) beside 5.x's rope_parameters
  // with the partial factor, and plain RoPE only (GPT-NeoX).
  bool legacy_rope_keys = false;
  std::span<const std::string_view> omitted_keys = {};  // shape keys the config class does not have
  bool score_caps = false;                  // Gemma2's query_pre_attn_scalar and tanh soft-caps
  double attn_softcap_default = 50.0, final_softcap_default = 30.0;  // (Gemma2Config's; Gemma 3's are null)
  // RoPE per layer type (Gemma 3, OLMo 3): rope_parameters {full_attention: {...}, sliding_attention:
  // {...}} (or 4.x's rope_theta / rope_scaling for the full layers and local_theta_key for the
  // sliding ones); the sliding layers' plain RoPE base defaults to this (0: one RoPE for all).
  double local_rope_theta = 0.0;
  std::string_view local_theta_key = {};
  std::int64_t full_every = 2;              // window_rule::alternate: layer i slides when (i + 1) % this != 0
  std::int64_t default_window = 4096;       // sliding_window's class default (Gemma2's; gpt-oss's 128)
  window_rule window = window_rule::none;
  bool window_needs_use_flag = false;       // `use_sliding_window` gates the window
  bool reads_layer_types = false;           // an explicit `layer_types` overrides the pattern
  // `no_rope_layers` (one 0/1 per layer, 1 = RoPE), else every `no_rope_layer_interval`-th layer
  // (4 by default) without RoPE: the shape's nope_layers (SmolLM3).
  bool reads_no_rope_layers = false;
  bool empty_no_rope_is_default = false;    // an empty no_rope_layers means the interval's pattern (Llama 4)
  // The layer_types entry each layer has in the composition (Llama 4's chunked_attention on the RoPE
  // layers): an explicit layer_types must say it, and save_hf writes it. Null: none.
  std::string_view (*layer_type)(const shape&, std::int64_t layer) = nullptr;
  // Which layers RoPE rotates where the window decides it (the shape's nope_layers follow).
  rope_layers rope_on = rope_layers::every_layer;
  // RoPE rotates interleaved pairs (x0, x1), (x2, x3), ... of each head's rotated dims, not its two
  // halves: the shape's rope_interleave, always for the family (ERNIE 4.5, GLM-4) or, where this
  // key names it, its default (DeepseekV3Config's rope_interleave).
  bool interleaved_rope = false;
  std::string_view rope_interleave_key = {};
  // The key head_dim is read and written under as well (DeepseekV3Config's qk_rope_head_dim, each
  // head's rotated share); a head_dim key must then agree with it.
  std::string_view head_dim_key = {};
  // Checkpoints store this many multi-token-prediction layers after the decoder's
  // (model.layers.<num_hidden_layers + i>.*; DeepSeek-V3, GLM-4.5), counted by this key (1 when
  // absent): transformers does not load them and megadsl does not run them (hf_config::mtp_layers).
  std::string_view mtp_key = {};
  // A part of a tensor name transformers' class ignores on load (_keys_to_ignore_on_load_unexpected:
  // ERNIE 4.5's "mtp" modules, stored beside the decoder's): such tensors are reported, not loaded.
  std::string_view ignored_tensors = {};
  // The family's own reading of what no block's key and none of the above says (config_hook.hpp:
  // HunYuan's NTK-alpha RoPE, Qwen3-Next's linear layers), after the generic reader; null: none.
  void (*read_own)(const config_view&, shape&) = nullptr;
  std::string_view use_flag_refusal = {};   // `use_sliding_window` true is refused for this reason
  // Neither rope_parameters nor rope_scaling: refused for this reason (Apertus's and gpt-oss's
  // classes then substitute their own RoPE whatever rope_theta says); save_hf always writes them.
  std::string_view rope_must_be_stated = {};
  const moe_config* moe = nullptr;
  std::span<const required_key> required = {};
  // The family's dropout keys (dropout.hpp) with their class defaults; attention_dropout (default
  // 0) is every family's unless listed here or given a rule of its own in `keys`.
  std::span<const dropout_key> dropouts = {};
  std::span<const config_key_rule> keys = {};  // the family's own keys (found before every family's)
  // The composition megadsl's distributed checkpoints of this family recorded before its quirks
  // became its blocks' keys (Granite's: Llama's): such a checkpoint, whose shape holds a value of
  // one of this composition's keys, is read as this family's.
  const architecture* earlier_arch = nullptr;
  multimodal_wrapper multimodal = {};  // empty model_type: none
};

}  // namespace megadsl
