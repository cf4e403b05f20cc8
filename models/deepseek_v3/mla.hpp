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

constexpr void mla_rule(const shape& s, const layout& l, violations& out) {
  if (megadsl::detail::known(s.kv_lora_rank, s.qk_nope_dim, s.v_head_dim) &&
      (s.kv_lora_rank.get() < 1 || s.qk_nope_dim.get() < 0 || s.v_head_dim.get() < 1))
    out.add("positive_sizes", {s.kv_lora_rank.get(), s.v_head_dim.get()})
        .add("kv_lora_rank = ", s.kv_lora_rank.get(), " and v_head_dim = ", s.v_head_dim.get(),
             ": multi-head latent attention needs both >= 1 (and qk_nope_head_dim >= 0)");
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
  static constexpr std::int64_t qk_dim(const shape& s) { return s.qk_nope_dim.get() + effective_head_dim(s).get(); }
  static constexpr row_dims q_down(const shape& s) { return {s.q_lora_rank.get(), s.hidden.get()}; }
  static constexpr row_dims q_norm(const shape& s) { return {s.q_lora_rank.get(), 0}; }
  static constexpr row_dims q_up(const shape& s) { return {s.heads.get() * qk_dim(s), s.q_lora_rank.get()}; }
  static constexpr row_dims q_full(const shape& s) { return {s.heads.get() * qk_dim(s), s.hidden.get()}; }
  static constexpr row_dims kv_down(const shape& s) {
    return {s.kv_lora_rank.get() + effective_head_dim(s).get(), s.hidden.get()};
  }
  static constexpr row_dims kv_norm(const shape& s) { return {s.kv_lora_rank.get(), 0}; }
  static constexpr row_dims kv_up(const shape& s) {
    return {s.heads.get() * (s.qk_nope_dim.get() + s.v_head_dim.get()), s.kv_lora_rank.get()};
  }
  static constexpr row_dims out(const shape& s) { return {s.hidden.get(), s.heads.get() * s.v_head_dim.get()}; }
  // Its scores: q k^T over qk_dim and p v over v_head_dim per head, the mean of the two widths in
  // the formulas' unit (heads x head_dim).
  static constexpr std::int64_t score_units(const shape& s) { return s.heads.get() * (qk_dim(s) + s.v_head_dim.get()) / 2; }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    const auto known = [](const dim& v) { return v.is_static() ? v.get() : std::int64_t{-1}; };
    t.add("  q ", s.q_lora_rank.is_static() && s.q_lora_rank.get() == 0 ? "direct" : "via rank ", known(s.q_lora_rank),
          ", kv via rank ", known(s.kv_lora_rank), ", heads [nope ", known(s.qk_nope_dim), " | rope ", known(s.head_dim),
          "], v ", known(s.v_head_dim), s.rope_interleave.is_static() && s.rope_interleave.get() ? ", rope on pairs" : "",
          "  [self_attn: q_a_proj/q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("self_attn");
    const auto param = [&](std::string_view name, std::string_view hf, row_geometry_fn g, presence when, bool partial,
                           param_init init = param_init::normal) {
      b.param(at.sub(name, hf), {"weight", g, {"weight"}, 1, when, false, partial, init});
    };
    param("q_down", "q_a_proj", &geo::whole<&q_down>, presence::q_lora, true);
    param("q_latent_norm", "q_a_layernorm", &geo::whole<&q_norm>, presence::q_lora, true, param_init::ones);
    param("q_up", "q_b_proj", &geo::column<&q_up>, presence::q_lora, false);
    param("q_proj", "q_proj", &geo::column<&q_full>, presence::q_direct, false);
    param("kv_down", "kv_a_proj_with_mqa", &geo::whole<&kv_down>, presence::always, true);
    param("kv_latent_norm", "kv_a_layernorm", &geo::whole<&kv_norm>, presence::always, true, param_init::ones);
    param("kv_up", "kv_b_proj", &geo::column<&kv_up>, presence::always, false);
    param("o_proj", "o_proj", &geo::row<&out>, presence::always, false);
    b.rule(&mla_rule);
    return b.cp_traffic(b.costs(b.node(at, &modules::mla, {}, "mla", "mla (multi-head latent attention)", &details),
                                {.whole = 3, .split = 8, .scores = 5}, &score_units),
                        &cp_sent);
  }
  // Under cp: each tp rank's heads' [q | k_nope | v] there and the output back by all-to-all, the
  // shared rotary key (head_dim wide) gathered whole.
  static constexpr double cp_sent(const shape& s, std::int64_t tp, std::int64_t cp) {
    const std::int64_t n = s.heads.get() / tp, nope = s.qk_nope_dim.get(), v = s.v_head_dim.get();
    return static_cast<double>(n * (qk_dim(s) + nope + 2 * v)) * all_to_all_share(cp) +
           static_cast<double>(effective_head_dim(s).get() * (cp - 1));
  }
};

}  // namespace megadsl::blocks
