// The block vocabulary a family is composed of (DESIGN decision 16), torch-free.
//
//   using qwen3_blocks = decoder<embedding<>,
//                                block<pre_norm<rms_norm<>, attention<attention_knobs{}, per_head_qk_norm<rms_norm<>>>>,
//                                      pre_norm<rms_norm<>, gated_mlp<activation::silu>>>,
//                                rms_norm<>>;
//   template <shape S> struct qwen3 : decoder_family<qwen3_blocks, S> { ... };
//
// A block is a type with `static constexpr int lower(arch_builder&, const slot&)`: it declares its
// parameters (names relative to the slot it is given, HF names relative to its HF module, shard
// geometry, init, the config switch that adds them), the config.json keys it reads itself
// (b.setting), the layout rules it adds, its FLOPs beyond
// its matrices' (an attention's scores: `score_units`), and its run-time module (a factory compiled
// once in its own source file, layers/block_factories.hpp), and lowers the blocks it wraps. A composition lowers to one `architecture` (architecture.hpp), which the
// shard plan, the formulas, the loaders and savers and the stage read; nothing else in megadsl
// knows a block kind, so a new block is its own files (examples/04_custom_block).
//
// A decoder's layers are one block, or several kinds of layer (`pattern`, `first_k`, `select`):
// the architecture says which layer has which (its `pick`), so the layers of a model may differ.
//
// Numerics of each block (the transformers modules they match):
//   rms_norm<rms>      LlamaRMSNorm: x.float() * rsqrt(mean(x^2) + eps), cast to x's dtype, * w
//   rms_norm<rms_1p>   GemmaRMSNorm: the same in fp32 * (1 + w.float()), then cast
//   rms_norm<rms_wmul> Olmo2RMSNorm: (w * x.float() * rsqrt(...)).to(dtype)
//   layer_norm         nn.LayerNorm with its bias (StarCoder2, GPT-NeoX)
//   layer_norm_no_bias CohereLayerNorm: (x - mean) * rsqrt(var + eps) * w, all in fp32, then cast
//   post_norm<N, X>    OLMo2: x + N(X(x)); pre_norm<N, X>: x + X(N(x))
//   sandwich<N, X>     Gemma2: x + N'(X(N(x))), each norm with its own weight
//   parallel<N, X>     GPT-NeoX: both sublayers on the block's input, x + attn(N1(x)) + mlp(N2(x))
//   parallel_shared_norm<N, A, M>  Cohere: one norm for both, x + attn(N(x)) + mlp(N(x)) (the whole layer)
//   attention<attention_knobs{.storage = interleaved}>  NeoX's query_key_value: [q_h; k_h; v_h] per head
//   attention<attention_knobs{.rope = false}>  a NoPE layer: q and k are not rotated (SmolLM3)
//   attention<{}, full_width_qk_norm<N>>  OLMo2: q and k normed over the whole projection, before RoPE
//   attention<{}, per_head_qk_norm<N>>    Qwen3: q and k normed over head_dim, before RoPE
//   attention<{}, headwise_qk_norm<N>>    Command R+: the same with a weight for every head (models/cohere/)
//   gated_mlp<silu | gelu_tanh>       down(act(gate(x)) * up(x)): SwiGLU (Llama), GeGLU (Gemma)
//   embedding<sqrt_hidden>            Gemma: embed(ids) * sqrt(hidden) rounded to the dtype
//   embedding<none, &key>, pre_norm<N, X, names, &key>, attention_knobs{.score_scale = &key},
//   lm_head<&key, logit_scaling::divided_by>  a family's config key (config_setting) scaling the
//                                     embedding, each sublayer's output, the scores (outright) or the
//                                     logits: Granite's four multipliers; lm_head<&key>: Cohere's
//                                     logit_scale (decoder<E, B, N, names, lm_head<...>>)
//   select<&choice, ...>              a layer choice reading a key of its own (blocks::layer_choice:
//                                     use_qk_norm picks Llama 4's, Cohere's, GLM-4.5's q/k norms)
//   plain_mlp<gelu_tanh | gelu>       c_proj(act(c_fc(x))), both with biases per out_bias (StarCoder2; NeoX exact gelu)
//   decoder<E, B, N, gpt_neox_names>  the HF names of a family's decoder tensors (decoder_names:
//                                     GPT-NeoX's gpt_neox.*, embed_out; Llama's by default)
//   plain_mlp<gelu, gpt_neox_mlp_names>  the HF names of its projections (c_fc / c_proj by default)
//   attention_knobs{.storage = concatenated}, gated_mlp<.., concatenated>: Phi-3's fused HF tensors
//   moe<Router, Experts, Shared, names>  a mixture of experts from slots, each with its rows, knobs and
//                                     the HF names the family binds (blocks/moe.hpp):
//     softmax_router<names, fp32>     HF's: softmax in fp32 over every expert, top-k (renormalised per
//                                     the shape's norm_topk); with a bias on its logits: gpt-oss's
//     grouped_sigmoid_router<names>   DeepSeek-V3's: sigmoid scores, an expert bias that selects, groups
//     experts<act, names>             each expert a gated MLP, one HF tensor per expert and projection
//     stacked_experts<act, names>     every expert in one HF tensor per projection (Llama 4's)
//     clamped_swiglu_experts<names>   gpt-oss's: stacked, with biases and the clamped SwiGLU (its keys)
//     gated_shared_expert<names>      + sigmoid(gate(x)) * shared(x) (Qwen2-MoE)
//     shared_expert<names, presence>  + shared(x) (DeepSeek's shared_experts, HunYuan's shared_mlp)
//                                     a family's own router lives with it (models/llama4/, models/ernie4_5_moe/)
//   attention<attention_knobs{.sinks = true}>  gpt-oss: one learned logit per query head in each row's
//                                     softmax, without a value (eager_attention_forward's sink column)
//   attention<attention_knobs{.chunked = true}, l2_qk_norm>  Llama 4's RoPE layers (l2_qk_norm: models/llama4/): attention within
//                                     chunks of attention_chunk_size tokens (its own key), q/k rms-normed
//                                     per head without a weight; {.rope = false, .temperature = true}:
//                                     its NoPE layers, q scaled by ln(position) (attn_temperature_tuning,
//                                     floor_scale, attn_scale: its own keys)
//   gated_mlp<silu, separate, feed_forward_module>  the same MLP under HF's feed_forward (Llama 4)
//   moe<input_sigmoid_router<..>, stacked_experts<..>, shared_expert<..>, ..>  Llama4TextMoe: top-k
//                                     of the router's logits, each chosen expert fed x * sigmoid(logit)
//                                     (models/llama4/), + the ungated shared expert on x
//   gated_delta_net<grouped | split>  Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet: linear attention by
//                                     the gated delta rule (chunked, exact backward), causal conv, gated
//                                     output norm; HF's in_proj_qkvz + in_proj_ba, or in_proj_qkv/z/b/a
//   gated_attention<per_head_qk_norm<rms_norm<rms_1p>>>  Qwen3NextAttention: q_proj = [q | gate] per
//                                     head, the output times sigmoid(gate) (models/qwen3_next/)
//   mla                               DeepseekV3Attention: multi-head latent attention (models/deepseek_v3/)
//   xielu_mlp                         Apertus: down(xielu(up x)), xIELU's learned scalars (models/apertus/)
//
// One header per core block under megadsl/blocks/; this one includes them all. A block only one
// family uses lives with it (DESIGN decision 16): its type in models/<family>/<block>.hpp, its
// module (if it has its own) in models/<family>/<block>.cpp, which the family's header includes.
#pragma once

#include "megadsl/blocks/builder.hpp"
#include "megadsl/blocks/norms.hpp"
#include "megadsl/blocks/qk_norms.hpp"
#include "megadsl/blocks/attention.hpp"
#include "megadsl/blocks/gated_delta_net.hpp"
#include "megadsl/blocks/gated_mlp.hpp"
#include "megadsl/blocks/plain_mlp.hpp"
#include "megadsl/blocks/moe.hpp"
#include "megadsl/blocks/embedding.hpp"
#include "megadsl/blocks/residuals.hpp"
#include "megadsl/blocks/lm_head.hpp"
#include "megadsl/blocks/decoder.hpp"
#include "megadsl/blocks/lowering.hpp"
