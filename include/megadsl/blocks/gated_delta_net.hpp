// Qwen3-Next's and Qwen3.5's gated DeltaNet (linear attention by the gated delta rule).
#pragma once

#include "megadsl/blocks/attention.hpp"

namespace megadsl::blocks {

// Its sizes: its own config.json keys (Qwen3NextConfig's and Qwen3_5TextConfig's defaults).
inline constexpr config_setting linear_num_key_heads{.key = "linear_num_key_heads", .fallback = 16, .kind = setting_kind::integer,
                                                     .least = 1, .meaning = "the gated DeltaNet's q/k heads"};
inline constexpr config_setting linear_num_value_heads{.key = "linear_num_value_heads", .fallback = 32, .kind = setting_kind::integer,
                                                       .least = 1, .meaning = "the gated DeltaNet's v heads, a multiple of its key heads"};
inline constexpr config_setting linear_key_head_dim{.key = "linear_key_head_dim", .fallback = 128, .kind = setting_kind::integer,
                                                    .least = 1, .meaning = "each q/k head's dimensions"};
inline constexpr config_setting linear_value_head_dim{.key = "linear_value_head_dim", .fallback = 128, .kind = setting_kind::integer,
                                                      .least = 1, .meaning = "each v head's dimensions"};
inline constexpr config_setting linear_conv_kernel_dim{.key = "linear_conv_kernel_dim", .fallback = 4, .kind = setting_kind::integer,
                                                       .least = 1, .meaning = "the causal conv's taps"};
// The sizes a shape gives them (0 while its settings are not known yet).
struct delta_net_sizes {
  std::int64_t key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0, conv = 0;
  static constexpr delta_net_sizes of(const shape& s) {
    if (s.arch == nullptr || s.settings.dynamic) return {};
    const auto n = [&](const config_setting& c) { return static_cast<std::int64_t>(setting(s, c.key)); };
    return {n(linear_num_key_heads), n(linear_num_value_heads), n(linear_key_head_dim), n(linear_value_head_dim),
            n(linear_conv_kernel_dim)};
  }
};

constexpr void gated_delta_net_rule(const shape& s, const layout& l, violations& out) {
  const delta_net_sizes d = delta_net_sizes::of(s);
  if (d.key_heads < 1) return;  // not known yet
  const std::int64_t nk = d.key_heads, nv = d.value_heads;
  if (nv % nk != 0)
    out.add("linear_value_heads_per_key_head", {nv, nk})
        .add("linear_num_value_heads = ", nv, " is not a multiple of linear_num_key_heads = ", nk,
             ": each key head serves a whole number of value heads");
  if (l.tp.is_static() && l.tp.get() > 0 && nk % l.tp.get() != 0)
    out.add("linear_heads_divisible_by_tp", {nk, l.tp.get()})
        .add("linear_num_key_heads = ", nk, " is not divisible by tp = ", l.tp.get(),
             ": each tp rank takes whole key heads of the gated DeltaNet with their value heads");
  else if (l.tp.is_static() && l.cp.is_static() && l.tp.get() > 0 && l.cp.get() > 1 && l.cp_comm.is_static() &&
           !cp_ring(l) && nk % (l.tp.get() * l.cp.get()) != 0)
    out.add("cp_splits_heads", {nk, l.tp.get(), l.cp.get()})
        .add("linear_num_key_heads = ", nk, " is not divisible by tp x cp = ", l.tp.get() * l.cp.get(),
             ": under context parallelism each cp rank runs the gated delta rule over whole sequences for an equal "
             "share of its tp rank's key heads (Ulysses)");
  refuse_cp_ring(l, "the gated DeltaNet (its recurrent state would pass along the ring)", out);
  if (l.invariant.is_static() && l.invariant.get() && (nv * d.value_dim) % megadsl::detail::invariant_chunks != 0)
    out.add("invariant_chunks_fit", {nv * d.value_dim})
        .add("invariant arithmetic splits linear value heads * their dim (out_proj's input) = ", nv * d.value_dim, " into ",
             megadsl::detail::invariant_chunks, " equal chunks, and it does not divide; this model cannot run with invariant");
}

// How HF stores a gated DeltaNet's input projections: Qwen3-Next's in_proj_qkvz (per key head
// [q | k | v of its value heads | z of them]) and in_proj_ba (per key head [b | a] of its value
// heads), or Qwen3.5's in_proj_qkv ([all q | all k | all v]), in_proj_z, in_proj_b and in_proj_a.
enum class delta_net_storage : std::int8_t { grouped, split };

// The gated DeltaNet (Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet), a linear-attention layer: the
// input projections (column-parallel by whole key heads with their value heads: grouped per key
// head, HF's rows are contiguous per rank; split, each of q, k and v is its own slot of in_proj_qkv,
// geo::column_slots); a causal depthwise conv (conv1d, linear_conv_kernel_dim taps) and SiLU over
// the channels [q | k | v]; q and k L2-normed per head, q scaled by linear_key_head_dim^-1/2; the gated
// delta rule with decay g = -exp(A_log) softplus(a + dt_bias) and rate beta = sigmoid(b), each value
// head reading its key head; the output RMS-normed per head (weight per dim) times SiLU(z), then
// out_proj (row-parallel). The conv's channels split as in_proj_qkv's slots (each rank its heads' q,
// k and v taps); the norm's weight is replicated (its gradient partial over tp). The state starts
// at zero in each sequence: padded rows as transformers masks them, packed sequences each from its
// own start. Under context parallelism (Ulysses) an all-to-all gives each cp rank whole sequences
// of a share of its tp rank's key heads for the conv and the rule, and one brings the output back.
struct delta_net_knobs {
  static constexpr std::string_view knobs_name = "delta_net_knobs";
  delta_net_storage storage = delta_net_storage::grouped;
};

template <delta_net_storage S = delta_net_storage::grouped>
struct gated_delta_net {
  static constexpr delta_net_knobs knobs{S};
  static constexpr std::int64_t key_width(const shape& s) { return delta_net_sizes::of(s).key_heads * delta_net_sizes::of(s).key_dim; }
  static constexpr std::int64_t value_width(const shape& s) { return delta_net_sizes::of(s).value_heads * delta_net_sizes::of(s).value_dim; }
  static constexpr row_dims qkvz(const shape& s) { return {2 * key_width(s) + 2 * value_width(s), s.hidden.get()}; }
  static constexpr row_dims ba(const shape& s) { return {2 * delta_net_sizes::of(s).value_heads, s.hidden.get()}; }
  static constexpr row_dims qkv(const shape& s) { return {2 * key_width(s) + value_width(s), s.hidden.get()}; }
  static constexpr std::array<std::int64_t, 3> qkv_slots(const shape& s) { return {key_width(s), key_width(s), value_width(s)}; }
  static constexpr row_dims z(const shape& s) { return {value_width(s), s.hidden.get()}; }
  static constexpr row_dims gate(const shape& s) { return {delta_net_sizes::of(s).value_heads, s.hidden.get()}; }
  static constexpr row_dims conv(const shape& s) { return {2 * key_width(s) + value_width(s), delta_net_sizes::of(s).conv}; }
  static constexpr row_dims per_value_head(const shape& s) { return {delta_net_sizes::of(s).value_heads, 0}; }
  static constexpr row_dims norm(const shape& s) { return {delta_net_sizes::of(s).value_dim, 0}; }
  static constexpr row_dims out(const shape& s) { return {s.hidden.get(), value_width(s)}; }
  static constexpr void details(const shape& s, basic_text<256>& t) {
    const delta_net_sizes d = delta_net_sizes::of(s);  // (0 while not known)
    t.add("  q/k ", d.key_heads, " heads of ", d.key_dim, ", v ", d.value_heads, " heads of ", d.value_dim, ", conv ", d.conv,
          S == delta_net_storage::grouped ? "  [linear_attn: in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj]"
                                          : "  [linear_attn: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log, norm, out_proj]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module("linear_attn");
    for (const config_setting* c : {&linear_num_key_heads, &linear_num_value_heads, &linear_key_head_dim, &linear_value_head_dim,
                                    &linear_conv_kernel_dim})
      b.setting(*c);
    const auto matrix = [&](std::string_view name, row_geometry_fn g) { b.param(at, {name, g, {name}, 1}); };
    if constexpr (S == delta_net_storage::grouped) {
      matrix("in_proj_qkvz.weight", &geo::column<&qkvz>);
      matrix("in_proj_ba.weight", &geo::column<&ba>);
    } else {
      b.param(at, {"in_proj_qkv.weight", &geo::column_slots<&qkv, &qkv_slots>, {"in_proj_qkv.weight"}, 1, presence::always,
                   true});  // [q | k | v] in one HF tensor
      matrix("in_proj_z.weight", &geo::column<&z>);
      matrix("in_proj_b.weight", &geo::column<&gate>);
      matrix("in_proj_a.weight", &geo::column<&gate>);
    }
    // The conv's channels are in_proj_qkv's three slots: each rank holds its heads' q, k and v taps.
    b.param(at, {"conv1d.weight", &geo::column_slots<&conv, &qkv_slots>, {"conv1d.weight"}, 1, presence::always, true,
                 false, param_init::normal, false, 0, hf_form::conv});
    b.param(at, {"dt_bias", &geo::column<&per_value_head>, {"dt_bias"}, 1, presence::always, false, false,
                 param_init::ones});
    // A = exp(A_log); HF draws A uniformly from [0.01, 16] where no checkpoint gives it: e^2 here.
    b.param(at, {"A_log", &geo::column<&per_value_head>, {"A_log"}, 1, presence::always, false, false,
                 param_init::constant, false, 2.0});
    b.param(at, {"linear_norm.weight", &geo::whole<&norm>, {"norm.weight"}, 1, presence::always, false, true,
                 param_init::ones});
    matrix("out_proj.weight", &geo::row<&out>);
    b.rule(&gated_delta_net_rule);
    const int node = b.node(at, &modules::gated_delta_net, {}, S == delta_net_storage::grouped ? "gated_delta_net" : "gated_delta_net<split>",
                            "gated_delta_net (linear attention)", &details, knobs_of(knobs));
    return b.cp_traffic(b.per_token(b.costs(node, &keeps), &rule_flops), &cp_sent);
  }
  // What it keeps for the backward, per token in bytes over h (16-bit activations), as measured:
  // torch's saved-tensor hooks over a training step of models of DeltaNet layers only, 3 layers
  // less 1, 12 shapes, bf16 (bench/delta_net_activations.py prints the figures beside these).
  //   whole  its input (2).
  //   split  the conv's input and output, the rule's inputs q, k, v and the gated norm's fp32
  //          tensors and out_proj's input: 10.5 per key channel, 26.5 per value channel.
  //   core   the chunked rule's intermediates (chunks of 64; fp32 decay, k k^T, q k^T, the UT
  //          solve's system and solution, each chunk's state and outputs): per value head
  //          1040 + 16 dk + 9.5 dv + 3.5 dk dv / 64, per key head 522.4 + 28 dk. Within 3% of
  //          the measurement on every shape; selective recompute keeps none of it.
  static constexpr activation_terms keeps(const shape& s) {
    const delta_net_sizes d = delta_net_sizes::of(s);
    const double h = static_cast<double>(s.hidden.get()), nk = static_cast<double>(d.key_heads);
    const double nv = static_cast<double>(d.value_heads), dk = static_cast<double>(d.key_dim);
    const double dv = static_cast<double>(d.value_dim);
    return {.whole = 2,
            .split = (10.5 * nk * dk + 26.5 * nv * dv) / h,
            .core = (nv * (1040 + 16 * dk + 9.5 * dv + 3.5 * dk * dv / 64) + nk * (522.4 + 28 * dk)) / h};
  }
  // Under cp: each of the tp rank's key heads' [q | k | v | b | a] there, the output back.
  static constexpr double cp_sent(const shape& s, std::int64_t tp, std::int64_t cp) {
    const delta_net_sizes d = delta_net_sizes::of(s);
    const std::int64_t nk = d.key_heads / tp, nv = d.value_heads / tp;
    return static_cast<double>(2 * nk * d.key_dim + 2 * nv * d.value_dim + 2 * nv) *
           all_to_all_share(cp);
  }
  // The delta rule's own FLOPs per token: Megatron's 6 x 4 nv dv^2 (its formula writes dv^2 for
  // dk dv), verl's 15 dk dv nv; verl counts the projections' and out_proj's weights and the conv's taps.
  static constexpr token_flops rule_flops(const shape& s) {
    const delta_net_sizes d = delta_net_sizes::of(s);
    const std::int64_t nv = d.value_heads, dk = d.key_dim, dv = d.value_dim;
    return {.megatron = 6 * 4 * nv * dv * dv,
            .verl = 15 * dk * dv * nv,
            .verl_weights = s.hidden.get() * (2 * key_width(s) + 3 * value_width(s) + 2 * nv) +
                            d.conv * (2 * key_width(s) + value_width(s))};
  }
};

}  // namespace megadsl::blocks
