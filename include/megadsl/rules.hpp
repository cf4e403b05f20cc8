// The validation rules: one table, one checker, used at compile time and at run time.
//
// A rule is evaluated as soon as every value it reads is known. For a static model and layout that
// is at declaration (the message then appears in the compiler's diagnostic, see model.hpp); for
// dynamic values it is at construction or in `megadsl check`, with the same words.
#pragma once

#include <array>
#include <initializer_list>
#include <utility>
#include <cstdint>
#include <string_view>

#include "megadsl/architecture.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/text.hpp"

namespace megadsl {

// Facts that exist only once a job runs: world size, batch sizes, micro-batch count.
struct run_facts {
  dim world = dynamic;
  dim global_batch = dynamic;
  dim micro_batch = dynamic;
  dim microbatches = dynamic;  // per step and data-parallel rank (interleaved schedule)
};

struct rule_info {
  std::string_view name;
  std::string_view summary;
};

// One row per rule, in checking order; the name is what every message starts with.
inline constexpr std::array<rule_info, 29> rule_table{{
    {"positive_sizes", "every size and degree is positive"},
    {"head_dim_consistent", "hidden is divisible by heads when head_dim is not given"},
    {"heads_divisible_by_kv_heads", "query heads form whole groups over kv heads"},
    {"concatenated_qkv_has_no_bias", "HF's concatenated q/k/v storage (Phi-3) comes without a q/k/v bias"},
    {"interleaved_qkv_needs_kv_heads_equal_heads", "q/k/v interleaved per head (GPT-NeoX) needs kv_heads == heads"},
    {"rotary_dim_even", "the rotated share of each head (head_dim * rotary_fraction) is even and positive"},
    {"moe_routing_valid", "a mixture of experts has experts >= 1, 1 <= top_k <= experts, sparse_step >= 1, a shared expert a width, and a grouped router groups that fit"},
    {"heads_divisible_by_tp", "num_heads % tp == 0"},
    {"kv_heads_fit_tp", "kv_heads is a multiple or a divisor of tp (kv heads replicated when fewer)"},
    {"ffn_divisible_by_tp", "ffn (intermediate_size) % tp == 0"},
    {"full_width_qk_norm_needs_kv_heads_per_rank", "a full-width q/k norm (OLMo2) needs kv_heads >= tp (no kv replication)"},
    {"etp_divides_tp", "the expert tensor-parallel degree etp divides tp (0: etp = tp): expert shards nest in the tp group"},
    {"expert_ffn_divisible_by_etp", "each expert's intermediate size % etp == 0 (and the shared expert's % tp)"},
    {"ep_needs_experts", "expert parallelism (ep > 1) needs a mixture of experts, with experts % ep == 0"},
    {"sp_needs_tp", "sequence parallelism needs tp > 1"},
    {"vpp_needs_pp", "virtual pipeline chunks (vpp > 1) need pp > 1"},
    {"layers_fit_stages", "layers split evenly over pp * vpp chunks (or the explicit first/last counts add up)"},
    {"stage_counts_need_pp", "explicit first/last stage layer counts need pp > 1"},
    {"cp_splits_heads", "context parallelism (Ulysses) gives each cp rank an equal share of a tp rank's query heads, in whole kv groups or within one"},
    {"cp_a2a_fits", "cp_comm a2a+ring (hierarchical) needs 1 < cp_a2a < cp with cp % cp_a2a == 0; cp_a2a is 1 under cp_comm a2a or ring"},
    {"cp_ring_supported", "ring context parallelism (cp_comm ring or a2a+ring) runs the softmax attention blocks (MLA, sinks, windows and chunks included); a block that cannot ring (the gated DeltaNet, Qwen3-Next's gated attention) takes cp_comm a2a"},
    {"vocab_pad_multiple_positive", "vocab_pad_multiple >= 1"},
    {"rope_scaling_valid", "rope scaling parameters are in range"},
    {"world_fits_layout", "world % (tp * pp * cp) == 0"},
    {"global_batch_divisible", "global_batch % (micro_batch * dp) == 0"},
    {"interleaved_microbatches", "microbatches % pp == 0 with the interleaved schedule (vpp > 1)"},
    {"expert_grid_fits_world", "world % (etp * ep * pp) == 0: the expert grid's data-parallel size is whole"},
    {"invariant_cp_a2a", "invariant arithmetic under context parallelism runs Ulysses (cp_comm a2a): the ring's tiles and block order depend on the layout"},
    {"invariant_chunks_fit", "invariant arithmetic: tp (and etp) divide its 8 chunks of a row-parallel input, those inputs "
                             "divide into 8, vocab_pad_multiple is a multiple of its 128-column blocks"},
}};

// The rules as an enum in rule_table's order (a diagnostic prints an enum value by its name, where
// clang prints a text template argument as character codes). `none`: no violation.
enum class rule_id : std::int8_t {
  none,
  positive_sizes,
  head_dim_consistent,
  heads_divisible_by_kv_heads,
  concatenated_qkv_has_no_bias,
  interleaved_qkv_needs_kv_heads_equal_heads,
  rotary_dim_even,
  moe_routing_valid,
  heads_divisible_by_tp,
  kv_heads_fit_tp,
  ffn_divisible_by_tp,
  full_width_qk_norm_needs_kv_heads_per_rank,
  etp_divides_tp,
  expert_ffn_divisible_by_etp,
  ep_needs_experts,
  sp_needs_tp,
  vpp_needs_pp,
  layers_fit_stages,
  stage_counts_need_pp,
  cp_splits_heads,
  cp_a2a_fits,
  cp_ring_supported,
  vocab_pad_multiple_positive,
  rope_scaling_valid,
  world_fits_layout,
  global_batch_divisible,
  interleaved_microbatches,
  expert_grid_fits_world,
  invariant_cp_a2a,
  invariant_chunks_fit,
};
static_assert(static_cast<std::size_t>(rule_id::invariant_chunks_fit) == rule_table.size(),
              "megadsl: rule_id lists rule_table's rules in its order");

constexpr rule_id rule_id_of(std::string_view name) {
  for (std::size_t i = 0; i < rule_table.size(); ++i)
    if (rule_table[i].name == name) return static_cast<rule_id>(i + 1);
  return rule_id::none;
}

struct violation {
  std::string_view rule;
  text message;
  rule_id id = rule_id::none;
  std::array<std::int64_t, 4> values{};  // the values the rule compares, for the named diagnostic
  int value_count = 0;
};

struct violations {
  static constexpr int capacity = 16;
  std::array<violation, capacity> items{};
  int count = 0;

