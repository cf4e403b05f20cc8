// DeepSeek-V3's multi-head latent attention: a block only its family uses, so it lives with the
// family (DESIGN decision 16), its module in mla.cpp beside this file.
#pragma once

#include <memory>

#include "megadsl/blocks/attention.hpp"

namespace megadsl::modules {
// Its module (models/deepseek_v3/mla.cpp; weak outside the runtime library, as the core's are).
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> mla(const block_build& b);
}  // namespace megadsl::modules

namespace megadsl::blocks {

// Its sizes: its own config.json keys (DeepseekV3Config's defaults). Each head's rotated share,
// qk_rope_head_dim, is the shape's head_dim (the family reads head_dim under that key).
inline constexpr config_setting q_lora_rank{.key = "q_lora_rank", .fallback = 1536, .kind = setting_kind::integer_or_null,
                                            .least = 1, .meaning = "the query's low rank (null: q_proj directly)"};
inline constexpr config_setting kv_lora_rank{.key = "kv_lora_rank", .fallback = 512, .kind = setting_kind::integer, .least = 1,
                                             .meaning = "the compressed kv's rank"};
inline constexpr config_setting qk_nope_head_dim{.key = "qk_nope_head_dim", .fallback = 128, .kind = setting_kind::integer,
                                                 .least = 0, .meaning = "each head's unrotated query/key dimensions"};
inline constexpr config_setting v_head_dim{.key = "v_head_dim", .fallback = 128, .kind = setting_kind::integer, .least = 1,
                                           .meaning = "each head's value dimensions"};
// The sizes a shape gives them (0 while its settings are not known yet).
struct mla_sizes {
  std::int64_t q_rank = 0, kv_rank = 0, nope = 0, v = 0;
  static constexpr mla_sizes of(const shape& s) {
    if (s.arch == nullptr || s.settings.dynamic) return {};
    const auto n = [&](const config_setting& c) { return static_cast<std::int64_t>(setting(s, c.key)); };
    return {n(q_lora_rank), n(kv_lora_rank), n(qk_nope_head_dim), n(v_head_dim)};
  }
};

// Under invariant arithmetic o_proj's input, num_heads * v_head_dim, is summed in equal chunks.
constexpr void mla_rule(const shape& s, const layout& l, violations& out) {
  const mla_sizes m = mla_sizes::of(s);
  if (m.kv_rank < 1 || !l.invariant.is_static() || !l.invariant.get() || !s.heads.is_static()) return;
  if (const std::int64_t width = s.heads.get() * m.v; width % megadsl::detail::invariant_chunks != 0)
    out.add("invariant_chunks_fit", {width})
        .add("invariant arithmetic splits num_heads * v_head_dim (o_proj's input) = ", width, " into ",
             megadsl::detail::invariant_chunks, " equal chunks, and it does not divide; this model cannot run with invariant");
}


// DeepSeek-V3's multi-head latent attention (DeepseekV3Attention; Kimi K2, Moonlight): the query
// through a low rank (q_a_proj, its RMSNorm q_a_layernorm, q_b_proj) or directly (q_proj, where
// q_lora_rank is 0); the kv compressed to kv_lora_rank plus one RoPE key shared by every head
// (kv_a_proj_with_mqa), the compressed part normed (kv_a_layernorm) and projected up to each head's
// [k_nope | v] (kv_b_proj); each head's q and k are [nope (qk_nope_dim) | rope (head_dim)], its v
// v_head_dim wide; o_proj. The down projections and their norms (eps 1e-6, Llama's cast order)
// are replicated, applied to the whole stream on every tp rank (their gradients partial over tp);
// the up projections split the heads over tp (column), o_proj is row-parallel.
struct mla {
  static constexpr mla_sizes m(const shape& s) { return mla_sizes::of(s); }
  static constexpr std::int64_t qk_dim(const shape& s) { return m(s).nope + effective_head_dim(s).get(); }
  static constexpr row_dims q_down(const shape& s) { return {m(s).q_rank, s.hidden.get()}; }
  static constexpr row_dims q_norm(const shape& s) { return {m(s).q_rank, 0}; }
  static constexpr row_dims q_up(const shape& s) { return {s.heads.get() * qk_dim(s), m(s).q_rank}; }
  static constexpr row_dims q_full(const shape& s) { return {s.heads.get() * qk_dim(s), s.hidden.get()}; }
  static constexpr row_dims kv_down(const shape& s) { return {m(s).kv_rank + effective_head_dim(s).get(), s.hidden.get()}; }
  static constexpr row_dims kv_norm(const shape& s) { return {m(s).kv_rank, 0}; }
  static constexpr row_dims kv_up(const shape& s) { return {s.heads.get() * (m(s).nope + m(s).v), m(s).kv_rank}; }
  static constexpr row_dims out(const shape& s) { return {s.hidden.get(), s.heads.get() * m(s).v}; }
  // Its scores: q k^T over qk_dim and p v over v_head_dim per head, the mean of the two widths in
  // the formulas' unit (heads x head_dim).
  static constexpr std::int64_t score_units(const shape& s) { return s.heads.get() * (qk_dim(s) + m(s).v) / 2; }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    const mla_sizes z = m(s);
    const bool known = z.kv_rank > 0;
    const auto show = [&](std::int64_t v) { return known ? v : std::int64_t{-1}; };
    if (known && z.q_rank == 0) t.add("  q direct");
    else t.add("  q via rank ", show(z.q_rank));
    t.add(", kv via rank ", show(z.kv_rank),
          ", heads [nope ", show(z.nope), " | rope ", s.head_dim.is_static() ? s.head_dim.get() : std::int64_t{-1}, "], v ",
          show(z.v), s.rope_interleave.is_static() && s.rope_interleave.get() ? ", rope on pairs" : "",
          "  [self_attn: q_a_proj/q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("self_attn");
    b.setting(q_lora_rank);
    b.setting(kv_lora_rank);
    b.setting(qk_nope_head_dim);
    b.setting(v_head_dim);
    const auto param = [&](std::string_view name, std::string_view hf, row_geometry_fn g, presence when, bool partial,
                           param_init init = param_init::normal) {
      b.param(at.sub(name, hf), {.name = "weight", .geometry = g, .hf = {"weight"}, .hf_count = 1, .when = when,
                                 .grad_partial_over_tp = partial, .init = init,
                                 .when_key = when == presence::always ? std::string_view{} : q_lora_rank.key});
    };
    // The query through its low rank where q_lora_rank is given, else q_proj directly.
    param("q_down", "q_a_proj", &geo::whole<&q_down>, presence::key_nonzero, true);
    param("q_latent_norm", "q_a_layernorm", &geo::whole<&q_norm>, presence::key_nonzero, true, param_init::ones);
    param("q_up", "q_b_proj", &geo::column<&q_up>, presence::key_nonzero, false);
    param("q_proj", "q_proj", &geo::column<&q_full>, presence::key_zero, false);
    param("kv_down", "kv_a_proj_with_mqa", &geo::whole<&kv_down>, presence::always, true);
    param("kv_latent_norm", "kv_a_layernorm", &geo::whole<&kv_norm>, presence::always, true, param_init::ones);
    param("kv_up", "kv_b_proj", &geo::column<&kv_up>, presence::always, false);
    param("o_proj", "o_proj", &geo::row<&out>, presence::always, false);
    b.rule(&mla_rule);
    return b.ring_traffic(b.cp_traffic(b.costs(b.node(at, &modules::mla, {}, "mla", "mla (multi-head latent attention)", &details),
                                               {.whole = 3, .split = 8, .scores = 5}, &score_units),
                                       &cp_sent),
                          &ring_sent);
  }
  // Under the ring: every head of the tp rank's k (nope + rope wide, the shared rotary key in each)
  // and v (its own width).
  static constexpr double ring_sent(const shape& s, std::int64_t tp) {
    return static_cast<double>(s.heads.get() / tp * (qk_dim(s) + m(s).v));
  }
  // Under cp: each tp rank's heads' [q | k_nope | v] there and the output back by all-to-all, the
  // shared rotary key (head_dim wide) gathered whole.
  static constexpr double cp_sent(const shape& s, std::int64_t tp, std::int64_t cp) {
    const std::int64_t n = s.heads.get() / tp, nope = m(s).nope, v = m(s).v;
    return static_cast<double>(n * (qk_dim(s) + nope + 2 * v)) * all_to_all_share(cp) +
           static_cast<double>(effective_head_dim(s).get() * (cp - 1));
  }
};

}  // namespace megadsl::blocks
