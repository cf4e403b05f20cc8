// The fields of `shape`, `rope_scaling` and `layout`, by name and in order, as Hana Structs: read
// where every field is visited (config.json mapping, field-by-field diffs, printing, distributed
// checkpoint metadata). Kept out of shape.hpp and layout.hpp: the adaptation costs most of a
// spec-only translation unit's compile time, and only those few sources need it.
#pragma once

#include <boost/hana/adapt_struct.hpp>
#include <boost/hana/pair.hpp>
#include <boost/hana/string.hpp>
#include <boost/hana/tuple.hpp>

#include "megadsl/layout.hpp"
#include "megadsl/shape.hpp"

BOOST_HANA_ADAPT_STRUCT(megadsl::rope_scaling, type, factor, low_freq_factor, high_freq_factor,
                        original_max_positions, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor,
                        truncate);
// shape has more fields than BOOST_HANA_ADAPT_STRUCT takes (39), so its accessors are written out
// as the macro writes them: (compile-time name, accessor) pairs in declaration order.
#define MEGADSL_SHAPE_FIELD(m)                                                                       \
  ::boost::hana::make_pair(BOOST_HANA_STRING(#m),                                                   \
                           [](auto&& x) -> decltype(auto) { return (static_cast<decltype(x)&&>(x).m); })
namespace boost::hana {
template <>
struct accessors_impl<megadsl::shape> {
  static constexpr auto apply() {
    return ::boost::hana::make_tuple(
        MEGADSL_SHAPE_FIELD(hidden),
        MEGADSL_SHAPE_FIELD(layers),
        MEGADSL_SHAPE_FIELD(heads),
        MEGADSL_SHAPE_FIELD(kv_heads),
        MEGADSL_SHAPE_FIELD(ffn),
        MEGADSL_SHAPE_FIELD(vocab),
        MEGADSL_SHAPE_FIELD(head_dim),
        MEGADSL_SHAPE_FIELD(max_positions),
        MEGADSL_SHAPE_FIELD(rms_eps),
        MEGADSL_SHAPE_FIELD(rope_theta),
        MEGADSL_SHAPE_FIELD(rope),
        MEGADSL_SHAPE_FIELD(local_rope_theta),
        MEGADSL_SHAPE_FIELD(qkv_bias),
        MEGADSL_SHAPE_FIELD(tie_embeddings),
        MEGADSL_SHAPE_FIELD(out_bias),
        MEGADSL_SHAPE_FIELD(mlp_bias),
        MEGADSL_SHAPE_FIELD(query_pre_attn_scalar),
        MEGADSL_SHAPE_FIELD(attn_softcap),
        MEGADSL_SHAPE_FIELD(final_softcap),
        MEGADSL_SHAPE_FIELD(rotary_fraction),
        MEGADSL_SHAPE_FIELD(rope_interleave),
        MEGADSL_SHAPE_FIELD(experts),
        MEGADSL_SHAPE_FIELD(top_k),
        MEGADSL_SHAPE_FIELD(expert_ffn),
        MEGADSL_SHAPE_FIELD(shared_expert_ffn),
        MEGADSL_SHAPE_FIELD(norm_topk),
        MEGADSL_SHAPE_FIELD(sparse_step),
        MEGADSL_SHAPE_FIELD(dense_layers),
        MEGADSL_SHAPE_FIELD(nope_layers),
        MEGADSL_SHAPE_FIELD(linear_layers));
  }
};
}  // namespace boost::hana
#undef MEGADSL_SHAPE_FIELD
BOOST_HANA_ADAPT_STRUCT(megadsl::layout, tp, pp, vpp, first_stage_layers, last_stage_layers, sp,
                        rmpad, vocab_pad_multiple, cp, cp_comm, cp_a2a, ep, etp, recompute, invariant);
