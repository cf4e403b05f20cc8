// Parameter counts, training memory per rank, activation memory and FLOPs per token.
//
// constexpr and torch-free: for a static model every figure is a constant
// (`static_assert(parameter_count(llama3_8b::shape) == 8'030'261'248)`), and `megadsl plan` calls
// the same functions on a shape resolved at run time. Sources (reference/):
//   parameter counts    HF modeling_llama / modeling_qwen2 (true vocab, lm_head unless tied)
//   memory per rank     Megatron theoretical_memory_usage.py: 18 bytes per parameter (bf16 + fp32
//                       master weights + Adam), on the most-loaded shard (padded vocab, kv replicas)
//   activations         Korthikanti et al. 2022, Table 2 (megatron-core-semantics.md §9)
//   FLOPs per token     Megatron num_floating_point_operations; torchtitan get_num_flop_per_token;
//                       verl _estimate_qwen2_flops (anchors-and-user-pain.md §3, verl-semantics.md §6)
// Every function expects a shape and layout that pass `check()`; the values they read must be static
// (or resolved) by then.
#pragma once

#include <cstdint>

#include "megadsl/layout.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/shard_plan.hpp"
#include "megadsl/stages.hpp"

namespace megadsl {

// ---- parameter counts ----------------------------------------------------------------------------

// A parameter's elements as HF stores it (true vocab; a fused row counts each of its sources).
constexpr std::int64_t hf_elements(const param_plan& p) {
  std::int64_t n = 0;
  for (const dims& d : p.hf_shapes) n += d.numel();
  return n;
}

// One decoder layer as HF stores it: the architecture's per-layer rows (architecture.hpp), so q/k/v
// and o with their biases and q/k norms, the MLP in its form (every expert of a mixture), and two
// or four norms with their biases are each counted by the block that declares them. In a mixture
// whose layers differ, layer `layer`'s.
constexpr std::int64_t layer_parameter_count(const shape& s, std::int64_t layer = 0) {
  std::int64_t n = 0;
  for (const param_row& row : arch_of(s).rows) {
    if (!present(row, s, head_info{}) || !in_layer(row, s, layer) || row.form == hf_form::scalar) continue;  // (HF's buffers)
    if (row.where == placement::layer) n += hf_elements(plan_of(row, s, layout{}));
    if (row.where == placement::expert) n += hf_elements(plan_of(row, s, layout{})) * s.experts.get();
  }
  return n;
}

// The HF parameter count, summed over the composition's rows: embedding (true vocab), layers,
// final norm, and the head: lm_head unless tied for the actor, the value head `h -> 1` (+ bias)
// for the critic. HF's 0-dim buffers (hf_form::scalar: xIELU's beta, eps) are not among its
// parameters and not counted.
constexpr std::int64_t parameter_count(const shape& s, head_info head = {}) {
  std::int64_t n = 0;
  for_each_param(s, layout{}, head, [&](const param_plan& p) {
    if (!p.tied && p.row->form != hf_form::scalar) n += hf_elements(p) * existing_instances(*p.row, s);  // tied: counted once
  });
  return n;
}

// ---- training memory per rank ----------------------------------------------------------------------

// fp32: fp32 weights, fp32 gradients, Adam m and v in fp32 (4 + 4 + 8 = 16 bytes per parameter).
// bf16_mixed: Megatron's bf16 recipe: bf16 weights (2), gradients accumulated and all-reduced in an
// fp32 `main_grad` buffer (4; Megatron forces accumulate_allreduce_grads_in_fp32 with bf16), fp32
// master weights + Adam m and v (12): the reference's 18 bytes per parameter.
enum class precision : std::int8_t { fp32, bf16_mixed };

struct bytes_per_parameter {
  double weight, gradient, optimizer;
  [[nodiscard]] constexpr double total() const { return weight + gradient + optimizer; }
};

constexpr bytes_per_parameter bytes_of(precision p) {
  return p == precision::fp32 ? bytes_per_parameter{4, 4, 8} : bytes_per_parameter{2, 4, 12};
}

struct rank_memory {
  std::int64_t parameters;  // elements held by one (tp, pp) rank
  double weight_bytes, gradient_bytes, optimizer_bytes, total_bytes;
};

// Memory of the model state on one (tp rank, pp rank). Parameters come from the shard plan
// (`local_elements`): padded vocab, kv heads replicated when kv_heads < tp, replicated norms, and
// on pp > 1 a tied lm_head's copy on the last stage. All tp ranks of a pipeline rank hold the same
// amount. `optimizer_shards` = dp with Megatron's distributed optimizer (optimizer state divided
// over dp: 6 + 12/dp bytes per parameter in bf16_mixed); 1 (default) without it.
constexpr rank_memory training_memory(const shape& s, const layout& l, head_info head,
                                      precision p, std::int64_t pp_rank,
                                      std::int64_t optimizer_shards = 1) {
  const std::int64_t n = local_elements(s, l, head, pp_rank);
  const bytes_per_parameter b = bytes_of(p);
  const auto count = static_cast<double>(n);
  rank_memory m{n, count * b.weight, count * b.gradient,
                count * b.optimizer / static_cast<double>(optimizer_shards), 0};
  m.total_bytes = m.weight_bytes + m.gradient_bytes + m.optimizer_bytes;
  return m;
}

// ---- activation memory (Korthikanti et al. 2022) ---------------------------------------------------

// What the backward pass keeps: everything, attention core recomputed (selective), or each
// layer's input only (full): recompute_kind (layout.hpp).
using recompute = recompute_kind;

// Bytes of activations layer `layer` keeps for the backward pass of one micro-batch, per tp and
// cp rank, from Table 2 of the paper (16-bit activations, 1-byte dropout masks; s = seq,
// b = micro_batch, h = hidden, a = heads, t = tp), summed from its blocks' terms (W whole, S split,
// C scores: architecture.hpp's activation_terms):
//   no recompute       TP: sbh(W + (S + R)/t + C as/(ht))  TP+SP: sbh(W + S + R + C as/h) / t
//   selective          TP: sbh(W + S/t)                    TP+SP: (W + S) sbh / t
// (R: a recurrent rule's intermediates, activation_terms::core: the gated DeltaNet's.)
//   full               2sbh (the layer input; / t with SP, where the input is a sequence shard)
// A pre-norm layer (W 10, S 24, C 5) gives the paper's sbh(10 + 24/t + 5as/(ht)) and
// sbh(34 + 5as/h) / t; Gemma2's four norms add 4 sbh. The paper's layer is GPT's (MLP 4h, with
// dropout); for a Llama layer (SwiGLU, ffn != 4h, no dropout) it is the customary estimate, not an
// exact count.
namespace detail {
// activation_bytes_per_layer's count, with the attention scores' term or without it (a fused
// attention core keeps none: megadsl's own count, activation_peak_bytes).
constexpr double layer_activation_bytes(const shape& s, const layout& l, std::int64_t seq, std::int64_t micro_batch,
                                        bool sequence_parallel, recompute r, std::int64_t layer, bool with_scores) {
  // Context parallelism: each cp rank keeps 1/cp of the tokens, and its attention core the whole
  // sequence of 1/cp of the heads (Ulysses), so every term divides by cp.
  const double sbh = static_cast<double>(seq) * static_cast<double>(micro_batch) *
                     static_cast<double>(s.hidden.get()) / static_cast<double>(l.cp.get());
  const double t = static_cast<double>(l.tp.get());
  const double as_over_h = with_scores ? static_cast<double>(s.heads.get()) * static_cast<double>(seq) /
                                             static_cast<double>(s.hidden.get())
                                       : 0.0;
  const activation_terms k = layer_activation_terms(s, layer);
  switch (r) {
    case recompute::full: return sequence_parallel ? 2 * sbh / t : 2 * sbh;
    case recompute::selective: return sequence_parallel ? (k.whole + k.split) * sbh / t : sbh * (k.whole + k.split / t);
    case recompute::none: break;
  }
  return sequence_parallel ? sbh * (k.whole + k.split + k.core + k.scores * as_over_h) / t
                           : sbh * (k.whole + k.split / t + k.core / t + k.scores * as_over_h / t);
}
}  // namespace detail

constexpr double activation_bytes_per_layer(const shape& s, const layout& l, std::int64_t seq,
                                            std::int64_t micro_batch, bool sequence_parallel,
                                            recompute r = recompute::none, std::int64_t layer = 0) {
  return detail::layer_activation_bytes(s, l, seq, micro_batch, sequence_parallel, r, layer, true);
}

// Megatron's interleaved-schedule memory factor 1 + (p - 1) / (p v); 1 without interleaving.
constexpr double interleave_factor(const layout& l) {
  const double p = static_cast<double>(l.pp.get()), v = static_cast<double>(l.vpp.get());
  return l.vpp.get() > 1 ? 1 + (p - 1) / (p * v) : 1.0;
}

// Micro-batches whose activations the first pipeline stage holds at its peak: pp under 1F1B (its
// warm-up runs pp forward passes before the first backward), fewer when there are fewer
// micro-batches (`microbatches` = 0: assume at least pp).
constexpr double in_flight_microbatches(const layout& l, std::int64_t microbatches = 0) {
  const std::int64_t p = l.pp.get();
  return static_cast<double>(microbatches > 0 && microbatches < p ? microbatches : p);
}

// Activation bytes on the first pipeline stage (the most loaded one), per tp rank:
//   the layers on pp rank 0 (over all its chunks), each its kind's bytes, x in-flight micro-batches
//   x interleave factor (vpp > 1; `microbatches` is then ignored: the interleaved schedule needs a
//   multiple of pp, so at least pp are in flight).
// With an even split and pp micro-batches in flight this is about L x per-layer, the paper's
// "first stage holds L/p layers x p micro-batches". Not included (each a few sbh): embedding
// dropout, final norm, logits and cross-entropy on the last stage.
namespace detail {
// The layers of pp rank 0 (over all its chunks), each its kind's bytes (with the scores' term or
// without it), x the micro-batches in flight.
constexpr double first_stage_layer_bytes(const shape& s, const layout& l, std::int64_t seq, std::int64_t micro_batch,
                                         bool sequence_parallel, std::int64_t microbatches, recompute r, bool with_scores) {
  const double in_flight = l.vpp.get() > 1 ? in_flight_microbatches(l) * interleave_factor(l)
                                           : in_flight_microbatches(l, microbatches);
  double layers = 0;
  for (std::int64_t i = 0; i < s.layers.get(); ++i)
    if (place_of_layer(s, l, i).pp_rank == 0)
      layers += layer_activation_bytes(s, l, seq, micro_batch, sequence_parallel, r, i, with_scores);
  return layers * in_flight;
}
}  // namespace detail

constexpr double activation_bytes_first_stage(const shape& s, const layout& l, std::int64_t seq,
                                              std::int64_t micro_batch, bool sequence_parallel,
                                              std::int64_t microbatches = 0,
                                              recompute r = recompute::none) {
  return detail::first_stage_layer_bytes(s, l, seq, micro_batch, sequence_parallel, microbatches, r, true);
}

// ---- FLOPs -----------------------------------------------------------------------------------------

// Training (forward + backward) FLOPs per token of one sequence of length `seq`, under each
// published convention. All are exact integers held in doubles.
//   megatron_non_causal  Megatron-LM num_floating_point_operations (2024):
//                        12 s L h^2 [(1 + g/n + s/h)(n d / h) + (ffn/h)(3/2) + V'/(2 L h)] per s
//                        tokens, V' the padded vocab (so it depends on tp through the padding);
//                        its dense part is derived from the composition's matrices (a plain
//                        MLP's ffn factor is 1, not 3/2: Megatron's non-gated case)
//   megatron_causal      the same with s/(2h): current Megatron-LM / Megatron-Bridge
//   torchtitan           6 N + 12 L n d s, N = parameters without the token embedding (true vocab;
//                        with tied embeddings that also drops the lm_head, as torchtitan's
//                        deduplicated parameter count does; a mixture's active experts only)
//   verl                 6 N_verl + 6 d n L s, N_verl = L(h(2nd + 2gd) + 3 h ffn) + 2 V h (embedding
//                        counted as a matmul, tied or not); verl after PR #4959
//   verl_legacy          6 N_verl + 12 d n L s: verl before PR #4959 (what the anchors table's
//                        54.62 / 61.06 GF/token for Llama-3-8B use)
// A layer whose mixer runs a recurrent rule (the gated DeltaNet) adds that rule's per-token FLOPs
// as Megatron's formula and verl's estimator count them (module_node::per_token), and its score
// term is only the attention layers'; torchtitan's form has no such term.
struct flops_per_token {
  double megatron_non_causal, megatron_causal, torchtitan, verl, verl_legacy;
};

namespace detail {
// The weights that multiply every token's activations: the composition's matrices but the
// embedding lookup, the router and the shared expert's gate (left out by Megatron's formula), and
// the value head; no vector (biases, norms) and no norm's weight per head (Command R+'s (heads, d)).
constexpr bool multiplies_tokens(const param_plan& p) {
  const param_row& r = *p.row;
  return p.global.rank == 2 && p.geo.token_matrix && r.where != placement::first_stage && r.when != presence::critic;
}
// Megatron's per-token FLOPs without the attention-score term: 6 (forward 2, backward 4) per
// element of those weights, so a gated MLP adds 18 h ffn per layer and a plain one 12 h ffn, and
// the LM head counts the padded vocab (Megatron's V'). A mixture of experts counts the top_k
// experts each token goes to and the shared expert, as Megatron's MoE formula does (the router's
// h x experts and the shared gate's h are left out there too).
// The layers' per-token mixing costs (module_node::per_token: a recurrent rule's), summed.
constexpr token_flops mixing_per_token(const shape& s) {
  token_flops t;
  for (std::int64_t i = 0; i < s.layers.get(); ++i) {
    const token_flops f = layer_token_flops(s, i).first;
    t.megatron += f.megatron;
    t.verl += f.verl;
  }
  return t;
}
constexpr std::int64_t megatron_dense_per_token(const shape& s, const layout& l) {
  std::int64_t layers = 0, head = 0;
  for_each_param(s, l, head_info{}, [&](const param_plan& p) {
    if (!multiplies_tokens(p)) return;
    if (is_lm_head_row(*p.row)) head = p.global.numel();  // (V', h), tied or not
    else if (p.row->where == placement::expert)  // top_k experts of each sparse layer
      layers += hf_elements(p) * s.top_k.get() * (existing_instances(*p.row, s) / s.experts.get());
    else layers += hf_elements(p) * existing_instances(*p.row, s);
  });
  return 6 * (layers + head) + mixing_per_token(s).megatron;
}
// verl's own count (_estimate_qwen2_flops), gated MLP included whatever the composition: it is
// verl's convention, reproduced as verl reports it. For a mixture of experts, verl's MoE estimates'
// form: the router, top_k gated experts and the shared expert in place of the dense MLP. A layer
// whose mixer declares the weights verl counts for it (token_flops::verl_weights: Qwen3.5's gated
// attention and gated DeltaNet, _estimate_qwen3_5_flops) counts those in place of h (2 n d + 2 g d).
constexpr std::int64_t verl_dense_parameters(const shape& s) {
  const std::int64_t L = s.layers, h = s.hidden, n = s.heads, g = s.kv_heads,
                     d = effective_head_dim(s);
  const std::int64_t sparse_mlp = routes_any(s)
                                      ? h * s.experts.get() + 3 * h * (expert_ffn_of(s).get() * s.top_k.get() +
                                                                       (has_shared_expert(s) ? s.shared_expert_ffn.get() : 0)) +
                                            (has_geometry(s, &geo::one_row) ? h : 0)  // the shared expert's gate
                                      : 0;
  std::int64_t mlp = 0;
  std::int64_t mixers = 0;
  for (std::int64_t i = 0; i < L; ++i) {
    mlp += layer_routes(s, i) ? sparse_mlp : 3 * h * s.ffn.get();
    const auto [f, declared] = layer_token_flops(s, i);
    mixers += declared ? f.verl_weights : h * (n * d + 2 * g * d + n * d);
  }
  return mixers + mlp + 2 * s.vocab.get() * h;
}
}  // namespace detail

constexpr flops_per_token training_flops_per_token(const shape& s, const layout& l,
                                                   std::int64_t seq) {
  const std::int64_t dense = detail::megatron_dense_per_token(s, l);
  const std::int64_t unit = score_units(s);  // L n d, summed over the layers' blocks (architecture.hpp)
  // torchtitan counts a mixture's active parameters: the experts a token does not reach are left out.
  std::int64_t idle_experts = 0;
  for_each_param(s, l, head_info{}, [&](const param_plan& p) {
    if (p.row->where == placement::expert)
      idle_experts += hf_elements(p) * (s.experts.get() - s.top_k.get()) * (existing_instances(*p.row, s) / s.experts.get());
  });
  const std::int64_t non_embedding = parameter_count(s) - s.vocab.get() * s.hidden.get() - idle_experts;
  const std::int64_t verl_dense = 6 * detail::verl_dense_parameters(s) + detail::mixing_per_token(s).verl;
  // The sequence term in doubles: seq * L n d overflows 64 bits past seq ~ 1e13 (exact below 2^53).
  const double score = static_cast<double>(seq) * static_cast<double>(unit);
  return {
      .megatron_non_causal = static_cast<double>(dense) + 12 * score,
      .megatron_causal = static_cast<double>(dense) + 6 * score,
      .torchtitan = static_cast<double>(6 * non_embedding) + 12 * score,
      .verl = static_cast<double>(verl_dense) + 6 * score,
      .verl_legacy = static_cast<double>(verl_dense) + 12 * score,
  };
}

// verl's FLOPs for a batch of sequences (remove-padding: each sequence's own length), forward +
// backward: 6 N_verl sum(s_i) + c d n L sum(s_i^2), c = 6 (current verl) or 12 (before #4959).
// verl reports this / dt / 1e12 as TFLOP/s.
template <class Seqlens>  // any range of std::int64_t
constexpr double verl_flops(const shape& s, const Seqlens& seqlens,
                            int attention_coefficient = 6) {
  double tokens = 0, squares = 0;
  for (const std::int64_t n : seqlens) {
    tokens += static_cast<double>(n);
    squares += static_cast<double>(n) * static_cast<double>(n);
  }
  return static_cast<double>(6 * detail::verl_dense_parameters(s) + detail::mixing_per_token(s).verl) * tokens +
         attention_coefficient * squares * static_cast<double>(score_units(s));
}

// Megatron's FLOPs for a packed batch (THD: attention over each sequence only), forward + backward:
// T x dense per token + sum(s_i^2) x (6 causal | 12 non-causal) x L n d. For one sequence of
// length s this is s x training_flops_per_token(...).megatron_(non_)causal.
template <class Seqlens>  // any range of std::int64_t
constexpr double megatron_flops(const shape& s, const layout& l, const Seqlens& seqlens, bool causal) {
  double tokens = 0, squares = 0;
  for (const std::int64_t n : seqlens) {
    tokens += static_cast<double>(n);
    squares += static_cast<double>(n) * static_cast<double>(n);
  }
  return static_cast<double>(detail::megatron_dense_per_token(s, l)) * tokens +
         (causal ? 6.0 : 12.0) * squares * static_cast<double>(score_units(s));
}

// ---- the LM head in training (layers/vocab_parallel.hpp) ------------------------------------------

// A training step computes the head's (tokens x V'/tp) logits whole up to this many a micro-batch
// (1 GiB in fp32), in chunks of about lm_head_chunk_elements beyond it (forward and backward, the
// GEMM again in the backward); inference always goes a chunk at a time. Both are counts of fp32
// logits, whose head holds lm_head_fp32_logit_bytes a logit (the logits, their softmax, their
// gradient); 16-bit logits through the fused CUDA kernels hold lm_head_fused_logit_bytes (the
// logits and their gradient), and the same bytes then hold 3x the logits.
inline constexpr std::int64_t lm_head_whole_max_elements = std::int64_t{1} << 28;
inline constexpr std::int64_t lm_head_chunk_elements = std::int64_t{1} << 25;  // 128 MB in fp32
inline constexpr std::int64_t lm_head_fp32_logit_bytes = 12;
inline constexpr std::int64_t lm_head_fused_logit_bytes = 4;

// The tokens of the chunk a training step's head takes for `tokens` per rank over `vocab_local`
// (V'/tp) columns, asked `asked` (model_options::head_chunk_tokens: > 0 that chunk, -1 whole, 0
// the rule above), its logits holding `logit_bytes` each; 0: whole.
constexpr std::int64_t lm_head_training_chunk(std::int64_t tokens, std::int64_t vocab_local, std::int64_t asked,
                                              std::int64_t logit_bytes = lm_head_fp32_logit_bytes) {
  if (asked > 0) return asked;
  const std::int64_t whole_max = lm_head_whole_max_elements * lm_head_fp32_logit_bytes / logit_bytes;
  const std::int64_t chunk = lm_head_chunk_elements * lm_head_fp32_logit_bytes / logit_bytes;
  if (asked < 0 || tokens * vocab_local <= whole_max) return 0;
  return vocab_local >= chunk ? 1 : chunk / vocab_local;
}

// The head's extra peak bytes in one forward + backward of a micro-batch of `tokens` per rank over
// `vocab_local` (V'/tp) columns: three fp32 (rows, V'/tp) buffers (the logits, their softmax,
// their gradient) of the whole micro-batch or of one chunk (bench_lm_head_memory measures it).
constexpr double lm_head_peak_bytes(std::int64_t tokens, std::int64_t vocab_local, std::int64_t asked = 0) {
  const std::int64_t chunk = lm_head_training_chunk(tokens, vocab_local, asked);
  const std::int64_t rows = chunk > 0 && chunk < tokens ? chunk : tokens;
  return static_cast<double>(lm_head_fp32_logit_bytes) * static_cast<double>(rows) * static_cast<double>(vocab_local);
}

// ---- what a megadsl step holds at its peak ------------------------------------------------------

// The ring core (layers/ring_attention.hpp) scores a tile of queries against a k/v block at a time:
// about this many fp32 scores (32 MiB), never a block's whole (Tq, Tk).
inline constexpr std::int64_t ring_tile_scores = std::int64_t{1} << 23;

// The query rows of a tile against a block of `tk` keys over `heads` query heads: about
// ring_tile_scores scores, at least 16 rows (fewer matmuls of more rows), at most the `tq` queries.
constexpr std::int64_t ring_tile_rows(std::int64_t heads, std::int64_t tq, std::int64_t tk) {
  const std::int64_t fit = ring_tile_scores / (heads * tk > 0 ? heads * tk : 1);
  const std::int64_t top = tq > 1 ? tq : 1;
  return fit < 16 ? (16 < top ? 16 : top) : (fit < top ? fit : top);
}

// The activation bytes one rank of an actor holds at the peak of a training step (forward +
// backward) on the first pipeline stage, computed at `element` bytes (4 fp32, 2 bf16), the
// layout's own recompute, `seq` x `micro_batch` tokens split over cp: what
// bench_context_parallel_memory measures above the parameters and gradients. Megadsl's count,
// where activation_bytes_first_stage is the paper's:
//   the layers' terms (activation_terms) at `element` / 2 of their 16-bit bytes, without the
//     scores: the attention core is fused (flash, or the ring's tiles) and keeps only its
//     log-sum-exp; but a soft-capped attention (Gemma2) runs the explicit core off the ring, which
//     keeps its fp32 tanh and probabilities, 8 bytes a score of its heads (1/cp of them under
//     Ulysses) over the whole sequence (not modelled: attention dropout, which does the same);
//   at pp 1 the last stage's too: the final norm's input and output (2 values per token);
//   the larger of two transients, which come at different moments of the step: at pp 1 the LM
//     head's extra peak (lm_head_peak_bytes, fp32 whatever `element`: the backward's start, every
//     layer's activations held), and under the ring the backward's live tile buffers, the
//     probabilities and dS, two fp32 (heads, ring_tile_rows, Tk) buffers (under a2a+ring Tk is one
//     rank's share of a block: the ring scores a block's shares one at a time), three with a soft-cap
//     (a layer's attention backward, the later layers' activations freed; measured at 4k tokens
//     a rank the ring then peaks where the head alone would).
// A critic's value head adds nothing measurable (one value per token).
constexpr double activation_peak_bytes(const shape& s, const layout& l, std::int64_t seq, std::int64_t micro_batch,
                                       bool sequence_parallel, double element, std::int64_t microbatches = 0,
                                       bool actor = true) {
  const recompute r = l.recompute.get();
  const double kept = detail::first_stage_layer_bytes(s, l, seq, micro_batch, sequence_parallel, microbatches, r, false);
  double bytes = kept * element / 2;
  // The explicit core's fp32 tanh and probabilities: 8 bytes a score where the paper counts 5.
  if (s.attn_softcap.get() != 0 && !cp_ring(l))
    bytes += 8.0 / 5.0 *
             (detail::first_stage_layer_bytes(s, l, seq, micro_batch, sequence_parallel, microbatches, r, true) - kept);
  const std::int64_t tokens = seq * micro_batch / l.cp.get();  // this rank's own
  double head = 0, tiles = 0;
  if (l.pp.get() == 1) {
    bytes += 2.0 * element * static_cast<double>(tokens) * static_cast<double>(s.hidden.get()) /
             (sequence_parallel ? static_cast<double>(l.tp.get()) : 1.0);
    if (actor) head = lm_head_peak_bytes(tokens, padded_vocab(s, l) / l.tp.get());
  }
  if (cp_ring(l)) {  // a2a+ring: the group's rows of 1/cp_a2a of the heads, against one share of a block at a time
    const std::int64_t a2a = cp_a2a_size(l), heads = s.heads.get() / l.tp.get() / a2a, rows = tokens * a2a;
    const double buffers = s.attn_softcap.get() != 0 ? 3.0 : 2.0;
    tiles = buffers * 4.0 * static_cast<double>(heads) * static_cast<double>(ring_tile_rows(heads, rows, tokens)) *
            static_cast<double>(tokens);
  }
  return bytes + (head > tiles ? head : tiles);
}

// ---- communication -------------------------------------------------------------------------------

// Bytes one rank sends on the wire under ring algorithms (NCCL's and Gloo's): an all-reduce of B
// bytes sends 2 (n-1)/n B, a reduce-scatter of a B-byte input (n-1)/n B, an all-gather of a B-byte
// shard (n-1) B. This is what `comm_stats::bytes` counts for the collectives megadsl issues.
constexpr double ring_all_reduce_bytes(double b, double n) { return n > 1 ? 2 * (n - 1) / n * b : 0; }
constexpr double ring_reduce_scatter_bytes(double b_in, double n) { return n > 1 ? (n - 1) / n * b_in : 0; }
constexpr double ring_all_gather_bytes(double b_shard, double n) { return n > 1 ? (n - 1) * b_shard : 0; }

// Bytes one rank of the actor sends in one forward + backward (with finalize_grads) under `l`
// (pp = 1): `stream` rows enter the layers (b s padded, nnz packed, rounded up to tp under SP),
// `tokens` of them reach the head; `element` is the activations' size in bytes (4 fp32, 2 bf16);
// gradients are fp32. `dp` replicas sum every gradient. Without SP every tp collective is an
// all-reduce of the full (stream, h) activation; with SP each becomes an all-gather plus a
// reduce-scatter of the same total (Korthikanti et al. 2022): the two figures are equal.
constexpr double actor_step_comm_bytes(const shape& s, const layout& l, std::int64_t stream, std::int64_t tokens,
                                       std::int64_t dp, double element = 4) {
  const double h = static_cast<double>(s.hidden.get()), layers = static_cast<double>(s.layers.get());
  const double n = static_cast<double>(l.tp.get()), replicas = static_cast<double>(dp);
  double bytes = ring_all_reduce_bytes(4.0 * static_cast<double>(local_elements(s, l, {}, 0)), replicas);
  if (l.tp.get() == 1) return bytes;
  const double full = static_cast<double>(stream) * h * element, shard = full / n;
  // Vocab-parallel log-probs: an all-reduce (max) of T floats and one of the stacked [S, z_y, sum e z].
  bytes += ring_all_reduce_bytes(4.0 * static_cast<double>(tokens), n) +
           ring_all_reduce_bytes(12.0 * static_cast<double>(tokens), n);
  if (!l.sp.get()) {
    // fwd: embedding, o_proj and down all-reduces; bwd: the qkv, gate_up and lm_head inputs'.
    return bytes + (2 + 4 * layers) * ring_all_reduce_bytes(full, n);
  }
  // fwd: embedding reduce-scatter, per layer 2 all-gathers + 2 reduce-scatters, lm_head
  // all-gather; bwd: each one's reverse. finalize_grads: the SP-partial norm gradients.
  const double gathers = 2 + 4 * layers, scatters = 2 + 4 * layers;
  return bytes + gathers * ring_all_gather_bytes(shard, n) + scatters * ring_reduce_scatter_bytes(full, n) +
         ring_all_reduce_bytes((2 * layers + 1) * h * 4, n);
}

// The most any pipeline rank's layers add up to, of per_layer(i): per-rank traffic is its own
// layers' (all of them at pp 1).
template <class PerLayer>
constexpr double busiest_pp_rank(const shape& s, const layout& l, PerLayer per_layer) {
  double most = 0;
  for (std::int64_t r = 0; r < l.pp.get(); ++r) {
    double sum = 0;
    for (std::int64_t i = 0; i < s.layers.get(); ++i)
      if (l.pp.get() == 1 || place_of_layer(s, l, i).pp_rank == r) sum += per_layer(i);
    most = sum > most ? sum : most;
  }
  return most;
}

// Bytes one rank sends over its ep group by all-to-all in one forward + backward of a mixture of
// experts, when its `tokens` rows are routed uniformly (the expected share (ep - 1) / ep of the
// top_k copies leaves the rank): per sparse layer of its pipeline stage (the busiest stage's at
// pp > 1) the dispatch and the combine in the forward, and their reverses in the backward, each
// of tokens * top_k rows of h elements of `element` bytes. Dense models and ep = 1 send nothing.
constexpr double moe_all_to_all_bytes(const shape& s, const layout& l, std::int64_t tokens, double element = 4) {
  if (!routes_any(s) || l.ep.get() <= 1) return 0;
  const double ep = static_cast<double>(l.ep.get());
  const double rows = static_cast<double>(tokens) * static_cast<double>(s.top_k.get());
  const double sparse = busiest_pp_rank(s, l, [&](std::int64_t i) { return layer_routes(s, i) ? 1.0 : 0.0; });
  return 4.0 * sparse * rows * static_cast<double>(s.hidden.get()) * element * (ep - 1) / ep;
}

// Bytes one rank sends over its cp group in one forward + backward under context parallelism
// (Ulysses), for its own `tokens` rows: each layer's token mixer's all-to-alls and all-gathers
// (module_node::cp_sent) on its pipeline stage (the busiest stage's at pp > 1), the backward's
// moving as much as the forward's; under a2a+ring the same within its a2a group of cp_a2a ranks.
// cp = 1 and the plain ring send nothing this way.
constexpr double cp_all_to_all_bytes(const shape& s, const layout& l, std::int64_t tokens, double element = 4) {
  const std::int64_t a2a = cp_a2a_size(l);
  if (a2a <= 1) return 0;
  const double per_token = busiest_pp_rank(s, l, [&](std::int64_t i) { return layer_cp_sent(s, i, l.tp.get(), a2a); });
  return 2.0 * per_token * static_cast<double>(tokens) * element;
}

// Bytes one rank sends around its cp ring in one forward + backward under ring context
// parallelism (layers/ring_attention.hpp), for its own `tokens` rows: each token-mixing layer of
// its stage passes its k/v block (module_node::ring_sent: its tp rank's kv heads, one when they
// are fewer than tp; MLA's every head at its k and v widths) with the rows' positions and sequence
// ids (int64) cp - 1 times forward, and k/v, the ids and dk/dv (fp32) cp times backward, the last
// pass bringing dk/dv home. Under a2a+ring the ring has cp / cp_a2a ranks and each block is the
// a2a group's rows (cp_a2a times its own) of 1/cp_a2a of the heads: the kv heads a rank of a
// tp x cp_a2a split would hold.
constexpr double cp_ring_bytes(const shape& s, const layout& l, std::int64_t tokens, double element = 4) {
  if (!cp_ring(l)) return 0;
  const std::int64_t a2a = cp_a2a_size(l);
  const double cp = static_cast<double>(cp_ring_size(l)), rows = static_cast<double>(tokens * a2a);
  return busiest_pp_rank(s, l, [&](std::int64_t i) {
    const double kv = layer_ring_sent(s, i, l.tp.get() * a2a);
    if (kv == 0) return 0.0;
    const double kv_block = rows * kv * element, ids = 2 * rows * 8, grads = rows * kv * 4;
    return (cp - 1) * (kv_block + ids) + cp * (kv_block + ids + grads);
  });
}

}  // namespace megadsl
