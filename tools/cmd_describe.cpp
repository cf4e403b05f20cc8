// `megadsl describe MODEL [layout]`: the shard plan of every parameter, the pipeline stages and the
// per-rank fused QKV, all read from plan_params() / chunk_layers() / qkv_layout().
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>

#include "cli.hpp"
#include "megadsl/formulas.hpp"
#include "megadsl/layers/blocks.hpp"
#include "megadsl/architecture.hpp"
#include "megadsl/shard_plan.hpp"
#include "megadsl/stages.hpp"

namespace megadsl::cli {
namespace {

std::string range(std::int64_t first, std::int64_t last) {
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

std::string where_of(const param_plan& p, const shape& s, const layout& l) {
  const std::int64_t pp = l.pp, vpp = l.vpp;
  const bool staged = pp > 1 || vpp > 1;
  switch (p.row->where) {
    case placement::first_stage:
      return staged ? "pp 0, chunk 0 (stage 0)" : "pp 0";
    case placement::last_stage: {
      std::string w = staged ? "pp " + std::to_string(pp - 1) + ", chunk " + std::to_string(vpp - 1) +
                                   " (stage " + std::to_string(pp * vpp - 1) + ")"
                             : "pp 0";
      if (p.tied) w += pp > 1 ? ", a copy of embed.weight" : ", is embed.weight";
      return w;
    }
    case placement::layer: {
      std::string w = "{layer} " + range(0, s.layers.get() - 1) + " on pp " + range(0, pp - 1);
      if (vpp > 1) w += " x " + std::to_string(vpp) + " chunks";
      return w;
    }
    case placement::expert: {
      const std::int64_t ep = l.ep, per = s.experts.get() / ep;
      std::string w = "{layer} " + range(0, s.layers.get() - 1) + " on pp " + range(0, pp - 1) + "; {expert} " +
                      range(0, s.experts.get() - 1);
      w += ep > 1 ? ", " + std::to_string(per) + " per rank of the ep group (ep rank r: " + std::to_string(per) + " r to " +
                        std::to_string(per) + " r + " + std::to_string(per - 1) + ")"
                  : " on every rank";
      return w;
    }
  }
  return "?";
}

std::string hf_names_of(const param_plan& p) {
  if (p.tied) return std::string(p.tied_source) + " (tied)";
  std::string names;
  for (int i = 0; i < p.row->hf_count; ++i) names += (i ? "\n" : "") + std::string(p.row->hf[static_cast<std::size_t>(i)]);
  if (p.row->when == presence::critic || p.row->when == presence::critic_bias) names += " (*)";
  return names;
}

std::string hf_shapes_of(const param_plan& p, const shape& s) {
  std::string shapes;
  if (p.row->form == hf_form::scalar) return "()";  // a 0-dim buffer in HF's file (held as (1))
  // Every expert of the layer in one tensor, each (in, out); a depthwise conv's (channels, 1, taps);
  // a vector stored as one row (1, n).
  if (p.row->stacking != hf_stacking::none || p.row->form != hf_form::as_held) {
    const stored_dims d = hf_stored_shape(p, 0, s);
    std::string text = "(";
    for (int i = 0; i < d.rank; ++i) text += (i ? ", " : "") + std::to_string(d.size[static_cast<std::size_t>(i)]);
    return text + (p.row->stacking == hf_stacking::none ? ")" : ") stacked");
  }
  for (int i = 0; i < p.row->hf_count; ++i) shapes += (i ? "\n" : "") + to_string(p.hf_shapes[static_cast<std::size_t>(i)]);
  return shapes;
}

std::string split_of(const param_plan& p) {
  if (p.split_dim < 0) return "replicated";
  return "dim " + std::to_string(p.split_dim);
}

// "0-7, 16-23": the layers place_of_layer() puts on pipeline rank r.
std::string layers_held(const shape& s, const layout& l, std::int64_t r) {
  std::string out;
  std::int64_t start = -1;
  const std::int64_t layers = s.layers;
  for (std::int64_t i = 0; i <= layers; ++i) {
    const bool here = i < layers && place_of_layer(s, l, i).pp_rank == r;
    if (here && start < 0) start = i;
    if (!here && start >= 0) {
      out += (out.empty() ? "" : ", ") + range(start, i - 1);
      start = -1;
    }
  }
  return out;
}

// The mixture of experts: where each expert lives, what a rank holds and what it sends.
void describe_experts(const shape& s, const layout& l, head_info head, std::ostream& out) {
  const std::int64_t ep = l.ep, experts = s.experts, per = experts / ep, etp = expert_tp(l);
  const std::int64_t f = expert_ffn_of(s).get(), h = s.hidden;
  out << "\nexperts (" << experts << " per layer, top " << s.top_k.get() << (s.norm_topk.get() ? " renormalised" : "")
      << ", each a gated MLP of " << f << (has_shared_expert(s) && s.shared_expert_ffn.get() > 0 ? ", beside a shared expert of " + std::to_string(s.shared_expert_ffn.get()) : std::string())
      << ")\n";
  table t({"ep rank", "experts held", "gate_up per expert", "down per expert", "parameters per rank (pp 0)"});
  for (std::int64_t r = 0; r < ep; ++r) {
    const std::int64_t n = local_elements(s, l, head, 0);
    t.add({std::to_string(r), range(r * per, r * per + per - 1), to_string(mat(2 * f / etp, h)), to_string(mat(h, f / etp)),
           grouped(n) + " (" + short_count(n) + ")"});
  }
  t.print(out);
  out << "  ep groups take ranks of the data-parallel dimension (Megatron's expert grid tp-ep-dp-pp, etp " << etp
      << "); expert gradients are summed over the expert-data-parallel group (dp / ep replicas), the router's over tp\n";
  const std::int64_t tokens = 4096;
  char sent[32];
  std::snprintf(sent, sizeof sent, "%.2f GB", moe_all_to_all_bytes(s, l, tokens, 2) / 1e9);
  out << "  all-to-all per forward + backward over the ep group, uniform routing, " << tokens
      << " tokens per rank, bf16: " << sent << " sent per rank" << (ep == 1 ? " (ep 1: none)" : "")
      << (l.pp.get() > 1 ? " (the sparse layers of its pipeline stage)" : "") << '\n';
}

}  // namespace

int cmd_describe(const options& o, std::ostream& out, std::ostream& err) {
  const model_arg m = load_model(o);
  if (!validate(m, o, err)) return exit_invalid;

  const shape& s = m.s;
  const layout& l = o.l;
  const std::int64_t tp = l.tp, pp = l.pp, vpp = l.vpp, layers = s.layers, h = s.hidden;
  const std::int64_t heads = s.heads, kv = s.kv_heads, ffn = s.ffn, vocab = s.vocab;
  const std::int64_t hd = effective_head_dim(s);
  const std::int64_t vpad = padded_vocab(s, l);
  const param_list plan = plan_params(s, l, o.head);

  // ---- summary ----
  out << m.name << ": "
      << (o.head.actor ? "actor (LM head)"
                       : o.head.value_bias ? "critic (value head h -> 1, with bias)"
                                           : "critic (value head h -> 1, no bias)")
      << "; " << m.origin << '\n';
  out << "layout: " << layout_summary(o) << " (" << tp * pp << " ranks per model replica)\n";
  out << "model: hidden " << h << ", " << layers << " layers, " << heads << " heads x head_dim " << hd
      << ", " << kv << " kv heads, ffn " << ffn << ", vocab " << vocab << ", max positions "
      << s.max_positions.get();
  if (s.rope.type.get() != rope_type::none)
    out << ", rope scaling " << name_of(s.rope.type.get()) << " x" << s.rope.factor.get();
  if (s.qkv_bias.get()) out << ", q/k/v bias";
  out << '\n';
  out << "vocab: " << vocab;
  if (vpad == vocab)
    out << " needs no padding (a multiple of " << l.vocab_pad_multiple.get() << " * tp " << tp << ")\n";
  else
    out << " padded to " << vpad << " (a multiple of " << l.vocab_pad_multiple.get() << " * tp " << tp
        << "); the " << vpad - vocab
        << " padding rows never reach a logit, log-prob or entropy and are dropped on save\n";
  out << "embeddings: ";
  if (!s.tie_embeddings.get()) out << "untied (embed.weight and lm_head.weight are separate tensors)\n";
  else if (!o.head.actor) out << "tied in the checkpoint; the critic has no LM head\n";
  else if (pp > 1)
    out << "tied: lm_head is embed.weight; the last stage keeps a copy whose gradient is all-reduced "
           "with the first stage's\n";
  else out << "tied: lm_head is embed.weight (one tensor)\n";
  out << "activations between blocks: ";
  const std::string tokens = l.rmpad.get() ? "nnz" : "s";
  const std::string batch = l.rmpad.get() ? "1" : "b";
  const std::int64_t cp = l.cp.get(), split = (l.sp.get() ? tp : 1) * cp;
  const std::string shard = split > 1 ? tokens + "/" + std::to_string(split) : tokens;
  out << "(" << shard << ", " << batch << ", " << h << ")";
  if (l.sp.get() && cp > 1) out << " per tp and cp rank (sequence parallel, context parallel)\n";
  else if (l.sp.get()) out << " per tp rank (sequence parallel)\n";
  else if (cp > 1) out << " per cp rank (context parallel), on every tp rank\n";
  else out << " on every tp rank\n";
  const std::int64_t total = parameter_count(s, o.head);  // (formulas.hpp: HF's count, its 0-dim buffers left out)
  out << "parameters: " << grouped(total) << " (" << short_count(total) << ", HF count: true vocab, tied counted once)";
  if (m.published_params > 0 && o.head.actor) out << "; published: " << grouped(m.published_params);
  out << "\n\n";

  // ---- composition ----
  out << "composition (blocks of layers/blocks.hpp; [HF module names])\n"
      << composition_tree(s).view() << '\n';
  // The blocks' own config.json keys (architecture.hpp's config_setting), as this model has them.
  if (!arch_of(s).settings.empty()) {
    out << "config keys the blocks read themselves\n";
    for (const config_setting& c : arch_of(s).settings) {
      std::ostringstream v;
      v << setting(s, c.key);
      std::ostringstream d;
      d << c.fallback;
      out << "  " << c.key << " = " << v.str() << " (default " << d.str() << "): " << c.meaning << '\n';
    }
    out << '\n';
  }

  // ---- parameters ----
  out << "parameters (global: the tp shards side by side; local: one tp rank's shard)\n";
  table params({"megadsl name", "HF name", "kind", "HF shape", "global", "tp split", "local", "pipeline"});
  for (const param_plan& p : plan)
    params.add({std::string(p.row->name), hf_names_of(p), std::string(p.geo.kind_name()), hf_shapes_of(p, s),
                to_string(p.global), split_of(p), to_string(p.local), where_of(p, s, l)});
  params.print(out);
  if (!o.head.actor)
    out << "  (*) the value head loads from score.*, v_head.*, value_head.*, reward_head.* or lm_head.weight "
           "of shape (1, "
        << h << "); when none exists it is initialised, and that is reported\n";
  out << '\n';

  // ---- pipeline stages ----
  out << "pipeline stages (chunk j of pp rank r is stage j*pp + r; layers in stage order)\n";
  // Layers of several kinds (a mixture's dense and sparse ones, ...): each stage's count of each.
  const bool kinds = arch_of(s).kinds.size() > 1;
  table stages(kinds ? std::vector<std::string>{"stage", "pp rank", "chunk", "layers", "count", "layer kinds", "also holds"}
                     : std::vector<std::string>{"stage", "pp rank", "chunk", "layers", "count", "also holds"});
  for (std::int64_t stage = 0; stage < pp * vpp; ++stage) {
    const std::int64_t r = stage % pp, chunk = stage / pp;
    const stage_range c = chunk_layers(s, l, r, chunk);
    std::string extra;
    for (const param_plan& p : plan) {
      const bool here = (p.row->where == placement::first_stage && stage == 0) ||
                        (p.row->where == placement::last_stage && stage == pp * vpp - 1);
      if (here) extra += (extra.empty() ? "" : ", ") + std::string(p.row->name);
    }
    std::vector<std::string> cells{std::to_string(stage), std::to_string(r), std::to_string(chunk),
                                   range(c.first_layer, c.first_layer + c.count - 1), std::to_string(c.count)};
    if (kinds) {
      std::string per_kind;
      for (std::size_t k = 0; k < arch_of(s).kinds.size(); ++k) {
        std::int64_t n = 0;
        for (std::int64_t i = c.first_layer; i < c.first_layer + c.count; ++i) n += kind_of_layer(s, i) == static_cast<int>(k);
        if (n > 0) per_kind += (per_kind.empty() ? "kind " : ", kind ") + std::to_string(k) + " x " + std::to_string(n);
      }
      cells.push_back(per_kind);
    }
    cells.push_back(extra);
    stages.add(cells);
  }
  stages.print(out);
  out << "per pipeline rank (all its chunks, one tp shard)\n";
  table per_rank({"pp rank", "layers held", "count", "parameters per tp rank"});
  for (std::int64_t r = 0; r < pp; ++r) {
    const std::int64_t n = local_elements(s, l, o.head, r);
    per_rank.add({std::to_string(r), layers_held(s, l, r), std::to_string(layers_on_pp_rank(s, l, r)),
                  grouped(n) + " (" + short_count(n) + ")"});
  }
  per_rank.print(out);
  out << '\n';

  // ---- fused QKV per tp rank ----
  const qkv_rank_layout q0 = qkv_layout(s, l, 0);
  out << "fused QKV per tp rank (Megatron-Core order: for each local kv group [q x " << q0.q_per_group
      << " | k | v], " << hd << " rows per head)\n";
  table qkv({"tp rank", "kv groups", "q heads/group", "q heads", "kv heads", "rows"});
  for (std::int64_t r = 0; r < tp; ++r) {
    const qkv_rank_layout q = qkv_layout(s, l, r);
    qkv.add({std::to_string(r), std::to_string(q.groups), std::to_string(q.q_per_group),
             range(q.first_q_head, q.first_q_head + heads / tp - 1),
             range(q.first_kv_head, q.first_kv_head + q.groups - 1), std::to_string(q.rows())});
  }
  qkv.print(out);
  if (kv < tp)
    out << "  kv_heads " << kv << " < tp " << tp << ": each kv head is replicated on tp / kv_heads = " << tp / kv
        << " ranks; a rank holds one kv group and " << heads / tp << " of its query heads\n";
  out << "  gate/up per tp rank r: [gate rows r*" << ffn / tp << " ... +" << ffn / tp << " ; up rows r*"
      << ffn / tp << " ... +" << ffn / tp << "] = " << to_string(mat(2 * ffn / tp, h)) << '\n';
  out << "  o_proj and down are row-parallel: tp rank r holds input columns r*" << heads * hd / tp << " and r*"
      << ffn / tp << " onward; their outputs are " << (l.sp.get() ? "reduce-scattered" : "all-reduced")
      << " over tp\n";
  out << "  embed" << (o.head.actor ? " and lm_head" : "") << ": tp rank r holds vocab rows r*" << vpad / tp
      << " ... +" << vpad / tp;
  if (vpad != vocab) out << "; rows >= " << vocab << " are padding";
  out << '\n';
  if (l.cp.get() > 1 && cp_ring(l) && cp_a2a_size(l) > 1) {
    const std::int64_t cp = l.cp.get(), a2a = cp_a2a_size(l), ring = cp_ring_size(l);
    out << "context parallel, cp " << cp << " (a2a+ring, " << a2a << " x " << ring << "): each cp rank runs chunks r and "
        << 2 * cp - 1 << " - r of every sequence cut in " << 2 * cp << " through every layer; per layer the attention "
        << "all-to-alls within its group of " << a2a << " consecutive cp ranks to the group's rows of 1/" << a2a
        << " of the heads, passes their k/v block around a ring of " << ring << " ranks (" << ring - 1
        << " sends forward, " << ring << " with dk/dv backward) and all-to-alls the output back; the outputs are "
        << "gathered over cp, the gradients summed over dp x cp\n";
  } else if (l.cp.get() > 1 && cp_ring(l)) {
    const std::int64_t cp = l.cp.get();
    out << "context parallel, cp " << cp << " (ring): each cp rank runs chunks r and " << 2 * cp - 1
        << " - r of every sequence cut in " << 2 * cp << " through every layer; per layer the attention passes its "
        << "k/v block around the cp ring (" << cp - 1 << " sends forward, " << cp
        << " with dk/dv backward), every head on every cp rank; the outputs are gathered over cp, the gradients summed "
           "over dp x cp\n";
  } else if (l.cp.get() > 1) {
    const std::int64_t cp = l.cp.get(), groups = q0.groups, per_rank = heads / tp;
    out << "context parallel, cp " << cp << ": each cp rank runs 1/" << cp << " of the token stream through every "
        << "layer; per layer the attention all-to-alls over cp (Ulysses) to the whole stream of ";
    if (groups % cp == 0) out << groups / cp << " kv group(s) of q/k/v per cp rank";
    else out << per_rank / cp << " query head(s) of one kv group per cp rank, that group's k and v all-gathered";
    out << ", and its output back; the outputs are gathered over cp, the gradients summed over dp x cp\n";
  }
  if (routes_any(s)) describe_experts(s, l, o.head, out);
  return exit_ok;
}

}  // namespace megadsl::cli