  [[nodiscard]] constexpr bool ok() const { return count == 0; }
  constexpr text& add(std::string_view rule, std::initializer_list<std::int64_t> values = {}) {
    auto& v = items[static_cast<std::size_t>(count < capacity ? count++ : capacity - 1)];
    v.rule = rule;
    v.id = rule_id_of(rule);
    v.value_count = 0;
    for (std::int64_t x : values)
      if (v.value_count < 4) v.values[static_cast<std::size_t>(v.value_count++)] = x;
    v.message.size = 0;  // a fresh slot (data is zero from construction; only size is read)
    v.message.add(rule, ": ");
    return v.message;
  }
  [[nodiscard]] constexpr bool has(std::string_view rule) const {
    for (int i = 0; i < count; ++i)
      if (items[static_cast<std::size_t>(i)].rule == rule) return true;
    return false;
  }
  // All messages joined by " | ": the one line a static_assert or an exception shows.
  [[nodiscard]] constexpr basic_text<1024> joined() const {
    basic_text<1024> out;
    for (int i = 0; i < count; ++i) {
      if (i > 0) out.append(" | ");
      out.append(items[static_cast<std::size_t>(i)].message.view());
    }
    return out;
  }
};

// A block that cannot run under ring context parallelism adds this (its `why`), naming the fix.
constexpr void refuse_cp_ring(const layout& l, std::string_view block, violations& out) {
  if (!l.cp.is_static() || !l.cp_comm.is_static() || !cp_ring(l)) return;
  out.add("cp_ring_supported", {l.cp.get()})
      .add(block, " cannot run under ring context parallelism (cp_comm ", name_of(l.cp_comm.get()),
           ") yet; use cp_comm a2a (Ulysses) for this model");
}

namespace detail {

constexpr bool known(const auto&... v) { return (v.is_static() && ...); }

// "1, 2, 4, 8" for every t in [1, limit] with pred(t), at most 16 values.
template <class Pred>
constexpr void list_values(text& out, std::int64_t limit, Pred pred) {
  int shown = 0;
  for (std::int64_t t = 1; t <= limit; ++t) {
    if (!pred(t)) continue;
    if (shown == 16) {
      out.append(", ...");
      return;
    }
    if (shown++ > 0) out.append(", ");
    out.append(t);
  }
  if (shown == 0) out.append("none");
}

// Layers on each pipeline rank, or 0 when explicit counts cannot be honoured.
struct stage_split {
  std::int64_t first = 0, middle = 0, last = 0;  // per pipeline rank, over all its chunks
  bool ok = false;
};

constexpr stage_split split_layers(std::int64_t layers, std::int64_t pp, std::int64_t first,
                                   std::int64_t last) {
  stage_split s;
  if (pp <= 0 || layers <= 0) return s;
  if (pp == 1) {
    s.first = s.middle = s.last = layers;
    s.ok = (first == 0 || first == layers) && (last == 0 || last == layers);
    return s;
  }
  std::int64_t explicit_layers = first + last;
  std::int64_t others = pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  std::int64_t rest = layers - explicit_layers;
  if (rest < 0) return s;
  std::int64_t each = 0;
  if (others > 0) {
    if (rest % others != 0 || rest == 0) return s;
    each = rest / others;
  } else if (rest != 0) {
    return s;
  }
  s.first = first > 0 ? first : each;
  s.last = last > 0 ? last : each;
  s.middle = pp > 2 ? each : 0;
  s.ok = s.first > 0 && s.last > 0 && (pp <= 2 || s.middle > 0);
  return s;
}

constexpr void check_positive(const shape& s, const layout& l, violations& out) {
  struct item {
    std::string_view name;
    dim value;
  };
  const item items[] = {{"hidden", s.hidden}, {"layers", s.layers},   {"heads", s.heads},
                        {"kv_heads", s.kv_heads}, {"ffn", s.ffn},     {"vocab", s.vocab},
                        {"max_positions", s.max_positions}, {"tp", l.tp}, {"pp", l.pp},
                        {"vpp", l.vpp},          {"cp", l.cp},        {"ep", l.ep}};
  for (const auto& [name, value] : items)
    if (value.is_static() && value.get() <= 0)
      out.add("positive_sizes", {value.get()}).add(name, " = ", value.get(), " must be positive");
  if (s.head_dim.is_static() && s.head_dim.get() < 0)
    out.add("positive_sizes").add("head_dim = ", s.head_dim.get(), " must be positive (or 0 for hidden / heads)");
  if (l.etp.is_static() && l.etp.get() < 0)
    out.add("positive_sizes", {l.etp.get()}).add("etp = ", l.etp.get(), " must be positive (or 0 for etp = tp)");
  if (l.first_stage_layers.is_static() && l.first_stage_layers.get() < 0)
    out.add("positive_sizes").add("first_stage_layers = ", l.first_stage_layers.get(), " must be >= 0 (0: even split)");
  if (l.last_stage_layers.is_static() && l.last_stage_layers.get() < 0)
    out.add("positive_sizes").add("last_stage_layers = ", l.last_stage_layers.get(), " must be >= 0 (0: even split)");
  // The blocks' own keys (config_setting), in the range each block declares (config.json's are
  // checked as they are read; a declared shape's here).
  if (s.arch != nullptr && !s.settings.dynamic)
    for (const config_setting& c : s.arch->settings)
      if (const double v = setting(s, c.key); !c.accepts(v))
        out.add("positive_sizes").add(c.key, " = ", v, v < c.least ? " is below " : " is above ", v < c.least ? c.least : c.most,
                                      v < c.least ? ", the least its block takes" : ", the most its block takes");
}

constexpr bool positive(const auto&... v) { return ((v.is_static() && v.get() > 0) && ...); }

constexpr void check_shape(const shape& s, violations& out) {
  if (s.head_dim.is_static() && s.head_dim.get() == 0 && positive(s.hidden, s.heads) &&
      s.hidden.get() % s.heads.get() != 0) {
    out.add("head_dim_consistent", {s.hidden.get(), s.heads.get()})
        .add("hidden = ", s.hidden.get(), " is not divisible by num_heads = ", s.heads.get(),
             "; give head_dim explicitly or use num_heads in: ");
    list_values(out.items[static_cast<std::size_t>(out.count - 1)].message, s.hidden.get(),
                [&](std::int64_t h) { return s.hidden.get() % h == 0 && h <= 256; });
  }
  if (positive(s.heads, s.kv_heads) && s.heads.get() % s.kv_heads.get() != 0) {
    text& m = out.add("heads_divisible_by_kv_heads", {s.heads.get(), s.kv_heads.get()});
    m.add("num_heads = ", s.heads.get(), " is not divisible by num_key_value_heads = ",
          s.kv_heads.get(), "; valid kv_heads: ");
    list_values(m, s.heads.get(), [&](std::int64_t k) { return s.heads.get() % k == 0; });
  }
  if (const dim hd = effective_head_dim(s); hd.is_static() && hd.get() > 0 && s.rotary_fraction.is_static()) {
    const std::int64_t r = rotary_dim(hd.get(), s.rotary_fraction.get());
    if (s.rotary_fraction.get() <= 0 || s.rotary_fraction.get() > 1 || r < 2 || r % 2 != 0)
      out.add("rotary_dim_even")
          .add("head_dim ", hd.get(), " * rotary_fraction ", s.rotary_fraction.get(), " rotates ", r,
               " dimensions; RoPE rotates pairs: use a fraction in (0, 1] that gives an even count >= 2");
  }
  if (s.arch != nullptr && routes_any(s)) {
    if (s.experts.is_static() && s.experts.get() < 1)
      out.add("moe_routing_valid", {s.experts.get()})
          .add("experts = ", s.experts.get(), ": a mixture of experts needs at least one (num_local_experts / num_experts)");
    else if (known(s.experts, s.top_k) && (s.top_k.get() < 1 || s.top_k.get() > s.experts.get()))
      out.add("moe_routing_valid", {s.top_k.get(), s.experts.get()})
          .add("top_k = ", s.top_k.get(), " experts per token of ", s.experts.get(), "; use 1 <= top_k <= ", s.experts.get());
    if (known(s.shared_expert_ffn) && shared_ffn_required(s) && s.shared_expert_ffn.get() < 1)
      out.add("moe_routing_valid", {s.shared_expert_ffn.get()})
          .add("shared_expert_ffn = ", s.shared_expert_ffn.get(),
               ": the composition has a shared expert; give its width (shared_expert_intermediate_size)");
    if (s.sparse_step.is_static() && s.sparse_step.get() < 1)
      out.add("moe_routing_valid", {s.sparse_step.get()})
          .add("sparse_step = ", s.sparse_step.get(), ": layer i has the experts when (i + 1) % sparse_step == 0; use >= 1");
    if (const dim f = expert_ffn_of(s); f.is_static() && f.get() < 1)
      out.add("moe_routing_valid", {f.get()}).add("each expert's intermediate size is ", f.get(), "; it must be positive");
  }
  const auto& r = s.rope;
  if (r.type.is_static() && r.type.get() != rope_type::none) {
    if (r.factor.is_static() && r.factor.get() < 1.0)
      out.add("rope_scaling_valid").add("rope_scaling.factor = ", r.factor.get(), " must be >= 1");
    if (r.type.get() == rope_type::llama3 &&
        known(r.low_freq_factor, r.high_freq_factor) &&
        !(r.high_freq_factor.get() >= r.low_freq_factor.get() && r.low_freq_factor.get() > 0))
      out.add("rope_scaling_valid")
          .add("llama3 rope scaling needs 0 < low_freq_factor <= high_freq_factor (got ",
               r.low_freq_factor.get(), " and ", r.high_freq_factor.get(), ")");
    if (r.type.get() == rope_type::yarn && known(r.beta_fast, r.beta_slow) &&
        !(r.beta_fast.get() > 0 && r.beta_slow.get() > 0))
      out.add("rope_scaling_valid").add("yarn rope scaling needs beta_fast and beta_slow > 0 (got ", r.beta_fast.get(),
                                        " and ", r.beta_slow.get(), ")");
    if ((r.type.get() == rope_type::llama3 || r.type.get() == rope_type::yarn) && r.original_max_positions.is_static() &&
        r.original_max_positions.get() <= 0)
      out.add("rope_scaling_valid").add("original_max_position_embeddings must be positive");
  }
}

// Stricter than Megatron (which needs only the expert grid to fit the world): an expert's shards
// nest inside the attention's tp group, which the dispatcher's gather over etp relies on.
constexpr void check_expert_tp(const layout& l, violations& out) {
  if (!l.etp.is_static() || l.etp.get() <= 0 || !positive(l.tp) || l.tp.get() % l.etp.get() == 0) return;
  const std::int64_t etp = l.etp.get(), tp = l.tp.get();
  text& m = out.add("etp_divides_tp", {etp, tp});
  m.add("etp = ", etp, " does not divide tp = ", tp, " (an expert's shards are split over at most the attention's); valid etp: ");
  list_values(m, tp, [&](std::int64_t t) { return tp % t == 0; });
}

// A mixture's experts over the ep group (whole experts) and each expert over etp.
constexpr void check_experts(const shape& s, const layout& l, violations& out) {
  const bool moe_known = s.arch != nullptr;
  const bool moe = moe_known && routes_any(s);
  if (positive(l.ep) && l.ep.get() > 1 && moe_known && !moe)
    out.add("ep_needs_experts", {l.ep.get()})
        .add("ep = ", l.ep.get(), " but the model has no experts (no layer routes tokens to experts); use ep = 1, "
             "or a mixture-of-experts family (mixtral, qwen2_moe, qwen3_moe)");
  if (moe && positive(l.ep, s.experts) && s.experts.get() % l.ep.get() != 0) {
    const std::int64_t e = s.experts.get(), ep = l.ep.get();
    text& m = out.add("ep_needs_experts", {e, ep});
    m.add("experts = ", e, " do not split over ep = ", ep, " ranks (each holds whole experts); valid ep: ");
    list_values(m, e, [&](std::int64_t t) { return e % t == 0; });
  }
  if (!moe || !positive(l.tp) || !l.etp.is_static() || l.etp.get() < 0) return;
  const std::int64_t etp = expert_tp(l);
  if (const dim f = expert_ffn_of(s); positive(f) && f.get() % etp != 0) {
    text& m = out.add("expert_ffn_divisible_by_etp", {f.get(), etp});
    m.add("each expert's intermediate size ", f.get(), " is not divisible by etp = ", etp, "; valid etp: ");
    list_values(m, f.get() < 64 ? f.get() : 64, [&](std::int64_t t) { return f.get() % t == 0; });
  }
  if (has_shared_expert(s) && positive(s.shared_expert_ffn) &&
      s.shared_expert_ffn.get() % l.tp.get() != 0) {
    const std::int64_t f = s.shared_expert_ffn.get(), tp = l.tp.get();
    text& m = out.add("expert_ffn_divisible_by_etp", {f, tp});
    m.add("the shared expert's intermediate size ", f, " is not divisible by tp = ", tp, "; valid tp: ");
    list_values(m, f < 64 ? f : 64, [&](std::int64_t t) { return f % t == 0; });
  }
}

constexpr void check_tensor_parallel(const shape& s, const layout& l, violations& out) {
  if (!positive(l.tp)) return;
  const std::int64_t tp = l.tp.get();
  if (positive(s.heads) && s.heads.get() % tp != 0) {
    text& m = out.add("heads_divisible_by_tp", {s.heads.get(), tp});
    m.add("num_heads = ", s.heads.get(), " is not divisible by tp = ", tp, "; valid tp: ");
    list_values(m, s.heads.get(), [&](std::int64_t t) { return s.heads.get() % t == 0; });
  }
  if (positive(s.kv_heads) && s.kv_heads.get() % tp != 0 && tp % s.kv_heads.get() != 0) {
    const std::int64_t kv = s.kv_heads.get();
    text& m = out.add("kv_heads_fit_tp", {kv, tp});
    m.add("num_key_value_heads = ", kv, " is neither a multiple nor a divisor of tp = ", tp,
          "; valid tp: ");
    const std::int64_t limit = positive(s.heads) ? s.heads.get() : kv * 8;
    list_values(m, limit, [&](std::int64_t t) {
      return (kv % t == 0 || t % kv == 0) && (!positive(s.heads) || s.heads.get() % t == 0);
    });
  }
  if (positive(s.ffn) && s.ffn.get() % tp != 0) {
    text& m = out.add("ffn_divisible_by_tp", {s.ffn.get(), tp});
    m.add("ffn = ", s.ffn.get(), " is not divisible by tp = ", tp, "; valid tp: ");
    list_values(m, positive(s.heads) ? s.heads.get() : 64, [&](std::int64_t t) {
      return s.ffn.get() % t == 0 && (!positive(s.heads) || s.heads.get() % t == 0);
    });
  }
  check_expert_tp(l, out);
  check_experts(s, l, out);
  if (l.sp.is_static() && l.sp.get() && tp == 1)
    out.add("sp_needs_tp", {tp}).add("sequence parallelism needs tp > 1 (got tp = 1); set tp >= 2 or sp = false");
}

constexpr void check_pipeline(const shape& s, const layout& l, violations& out) {
  if (!positive(l.pp, l.vpp)) return;
  const std::int64_t pp = l.pp.get(), vpp = l.vpp.get();
  if (vpp > 1 && pp == 1)
    out.add("vpp_needs_pp", {vpp, pp}).add("vpp = ", vpp, " virtual chunks need pp > 1 (got pp = 1); set pp >= 2 or vpp = 1");
  if (!known(l.first_stage_layers, l.last_stage_layers)) return;
  const std::int64_t first = l.first_stage_layers.get(), last = l.last_stage_layers.get();
  if (first < 0 || last < 0) return;
  if (pp == 1 && (first > 0 || last > 0)) {
    out.add("stage_counts_need_pp", {first, last})
        .add("first_stage_layers = ", first, " and last_stage_layers = ", last,
             " need pp > 1 (got pp = 1); set pp >= 2 or leave them at 0");
    return;
  }
  if (!positive(s.layers)) return;
  const std::int64_t layers = s.layers.get();
  const bool even = first == 0 && last == 0;
  const stage_split split = split_layers(layers, pp, first, last);
  const bool chunks_ok = split.ok && split.first % vpp == 0 && split.last % vpp == 0 &&
                         (pp <= 2 || split.middle % vpp == 0);
  if (chunks_ok) return;
  text& m = out.add("layers_fit_stages", {s.layers.is_static() ? s.layers.get() : -1, pp, vpp});
  if (even) {
    m.add("num_layers = ", layers, " is not divisible by pp * vpp = ", pp, " * ", vpp, " = ",
          pp * vpp, "; valid pp", vpp > 1 ? " (with this vpp)" : "", ": ");
    list_values(m, layers, [&](std::int64_t p) { return layers % (p * vpp) == 0 && (vpp == 1 || p > 1); });
    m.add("; or give first_stage_layers / last_stage_layers");
  } else {
    m.add("first_stage_layers = ", first, ", last_stage_layers = ", last, " and num_layers = ",
          layers, " do not split over pp = ", pp, " ranks x vpp = ", vpp,
          " chunks: the remaining layers must divide evenly over the other stages and every stage's count by vpp");
  }
}

// Context parallelism all-to-alls q (and k, v) from a sequence shard of every head to the whole
// sequence of a 1/cp share of the heads (Ulysses; src/layers/attention.cpp): each cp rank takes
// whole kv groups of its tp rank, or an equal part of one group's query heads (its k and v then
// all-gathered over cp, as DeepSpeed-Ulysses does when kv heads are fewer than its degree).
constexpr bool cp_splits_heads(std::int64_t q_heads, std::int64_t groups, std::int64_t cp) {
  return q_heads % cp == 0 && (groups % cp == 0 || cp % groups == 0);
}

constexpr void check_context_parallel(const shape& s, const layout& l, violations& out) {
  if (!l.cp_comm.is_static()) return;
  const bool hierarchical = l.cp_comm.get() == cp_comm_kind::a2a_ring;
  // The all-to-all groups' size: a fact of the layout alone (parallel_groups::build checks it
  // before it cuts the cp group into them).
  if (l.cp.is_static() && l.cp_a2a.is_static()) {
    const std::int64_t cp = l.cp.get(), a2a = l.cp_a2a.get();
    const auto fits = [&](std::int64_t a) { return a > 1 && a < cp && cp % a == 0; };
    if (hierarchical && (cp > 1 || a2a != 1) && !fits(a2a)) {
      text& m = out.add("cp_a2a_fits", {cp, a2a});
      m.add("cp_comm a2a+ring with cp = ", cp, " and cp_a2a = ", a2a,
            ": cp_a2a (the all-to-all groups' size) must lie strictly between 1 and cp and divide it");
      if (cp >= 4) {
        m.add("; valid cp_a2a: ");
        list_values(m, cp - 1, fits);
      }
      m.add("; or cp_comm a2a (all heads) or ring (no all-to-all)");
      return;
    }
    if (!hierarchical && a2a != 1) {
      out.add("cp_a2a_fits", {cp, a2a})
          .add("cp_a2a = ", a2a, " with cp_comm ", name_of(l.cp_comm.get()),
               ": the all-to-all groups' size is for cp_comm a2a+ring only; leave cp_a2a 1 or take cp_comm a2a+ring");
      return;
    }
  } else if (hierarchical) {
    return;  // its groups' size is not known yet
  }
  if (!positive(l.cp, l.tp, s.heads, s.kv_heads) || l.cp.get() == 1 || l.cp_comm.get() == cp_comm_kind::ring) return;
  const std::int64_t cp = l.cp.get(), tp = l.tp.get(), kv = s.kv_heads.get(), n = cp_a2a_size(l);
  if (s.heads.get() % tp != 0 || (kv % tp != 0 && tp % kv != 0)) return;  // the tp rules say it
  const std::int64_t q_heads = s.heads.get() / tp, groups = kv >= tp ? kv / tp : 1;  // per tp rank
  if (cp_splits_heads(q_heads, groups, n)) return;
  const std::string_view by = hierarchical ? "cp_a2a" : "cp";
  text& m = out.add("cp_splits_heads", {q_heads, groups, n});
  m.add("a tp rank's ", q_heads, " query heads in ", groups, " kv group(s) (heads ", s.heads.get(), ", kv heads ", kv,
        ", tp ", tp, ") do not split into ", by, " = ", n, " equal shares of whole groups or of one group; valid ", by, ": ");
  // Under a2a+ring the sizes that also fit cp (cp_a2a_fits).
  list_values(m, q_heads, [&](std::int64_t c) {
    return cp_splits_heads(q_heads, groups, c) && (!hierarchical || (c > 1 && c < cp && cp % c == 0));
  });
  m.add("; or cp_comm ring (k/v around a ring: any head count)");
}

constexpr void check_vocab_padding(const layout& l, violations& out) {
  if (l.vocab_pad_multiple.is_static() && l.vocab_pad_multiple.get() < 1)
    out.add("vocab_pad_multiple_positive")
        .add("vocab_pad_multiple = ", l.vocab_pad_multiple.get(), " must be >= 1 (Megatron's default is 128)");
}

// The expert grid (rank_grid.hpp's expert_grid) over the world: etp * ep * pp ranks per expert
// data-parallel replica.
constexpr void check_expert_grid(const layout& l, const run_facts& f, violations& out) {
  if (!positive(f.world, l.tp, l.pp, l.ep) || !l.etp.is_static() || l.etp.get() < 0) return;
  const std::int64_t etp = l.etp.get() == 0 ? l.tp.get() : l.etp.get();
  const std::int64_t grid = etp * l.ep.get() * l.pp.get(), w = f.world.get();
  if (w % grid == 0) return;
  text& m = out.add("expert_grid_fits_world", {w, grid});
  m.add("world size ", w, " is not divisible by etp * ep * pp = ", etp, " * ", l.ep.get(), " * ", l.pp.get(), " = ", grid,
        "; valid world sizes are multiples of ", grid, ", or with this world size use etp * ep * pp in: ");
  list_values(m, w, [&](std::int64_t t) { return w % t == 0; });
}

// Invariant arithmetic (layers/invariant.hpp) sums a row-parallel linear's input in 8 fixed chunks,
// whole on each tp rank, and the vocabulary in blocks of 128 columns, whole on each tp rank. (An
// attention block checks its o_proj's input in its own rule, as the gated DeltaNet and MLA check
// theirs, sized by their own keys.)
inline constexpr std::int64_t invariant_chunks = 8;
constexpr void check_invariant(const shape& s, const layout& l, violations& out) {
  if (!l.invariant.is_static() || !l.invariant.get()) return;
  if (l.cp.is_static() && l.cp_comm.is_static() && cp_ring(l))
    out.add("invariant_cp_a2a", {l.cp.get()})
        .add("invariant arithmetic with cp_comm ", name_of(l.cp_comm.get()),
             ": the ring's tiles and the order of its blocks depend on the layout, so a sequence's bits would too; "
             "use cp_comm a2a (Ulysses) with invariant, or turn invariant off");
  constexpr std::int64_t chunks = invariant_chunks, block = 128;
  for (const auto& [name, degree] : {std::pair<std::string_view, dim>{"tp", l.tp}, {"etp", l.etp}})
    if (degree.is_static() && degree.get() > 0 && chunks % degree.get() != 0)
      out.add("invariant_chunks_fit", {degree.get()})
          .add("invariant arithmetic splits a row-parallel input into ", chunks, " chunks, whole on each rank; ", name, " = ",
               degree.get(), " does not divide them: use ", name, " 1, 2, 4 or 8");
  const std::pair<std::string_view, std::int64_t> inputs[] = {
      {"intermediate_size", s.ffn.is_static() ? s.ffn.get() : 0},
      {"an expert's intermediate size", known(s.experts) && s.experts.get() > 0 && expert_ffn_of(s).is_static() ? expert_ffn_of(s).get() : 0},
      {"the shared expert's intermediate size", s.shared_expert_ffn.is_static() ? s.shared_expert_ffn.get() : 0}};
  for (const auto& [name, width] : inputs)
    if (width % chunks != 0)
      out.add("invariant_chunks_fit", {width})
          .add("invariant arithmetic splits ", name, " = ", width, " into ", chunks, " equal chunks, and it does not divide; "
               "this model cannot run with invariant");
  if (l.vocab_pad_multiple.is_static() && l.vocab_pad_multiple.get() % block != 0)
    out.add("invariant_chunks_fit", {l.vocab_pad_multiple.get()})
        .add("invariant arithmetic sums the vocabulary in blocks of ", block, " columns, whole on each tp rank; "
             "vocab_pad_multiple = ", l.vocab_pad_multiple.get(), " is not a multiple of ", block);
}

constexpr void check_run(const layout& l, const run_facts& f, violations& out) {
  const std::pair<std::string_view, dim> facts[] = {{"world size", f.world},
                                                    {"global batch", f.global_batch},
                                                    {"micro batch", f.micro_batch},
                                                    {"number of microbatches", f.microbatches}};
  for (const auto& [name, value] : facts)
    if (value.is_static() && value.get() <= 0)
      out.add("positive_sizes", {value.get()}).add(name, " = ", value.get(), " must be positive");
  if (positive(f.world, l.tp, l.pp, l.cp)) {
    const std::int64_t model = l.tp.get() * l.pp.get() * l.cp.get(), w = f.world.get();
    if (w % model != 0) {
      text& m = out.add("world_fits_layout", {w, model});
      m.add("world size ", w, " is not divisible by tp * pp * cp = ", model,
            "; valid world sizes are multiples of ", model, ", or with this world size use tp * pp * cp in: ");
      list_values(m, w, [&](std::int64_t t) { return w % t == 0; });
    }
  }
  if (positive(f.world, l.tp, l.pp, l.cp, f.global_batch, f.micro_batch)) {
    const std::int64_t model = l.tp.get() * l.pp.get() * l.cp.get();
    if (f.world.get() % model == 0) {
      const std::int64_t dp = f.world.get() / model;
      const std::int64_t unit = f.micro_batch.get() * dp;
      if (f.global_batch.get() % unit != 0) {
        text& m = out.add("global_batch_divisible");
        m.add("global batch ", f.global_batch.get(), " is not divisible by micro batch ", f.micro_batch.get(),
              " * dp ", dp, " = ", unit, "; use a global batch of ");
        const std::int64_t below = (f.global_batch.get() / unit) * unit, above = below + unit;
        if (below > 0) m.add(below, " or ");
        m.add(above);
      }
    }
  }
  if (positive(l.pp, l.vpp, f.microbatches) && l.vpp.get() > 1 &&
      f.microbatches.get() % l.pp.get() != 0) {
    const std::int64_t m = f.microbatches.get(), pp = l.pp.get();
    text& msg = out.add("interleaved_microbatches", {m, pp});
    msg.add("number of microbatches ", m, " is not divisible by pp = ", pp, " with the interleaved schedule; use ");
    if (m / pp > 0) msg.add((m / pp) * pp, " or ");
    msg.add((m / pp + 1) * pp, " microbatches");
  }
  // The expert grid only when the decoder grid fits: otherwise world_fits_layout said it already.
  if (!positive(f.world, l.tp, l.pp, l.cp) || f.world.get() % (l.tp.get() * l.pp.get() * l.cp.get()) == 0)
    check_expert_grid(l, f, out);
}

}  // namespace detail

// Every rule whose inputs are known, in table order (the rules a model's blocks add among them,
// at their place in the table; rules a user's block adds last).
constexpr violations check(const shape& s, const layout& l, const run_facts& f = {}) {
  violations out;
  detail::check_positive(s, l, out);
  if (!out.ok()) return out;  // the other rules divide by these values
  detail::check_shape(s, out);
  detail::check_tensor_parallel(s, l, out);
  if (s.arch != nullptr)
    for (block_rule r : s.arch->rules) r(s, l, out);
  detail::check_pipeline(s, l, out);
  detail::check_context_parallel(s, l, out);
  detail::check_vocab_padding(l, out);
  detail::check_run(l, f, out);
  detail::check_invariant(s, l, out);
  // Table order, stably (a rule's several violations keep theirs).
  auto order = [](const violation& v) { return v.id == rule_id::none ? 1000 : static_cast<int>(v.id); };
  for (int i = 1; i < out.count; ++i)
    for (int j = i; j > 0 && order(out.items[static_cast<std::size_t>(j)]) < order(out.items[static_cast<std::size_t>(j - 1)]); --j) {
      const violation t = out.items[static_cast<std::size_t>(j)];
      out.items[static_cast<std::size_t>(j)] = out.items[static_cast<std::size_t>(j - 1)];
      out.items[static_cast<std::size_t>(j - 1)] = t;
    }
  return out;
}

}  // namespace megadsl
