// `megadsl plan` output. All figures come from formulas.hpp; this file only lays them out.
#include "megadsl/require_valid.hpp"
#include "megadsl/plan_report.hpp"

#include <numeric>
#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "megadsl/formulas.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shard_plan.hpp"
#include "megadsl/stages.hpp"

namespace megadsl {
namespace {

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

// 8030261248 -> "8,030,261,248"
std::string grouped(std::int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  const std::size_t n = digits.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// Two decimals, more for small values so at least three significant digits show (tiny models).
std::string readable(double v) {
  const double a = v < 0 ? -v : v;
  const int decimals = a == 0 || a >= 1 ? 2 : a >= 0.1 ? 3 : a >= 0.01 ? 4 : a >= 0.001 ? 5 : 6;
  return fixed(v, decimals);
}

std::string in_gib(double bytes) { return readable(bytes / gib); }

// 4 -> "4", 5.5 -> "5.5", 1.375 -> "1.375"
std::string short_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string on_off(bool b) { return b ? "on" : "off"; }

// Rows of cells, each column as wide as its widest cell. The first column is left-aligned, the
// others right-aligned, except those listed in `left_columns` and single cells written with a
// leading '<' (the marker is dropped). A row with one cell is a note printed as is.
class table {
 public:
  explicit table(std::vector<std::size_t> left_columns = {}) : left_(std::move(left_columns)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void print(std::ostream& os) const {
    std::vector<std::size_t> width;
    for (const auto& r : rows_) {
      if (r.size() < 2) continue;
      if (width.size() < r.size()) width.resize(r.size(), 0);
      for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    }
    for (const auto& r : rows_) {
      os << "  ";
      if (r.size() < 2) {
        os << (r.empty() ? "" : r[0]) << "\n";
        continue;
      }
      std::string line;
      for (std::size_t i = 0; i < r.size(); ++i) {
        const bool marked = !r[i].empty() && r[i][0] == '<';
        const std::string cell = marked ? r[i].substr(1) : r[i];
        const std::string pad(width[i] - r[i].size() + (marked ? 1 : 0), ' ');
        const bool left = i == 0 || marked || std::find(left_.begin(), left_.end(), i) != left_.end();
        line += (i == 0 ? "" : "  ") + (left ? cell + pad : pad + cell);
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      os << line << "\n";
    }
  }

 private:
  std::vector<std::size_t> left_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace

void print_plan(std::ostream& os, std::string_view model_name, const shape& s, const layout& l,
                const plan_options& o) {
  const std::int64_t tp = l.tp, pp = l.pp, vpp = l.vpp, cp = l.cp;
  // Without --world: the smallest world both grids fit (with experts over ep ranks of dp x cp).
  const std::int64_t world = o.world > 0 ? o.world : std::lcm(tp * pp * cp, expert_tp(l) * l.ep.get() * pp);
  run_facts facts{.world = world};
  if (o.microbatches > 0) facts.microbatches = o.microbatches;
  require_valid(s, l, facts);  // throws before anything is printed
  const std::int64_t dp = world / (tp * pp * cp);
  const std::int64_t shards = dp * cp;  // the distributed optimizer's: the gradients' domain
  const head_info head{o.actor, o.value_bias};
  const std::int64_t vpad = padded_vocab(s, l);

  // ---- header and model ----
  os << "megadsl plan: " << model_name << " ("
     << (o.actor ? "actor, lm_head" : o.value_bias ? "critic, value head with bias" : "critic, value head")
     << ")\n";
  os << "  layout    tp " << tp << " x pp " << pp << " (vpp " << vpp << ")"
     << (cp > 1 ? " x cp " + std::to_string(cp) + " (" + std::string(name_of(l.cp_comm.get())) +
                      (cp_a2a_size(l) > 1 && cp_ring(l) ? " " + std::to_string(cp_a2a_size(l)) + " x " + std::to_string(cp_ring_size(l)) : "") + ")"
                : "")
     << ", sp " << on_off(l.sp.get())
     << ", rmpad " << on_off(l.rmpad.get()) << "; world " << world << " -> dp " << dp << "\n";
  os << "  workload  seq " << grouped(o.seq) << ", micro batch " << o.micro_batch << "\n\n";

  os << "Model\n";
  table model({2});
  model.row({"parameters (HF)", grouped(parameter_count(s, head)),
             "embedding " + grouped(s.vocab.get() * s.hidden.get()) +
                 (o.actor && s.tie_embeddings.get() ? ", lm_head tied to it" : "")});
  model.row({"vocab", grouped(s.vocab),
             "padded to " + grouped(vpad) + " (multiple of " +
                 std::to_string(l.vocab_pad_multiple.get()) + " x tp " + std::to_string(tp) +
                 "), " + grouped(vpad / tp) + " rows per tp rank"});
  model.row({"hidden / ffn", grouped(s.hidden) + " / " + grouped(s.ffn), ""});
  model.row({"layers / heads / kv heads",
             std::to_string(s.layers.get()) + " / " + std::to_string(s.heads.get()) + " / " +
                 std::to_string(s.kv_heads.get()),
             "head_dim " + std::to_string(effective_head_dim(s).get()) +
                 (s.kv_heads.get() < tp ? ", kv heads replicated over tp" : "") +
                 (s.qkv_bias.get() ? ", q/k/v bias" : "")});
  // Each rank's own tokens of a micro-batch: its cp share of the sequences.
  const std::int64_t own_tokens = o.seq * o.micro_batch / l.cp.get();
  if (routes_any(s)) {
    const std::int64_t ep = l.ep;
    char bytes[48];
    std::snprintf(bytes, sizeof bytes, "%.2f GB", moe_all_to_all_bytes(s, l, own_tokens, 2) / 1e9);
    model.row({"experts", std::to_string(s.experts.get()) + " x " + grouped(expert_ffn_of(s).get()) + ", top " +
                              std::to_string(s.top_k.get()),
               std::to_string(s.experts.get() / ep) + " per rank of an ep group of " + std::to_string(ep) +
                   (has_shared_expert(s) && s.shared_expert_ffn.get() > 0
                        ? ", shared expert " + grouped(s.shared_expert_ffn.get())
                        : std::string())});
    model.row({"all-to-all per micro-batch", bytes,
               "sent per rank over ep, forward + backward, bf16, uniform routing, its stage's layers (formulas.hpp moe_all_to_all_bytes)"});
  }
  if (o.actor) {
    const std::int64_t vocab_local = padded_vocab(s, l) / l.tp.get();
    const std::int64_t chunk = lm_head_training_chunk(own_tokens, vocab_local, 0);
    char bytes[96];
    std::snprintf(bytes, sizeof bytes, "%.2f GiB (whole: %.2f GiB)", lm_head_peak_bytes(own_tokens, vocab_local) / 1073741824.0,
                  lm_head_peak_bytes(own_tokens, vocab_local, -1) / 1073741824.0);
    model.row({"LM head in training", bytes,
               "extra peak per micro-batch, fp32, its " + grouped(own_tokens) + " tokens x " + grouped(vocab_local) +
                   " vocab per tp rank, " + (chunk > 0 ? "in chunks of " + grouped(chunk) + " tokens" : std::string("whole")) +
                   " (formulas.hpp lm_head_peak_bytes; model_options::head_chunk_tokens)"});
  }
  if (l.cp.get() > 1 && cp_ring(l)) {
    char bytes[48];
    std::snprintf(bytes, sizeof bytes, "%.2f GB", cp_ring_bytes(s, l, own_tokens, 2) / 1e9);
    const std::int64_t a2a = cp_a2a_size(l);
    model.row({"cp ring per micro-batch", bytes,
               "sent per rank around the cp ring (k/v blocks, dk/dv in fp32" +
                   (a2a > 1 ? ", of its all-to-all group's " + grouped(a2a * own_tokens) + " rows, a ring of " +
                                  std::to_string(cp_ring_size(l)) + " ranks"
                            : std::string()) +
                   "), forward + backward, bf16, its " + grouped(own_tokens) +
                   " tokens, its stage's layers (formulas.hpp cp_ring_bytes)"});
  }
  if (cp_a2a_size(l) > 1) {
    char bytes[48];
    std::snprintf(bytes, sizeof bytes, "%.2f GB", cp_all_to_all_bytes(s, l, own_tokens, 2) / 1e9);
    model.row({"cp all-to-all per micro-batch", bytes,
               "sent per rank over " + (cp_ring(l) ? "its all-to-all group of " + std::to_string(cp_a2a_size(l)) + " cp ranks"
                                                   : std::string("cp (Ulysses)")) +
                   ", forward + backward, bf16, its " + grouped(own_tokens) +
                   " tokens, its stage's layers (formulas.hpp cp_all_to_all_bytes)"});
  }
  model.print(os);
  os << "\n";

  // ---- model state per rank ----
  os << "Model state per rank, GiB (all tp ranks of a pipeline rank hold the same; the optimizer replicated over dp,\n"
        "the distributed optimizer (the trainer's default, optimizer_config::distributed) in the last line)\n";
  table state;
  state.row({"", "", "", "<fp32", "", "", "", "<bf16 mixed", "", "", ""});
  state.row({"pp rank", "layers", "parameters", "weights", "grads", "Adam", "total", "weights",
             "grads", "master+Adam", "total"});
  double peak_bf16 = 0;
  for (std::int64_t r = 0; r < pp; ++r) {
    const rank_memory f = training_memory(s, l, head, precision::fp32, r);
    const rank_memory b = training_memory(s, l, head, precision::bf16_mixed, r);
    peak_bf16 = std::max(peak_bf16, b.total_bytes);
    state.row({std::to_string(r), std::to_string(layers_on_pp_rank(s, l, r)), grouped(f.parameters),
               in_gib(f.weight_bytes), in_gib(f.gradient_bytes), in_gib(f.optimizer_bytes),
               in_gib(f.total_bytes), in_gib(b.weight_bytes), in_gib(b.gradient_bytes),
               in_gib(b.optimizer_bytes), in_gib(b.total_bytes)});
  }
  state.row({"fp32: 4 + 4 + 8 = 16 B/param; bf16: 2 + 4 (fp32 main_grad) + 12 (fp32 master, Adam m, v) = 18 B/param"});
  if (shards > 1) {
    double peak_dist = 0, peak_dist_fp32 = 0, peak_fp32 = 0;
    for (std::int64_t r = 0; r < pp; ++r) {
      peak_dist = std::max(peak_dist, training_memory(s, l, head, precision::bf16_mixed, r, shards).total_bytes);
      peak_dist_fp32 = std::max(peak_dist_fp32, training_memory(s, l, head, precision::fp32, r, shards).total_bytes);
      peak_fp32 = std::max(peak_fp32, training_memory(s, l, head, precision::fp32, r).total_bytes);
    }
    state.row({"distributed optimizer over " + (cp > 1 ? "dp x cp " + std::to_string(shards) : "dp " + std::to_string(dp)) +
               ": fp32 (8 + 8/dp B/param) " + in_gib(peak_dist_fp32) +
               " GiB on the most-loaded rank instead of " + in_gib(peak_fp32) + "; bf16 (6 + 12/dp B/param) " +
               in_gib(peak_dist) + " instead of " + in_gib(peak_bf16)});
  }
  state.print(os);
  os << "\n";

  // ---- activations ----
  const bool has_tp = tp > 1;
  const auto act = [&](bool sp, recompute r, bool stage) {
    if (sp && !has_tp) return std::string("-");
    return in_gib(stage ? activation_bytes_first_stage(s, l, o.seq, o.micro_batch, sp, o.microbatches, r)
                        : activation_bytes_per_layer(s, l, o.seq, o.micro_batch, sp, r));
  };
  const double in_flight =
      vpp > 1 ? in_flight_microbatches(l) * interleave_factor(l)
              : in_flight_microbatches(l, o.microbatches);
  const std::string stage = "first stage (" + std::to_string(layers_on_pp_rank(s, l, 0)) +
                            " layers x " + short_number(in_flight) + " micro-batches)";
  os << "Activations per tp" << (cp > 1 ? " and cp" : "") << " rank, GiB (16-bit; micro-batch " << o.micro_batch << " x "
     << grouped(o.seq) << " tokens" << (cp > 1 ? ", 1/" + std::to_string(cp) + " of them per cp rank" : "") << ")\n";
  table acts;
  acts.row({"", "without SP", "with SP"});
  // Every granularity, the layout's own (layout::recompute) marked: what the runtime keeps.
  const recompute chosen = l.recompute.get();
  const auto mark = [&](recompute r) { return r == chosen ? std::string(" <- this layout") : std::string(); };
  for (const recompute r : {recompute::none, recompute::selective, recompute::full})
    acts.row({"per layer, recompute " + std::string(name_of(r)) + mark(r), act(false, r, false), act(true, r, false)});
  for (const recompute r : {recompute::none, recompute::selective, recompute::full})
    acts.row({stage + ", recompute " + std::string(name_of(r)) + mark(r), act(false, r, true), act(true, r, true)});
  if (!has_tp) acts.row({"(SP needs tp > 1)"});
  acts.print(os);
  os << "  (The paper's no-recompute row keeps the s x s attention scores; megadsl's fused attention\n"
        "  keeps none, so without recompute it is near the selective row, and selective recompute\n"
        "  saves the attention core's own outputs: RoPE'd q and k and the heads' output.)\n";
  // What megadsl itself holds at a step's peak: no scores (its attention is fused or the ring's
  // tiles), the layout's recompute, at pp 1 the LM head's extra and the final norm, the ring's tiles.
  const bool sp_now = l.sp.get() && has_tp;
  os << "  megadsl's own peak per rank, this layout (recompute " << name_of(chosen) << (sp_now ? ", SP" : "")
     << (l.pp.get() == 1 ? (o.actor ? ", the LM head's extra" : "") : ", first stage")
     << (cp_ring(l) ? ", the ring's tiles" : "") << "): "
     << in_gib(activation_peak_bytes(s, l, o.seq, o.micro_batch, sp_now, 4, o.microbatches, o.actor)) << " GiB fp32, "
     << in_gib(activation_peak_bytes(s, l, o.seq, o.micro_batch, sp_now, 2, o.microbatches, o.actor))
     << " GiB bf16\n  (formulas.hpp activation_peak_bytes; bench_context_parallel_memory measures it)\n";
  bool recurrent = false;
  for (std::int64_t i = 0; i < s.layers.get() && !recurrent; ++i) recurrent = layer_activation_terms(s, i).core > 0;
  if (recurrent)
    os << "  (A gated DeltaNet layer also keeps its chunked rule's fp32 intermediates, which selective\n"
          "  recompute runs again in the backward instead: the per-layer rows are layer 0's, the stage's\n"
          "  every layer's; bench/delta_net_activations.py measures them.)\n";
  os << "\n";

  // ---- FLOPs ----
  const flops_per_token f = training_flops_per_token(s, l, o.seq);
  os << "Training FLOPs per token, GFLOP (forward + backward, seq " << grouped(o.seq) << ")\n";
  table flops({2});
  flops.row({"Megatron, non-causal (s/h)", readable(f.megatron_non_causal / 1e9),
             "num_floating_point_operations, padded vocab " + grouped(vpad)});
  flops.row({"Megatron, causal (s/2h)", readable(f.megatron_causal / 1e9),
             "current Megatron-LM / Megatron-Bridge"});
  flops.row({"torchtitan, 6N + 12 L n d s", readable(f.torchtitan / 1e9),
             "N without the token embedding, true vocab"});
  flops.row({"verl, 6N + 6 d n L s", readable(f.verl / 1e9),
             "embedding counted as a matmul (verl after PR #4959)"});
  flops.row({"verl before PR #4959, 12 d n L s", readable(f.verl_legacy / 1e9), ""});
  flops.row({"Quote MFU with its convention: causal vs non-causal alone differ by " +
             fixed(100.0 * (f.megatron_non_causal / f.megatron_causal - 1.0), 1) + "% here."});
  flops.print(os);
  os << "\n";

  os << "Sources: parameters: HF modeling_llama / modeling_qwen2 (megadsl::parameter_count).\n"
        "  Per-rank parameters: the shard plan (megadsl::local_elements: padded vocab, replicated kv\n"
        "  heads, a tied lm_head's copy on the last stage). Bytes per parameter: Megatron\n"
        "  theoretical_memory_usage.py. Activations: Korthikanti et al. 2022, Table 2; first stage =\n"
        "  its layers x per layer x micro-batches in flight (1F1B: pp; interleaved: x (1 + (p-1)/(pv))).\n"
        "  FLOPs: Megatron num_floating_point_operations, torchtitan get_num_flop_per_token, verl\n"
        "  _estimate_qwen2_flops, or _estimate_qwen3_5_flops where a layer runs a gated DeltaNet\n"
        "  (megadsl::training_flops_per_token).\n";
}

}  // namespace megadsl
