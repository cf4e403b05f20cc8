// The fields of `shape`, `rope_scaling` and `layout`, by name and in order, as Hana Structs: read
// where every field is visited (config.json mapping, field-by-field diffs, printing, distributed
// checkpoint metadata). Kept out of shape.hpp and layout.hpp: the adaptation costs most of a
// spec-only translation unit's compile time, and only those few sources need it.
#pragma once

#include <boost/hana/adapt_struct.hpp>

#include "megadsl/layout.hpp"
#include "megadsl/shape.hpp"

BOOST_HANA_ADAPT_STRUCT(megadsl::rope_scaling, type, factor, low_freq_factor, high_freq_factor,
                        original_max_positions, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor,
                        truncate);
BOOST_HANA_ADAPT_STRUCT(megadsl::shape, hidden, layers, heads, kv_heads, ffn, vocab, head_dim,
                        max_positions, rms_eps, rope_theta, rope, local_rope_theta, qkv_bias, tie_embeddings, out_bias, mlp_bias,
                        query_pre_attn_scalar, attn_softcap, final_softcap, rotary_fraction, q_lora_rank,
                        kv_lora_rank, qk_nope_dim, v_head_dim, rope_interleave, experts,
                        top_k, expert_ffn, shared_expert_ffn, norm_topk, routed_scale, expert_groups, group_top_k,
                        sparse_step, dense_layers,
                        nope_layers);
BOOST_HANA_ADAPT_STRUCT(megadsl::layout, tp, pp, vpp, first_stage_layers, last_stage_layers, sp,
                        rmpad, vocab_pad_multiple, cp, ep, etp, recompute);
