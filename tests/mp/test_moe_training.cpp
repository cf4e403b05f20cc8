// Mixtures of experts in every layout: inference and PPO training equal one process, and router
// replay (record the routing in one forward, replay it in a later forward and its backward).
#include "../catch_torch.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "megadsl/layers/moe.hpp"
#include "megadsl/runtime/trainer.hpp"
#include "mp_support.hpp"

namespace megadsl::test {
namespace {

const forward_options recording{.record_routing = true};

// Where two routings (b, s, layers, k) differ, over the real tokens: the count of (token, layer)
// pairs whose expert sets differ.
std::int64_t routing_differences(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  const at::Tensor sa = std::get<0>(a.sort(-1)), sb = std::get<0>(b.sort(-1));
  const at::Tensor differ = (sa != sb).any(-1) & mask.to(at::kBool).unsqueeze(-1);  // (b, s, layers)
  return differ.sum().item<std::int64_t>();
}

// Every rank's routing of the same batch, and its outputs, equal one process's; a replayed routing
// (not the one the router would choose) is followed to the expert in every layout.
template <class M, layout L>
void check_moe_inference() {
  INFO(M::name << " tp=" << L.tp.get() << " pp=" << L.pp.get() << " ep=" << L.ep.get() << " cp=" << L.cp.get()
               << " sp=" << L.sp.get() << " rmpad=" << L.rmpad.get());
  const model_options opt = test_options<M>();
  auto single = parallel_groups::single();
  parallel_model<causal_lm<M>> ref(single, opt);
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<M, L>> model(groups, opt);
  const padded_batch pb = make_batch(M::shape.vocab, /*left_padding=*/true);
  batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output r = ref.forward(b, recording), o = model.forward(b, recording);
  CHECK(max_abs_diff(r.log_probs, o.log_probs) <= 1e-5);
  CHECK(max_abs_diff(r.entropy, o.entropy) <= 1e-5);
  REQUIRE(o.routed_experts.sizes() == at::IntArrayRef({4, 12, M::shape.layers.get(), M::shape.top_k.get()}));
  CHECK(routing_differences(r.routed_experts, o.routed_experts, pb.mask) == 0);
  CHECK(at::equal(o.routed_experts.select(0, 2).select(0, 0), at::full({M::shape.layers.get(), M::shape.top_k.get()}, -1, at::kLong)));  // padding

  // Replay: each token sent to the next expert sets over (e + 1) % E, a routing the router did not choose.
  b.routed_experts = at::where(r.routed_experts >= 0, (r.routed_experts + 1) % M::shape.experts.get(), r.routed_experts);
  const model_output rr = ref.forward(b, recording), oo = model.forward(b, recording);
  CHECK(routing_differences(rr.routed_experts, b.routed_experts, pb.mask) == 0);
  CHECK(routing_differences(oo.routed_experts, b.routed_experts, pb.mask) == 0);
  CHECK(max_abs_diff(rr.log_probs, oo.log_probs) <= 1e-5);
  CHECK(max_abs_diff(rr.log_probs, r.log_probs) > 1e-3);  // the replayed experts changed the numbers
}

// Five PPO steps equal one process's; with `replay`, both replay the routing the initial model
// recorded in its log-prob pass (verl's R2), and the update's routing is the recorded one.
// With `aux`, the load-balancing (per micro-batch, or per sequence) and z losses are on: Megatron's
// mean over micro-batches and dp ranks, which the one process matches with as many micro-batches
// as the layout has in all (dp x microbatches, the same rows in each).
enum class aux_losses { off, token, sequence };
template <class M, layout L>
void check_moe_training(std::int64_t microbatches, bool replay, const micro_batch_options* budget = nullptr,
                        aux_losses aux = aux_losses::off, const dropout_rates& dropout = {}) {
  INFO(M::name << " tp=" << L.tp.get() << " pp=" << L.pp.get() << " ep=" << L.ep.get() << " cp=" << L.cp.get()
               << " sp=" << L.sp.get() << " rmpad=" << L.rmpad.get() << " replay=" << replay << " aux=" << static_cast<int>(aux)
               << " " << describe(dropout));
  model_options mopt = test_options<M>();
  mopt.dropout = dropout;
  if (aux != aux_losses::off) {
    mopt.moe_aux_loss_coeff = 0.05;
    mopt.moe_aux_loss_per_sequence = aux == aux_losses::sequence;
    mopt.moe_z_loss_coeff = 0.01;
  }
  const std::int64_t dp = dist().world() / (L.tp.get() * L.pp.get() * L.cp.get());
  const std::int64_t ref_microbatches = aux != aux_losses::off ? dp * microbatches : 1;
  const optimizer_config opt{.lr = 1e-4, .eps = 1e-6, .weight_decay = 0.01, .clip_grad = 1.0};
  const actor_loss_config acfg{.clip_ratio = 0.2, .entropy_coeff = 0.01, .kl_coeff = 0.05};
  rollout_batch rb = make_rollout(M::shape.vocab);

  auto single = parallel_groups::single();
  parallel_model<causal_lm<M>> ref(single, mopt);
  if (replay) {  // the log-prob pass records
    const model_output logp = ref.forward({.input_ids = rb.input_ids, .attention_mask = rb.attention_mask}, recording);
    rb.routed_experts = logp.routed_experts;
  }
  trainer ref_trainer = make_trainer(ref, single, opt, acfg);
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<M, L>> model(groups, mopt);
  trainer t = make_trainer(model, groups, opt, acfg);
  for (int step = 0; step < 5; ++step) {
    const step_metrics a = ref_trainer.step(rb, ref_microbatches);
    const step_metrics b = budget != nullptr ? t.step(rb, *budget) : t.step(rb, microbatches);
    INFO("step " << step);
    CHECK(std::abs(a.loss - b.loss) <= 1e-5 * std::max(1.0, std::abs(a.loss)));
    CHECK(std::abs(a.grad_norm - b.grad_norm) <= 1e-5 * std::max(1.0, a.grad_norm));
    CHECK(std::abs(a.moe_aux_loss - b.moe_aux_loss) <= 1e-6 * std::max(1.0, a.moe_aux_loss));
    CHECK((aux == aux_losses::off ? a.moe_aux_loss == 0 : a.moe_aux_loss > 1e-3));
  }
  const auto want = gather_hf_tensors(ref.parameters(), ref.config(), nullptr, false);
  const auto got = gather_hf_tensors(model.parameters(), model.config(), groups.tp.get(), false);
  REQUIRE(!got.empty());
  std::int64_t experts_seen = 0;
  for (const auto& [name, value] : got) {
    INFO("parameter " << name);
    REQUIRE(want.count(name) == 1);
    CHECK(max_abs_diff(want.at(name), value) <= 1e-5);
    experts_seen += name.find(".experts.") != std::string::npos;
  }
  // This rank's experts only: its stage's sparse layers, experts / ep of each, each its HF tensors
  // (gate, up and down; gpt-oss's slices of gate_up, down and their biases; Llama 4's of gate_up and down).
  std::int64_t sparse_here = 0, per_expert = 0;
  for (std::int64_t i = 0; i < M::shape.layers.get(); ++i)
    sparse_here += layer_routes(M::shape, i) && place_of_layer(M::shape, L, i).pp_rank == groups.pp->rank();
  for (const param_row& row : arch_of(M::shape).rows) per_expert += row.where == placement::expert ? row.hf_count : 0;
  CHECK(per_expert >= 2);
  CHECK(experts_seen == sparse_here * (M::shape.experts.get() / L.ep.get()) * per_expert);
  if (replay) {
    // The update's forward with the recorded routing takes exactly that routing, after training.
    const batch b{.input_ids = rb.input_ids, .attention_mask = rb.attention_mask, .routed_experts = rb.routed_experts};
    const model_output o = model.forward(b, recording);
    CHECK(routing_differences(o.routed_experts, rb.routed_experts, rb.attention_mask) == 0);
  }
}

}  // namespace

TEST_CASE("mixtures of experts: every layout routes and computes like one process, and replays a given routing",
          "[world4][moe][families]") {
  check_moe_inference<tiny8_mixtral, layout{.ep = 4}>();
  check_moe_inference<tiny8_mixtral, layout{.tp = 2, .pp = 2}>();
  check_moe_inference<tiny8_qwen2_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_qwen2_moe, layout{.tp = 4, .sp = true}>();
  check_moe_inference<tiny8_qwen3_moe, layout{.pp = 2, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_qwen3_moe, layout{.pp = 2, .vpp = 2, .ep = 2}>();
  check_moe_inference<tiny8_qwen2_moe_mixed, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}>();
  check_moe_inference<tiny8_qwen2_moe_mixed, layout{.pp = 2, .ep = 2}>();
  check_moe_inference<tiny8_olmoe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();  // full-width q/k norms
  check_moe_inference<tiny8_glm4_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();  // the grouped sigmoid router
  check_moe_inference<tiny8_glm4_moe, layout{.pp = 2, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_glm4_moe, layout{.ep = 4}>();
  check_moe_inference<tiny8_hunyuan_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();  // + shared MLP
  // Multi-head latent attention: heads over tp 4 (the latents replicated), sp, remove-padding, pp.
  check_moe_inference<tiny8_deepseek_v3, layout{.tp = 4, .sp = true, .rmpad = true}>();
  check_moe_inference<tiny8_deepseek_v3, layout{.tp = 2, .pp = 2}>();
  check_moe_inference<tiny8_deepseek_v3, layout{.pp = 2, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_moonlight, layout{.tp = 2, .sp = true, .ep = 2}>();
  check_moe_inference<tiny8_moonlight, layout{.pp = 2, .vpp = 2, .rmpad = true}>();
  // gpt-oss: sinks, alternating windows, biased router and experts, the clamped SwiGLU.
  check_moe_inference<tiny8_gpt_oss, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_gpt_oss, layout{.tp = 2, .pp = 2}>();
  check_moe_inference<tiny8_gpt_oss, layout{.pp = 2, .rmpad = true}>();
  check_moe_inference<tiny8_gpt_oss, layout{.tp = 4, .sp = true}>();
  // Llama 4: chunked RoPE layers with q/k L2 norms, temperature-tuned NoPE layers, the router on
  // the experts' input beside the shared expert, dense and sparse layers interleaved.
  check_moe_inference<tiny8_llama4, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_llama4, layout{.tp = 2, .pp = 2}>();
  check_moe_inference<tiny8_llama4, layout{.pp = 2, .rmpad = true}>();
  check_moe_inference<tiny8_llama4, layout{.tp = 4, .sp = true}>();
  // Qwen3-Next: gated DeltaNet layers (each packed sequence from a zero state), output-gated
  // attention, mixtures with the gated shared expert, a dense layer.
  check_moe_inference<tiny8_qwen3_next, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_qwen3_next, layout{.tp = 2, .pp = 2}>();
  check_moe_inference<tiny8_qwen3_next, layout{.pp = 2, .rmpad = true}>();
  check_moe_inference<tiny8_qwen3_next, layout{.tp = 4, .sp = true}>();  // 2 kv heads over 4 ranks
  check_moe_inference<tiny8_qwen3_5_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();
  // ERNIE 4.5 MoE: the biased softmax router, dense layers at both ends.
  check_moe_inference<tiny8_ernie4_5_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_ernie4_5_moe, layout{.tp = 2, .pp = 2}>();
  check_moe_inference<tiny8_ernie4_5_moe, layout{.pp = 2, .rmpad = true, .ep = 2}>();
  check_moe_inference<tiny8_ernie4_5_moe_unshared, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>();
  static_assert(!present(*find_row(arch_of(tiny8_ernie4_5_moe_unshared::shape), "layers.{layer}.shared_expert.down.weight"),
                         tiny8_ernie4_5_moe_unshared::shape, head_info{}));
}

TEST_CASE("mixtures of experts: PPO steps over ep, tp, sp and remove-padding equal one process, with and without router replay",
          "[world4][moe][training]") {
  check_moe_training<tiny8_qwen2_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, false);
  check_moe_training<tiny8_qwen2_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_mixtral, layout{.ep = 4}>(1, true);
  // Expert gradients summed over an expert-data-parallel group of 2 (dp 4 = ep 2 x edp 2), and
  // over plain dp at ep 1.
  check_moe_training<tiny8_mixtral, layout{.ep = 2}>(1, false);
  check_moe_training<tiny8_qwen3_moe, layout{.tp = 2}>(2, false);
  // The expert biases balanced by the load summed over dp 4 (the distributed optimizer's
  // reduce-scatter leaves the dp sum of the counts to the balancing).
  check_moe_training<tiny8_glm4_moe, layout{.ep = 4}>(1, true);
  check_moe_training<tiny8_hunyuan_moe, layout{.tp = 2, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_glm4_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, false, nullptr, aux_losses::token);
  check_moe_training<tiny8_glm4_5, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);  // + per-head q/k norms
  check_moe_training<tiny8_deepseek_v3, layout{.tp = 4, .sp = true, .rmpad = true}>(1, true);
  check_moe_training<tiny8_gpt_oss, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_gpt_oss, layout{.ep = 4}>(1, false);
  check_moe_training<tiny8_gpt_oss, layout{.tp = 2, .pp = 2}>(2, false);
  check_moe_training<tiny8_gpt_oss, layout{.pp = 2, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_gpt_oss, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, false, nullptr, aux_losses::token);
  check_moe_training<tiny8_moonlight, layout{.tp = 2, .rmpad = true, .ep = 2, .recompute = recompute_kind::selective}>(2, false);
  check_moe_training<tiny8_llama4, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_llama4, layout{.ep = 4}>(1, false);
  check_moe_training<tiny8_llama4, layout{.tp = 2, .pp = 2}>(2, false);
  check_moe_training<tiny8_llama4, layout{.pp = 2, .rmpad = true, .ep = 2, .recompute = recompute_kind::selective}>(2, true);
  check_moe_training<tiny8_llama4, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, false, nullptr, aux_losses::token);
  check_moe_training<tiny8_qwen3_next, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_qwen3_next, layout{.ep = 4}>(1, false);
  check_moe_training<tiny8_qwen3_next, layout{.tp = 2, .pp = 2}>(2, false);
  check_moe_training<tiny8_qwen3_next, layout{.pp = 2, .rmpad = true, .ep = 2, .recompute = recompute_kind::selective}>(2, true);
  check_moe_training<tiny8_qwen3_5_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_qwen3_5_moe, layout{.tp = 2, .pp = 2}>(2, false);
  // ERNIE's expert biases balanced by load like DeepSeek's, its softmax scores weighing.
  check_moe_training<tiny8_ernie4_5_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_ernie4_5_moe, layout{.ep = 4}>(1, false, nullptr, aux_losses::token);
  check_moe_training<tiny8_qwen3_next, layout{.tp = 4, .sp = true}>(2, false);  // k_proj / v_proj's gradients summed over tp
  // The load-balancing and z losses through the backward: per micro-batch and per sequence.
  check_moe_training<tiny8_qwen2_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, false, nullptr, aux_losses::token);
  check_moe_training<tiny8_mixtral, layout{.ep = 4}>(1, true, nullptr, aux_losses::sequence);
  check_moe_training<tiny8_qwen3_moe, layout{.tp = 4, .sp = true}>(2, false, nullptr, aux_losses::token);
  // Full recompute: the all-to-alls and the auxiliary losses run again in the backward, counted once.
  check_moe_training<tiny8_qwen2_moe, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2, .recompute = recompute_kind::full}>(
      2, true, nullptr, aux_losses::token);
  check_moe_training<tiny8_qwen3_moe, layout{.ep = 4, .recompute = recompute_kind::selective}>(1, false);
  // The balancer reorders rows over dp and into micro-batches; the routing travels with its rows.
  const micro_batch_options budget{.max_token_len = 20};
  check_moe_training<tiny8_qwen3_moe, layout{.rmpad = true, .ep = 4}>(0, true, &budget);
}

// Qwen3-Next's rows longer than the delta rule's chunk (64): 150, 70 and 21 tokens, right- and
// left-padded and packed back to back; each layout's outputs equal one process's right-padded ones.
template <layout L>
void check_long_qwen3_next(const batch& right, const batch& left, const at::Tensor& log_probs, const at::Tensor& entropy) {
  INFO("tp=" << L.tp.get() << " pp=" << L.pp.get() << " ep=" << L.ep.get() << " sp=" << L.sp.get() << " rmpad=" << L.rmpad.get());
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<tiny8_qwen3_next, L>> model(groups, test_options<tiny8_qwen3_next>());
  for (const batch* b : {&right, &left}) {
    const model_output o = model.forward(*b);
    CHECK(max_abs_diff(o.log_probs.masked_select(o.valid.to(at::kBool)), log_probs) <= 1e-5);
    CHECK(max_abs_diff(o.entropy.masked_select(b->attention_mask.to(at::kBool)), entropy) <= 1e-5);
  }
}

TEST_CASE("Qwen3-Next: rows longer than the delta rule's chunk, padded either side or packed, equal one process",
          "[world4][moe]") {
  const std::int64_t lengths[] = {150, 70, 21}, seq = 150;
  const at::Tensor tokens = at::randint(1, tiny8_qwen3_next::shape.vocab.get(), {3, seq},
                                        at::make_generator<at::CPUGeneratorImpl>(11));
  at::Tensor right_mask = at::zeros({3, seq}, at::kLong), left_mask = at::zeros({3, seq}, at::kLong);
  at::Tensor right_ids = at::zeros({3, seq}, at::kLong), left_ids = at::zeros({3, seq}, at::kLong);
  for (std::int64_t i = 0; i < 3; ++i) {
    const std::int64_t n = lengths[i];
    right_mask[i].narrow(0, 0, n).fill_(1);
    left_mask[i].narrow(0, seq - n, n).fill_(1);
    right_ids[i].narrow(0, 0, n).copy_(tokens[i].narrow(0, 0, n));
    left_ids[i].narrow(0, seq - n, n).copy_(tokens[i].narrow(0, 0, n));
  }
  const batch right{.input_ids = right_ids, .attention_mask = right_mask}, left{.input_ids = left_ids, .attention_mask = left_mask};
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny8_qwen3_next>> ref(single, test_options<tiny8_qwen3_next>());
  const model_output r = ref.forward(right);
  const at::Tensor log_probs = r.log_probs.masked_select(r.valid.to(at::kBool)), entropy = r.entropy.masked_select(right_mask.to(at::kBool));
  // The state carries over the chunks: a token of the first chunk changes the last chunk's outputs.
  batch edited = right;
  edited.input_ids = right_ids.clone();
  edited.input_ids[0][10] = (right_ids[0][10].item<std::int64_t>() % 400) + 1;
  CHECK(max_abs_diff(ref.forward(edited).entropy[0].narrow(0, 140, 10), r.entropy[0].narrow(0, 140, 10)) > 1e-6);
  check_long_qwen3_next<layout{}>(right, left, log_probs, entropy);
  check_long_qwen3_next<layout{.rmpad = true}>(right, left, log_probs, entropy);
  check_long_qwen3_next<layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(right, left, log_probs, entropy);
  check_long_qwen3_next<layout{.pp = 2, .rmpad = true}>(right, left, log_probs, entropy);
  check_long_qwen3_next<layout{.tp = 2, .pp = 2}>(right, left, log_probs, entropy);
  // Context parallelism: each cp rank runs the rule over whole sequences for its key heads.
  check_long_qwen3_next<layout{.rmpad = true, .cp = 4}>(right, left, log_probs, entropy);
  check_long_qwen3_next<layout{.tp = 2, .sp = true, .cp = 2}>(right, left, log_probs, entropy);
}

TEST_CASE("mixtures of experts under context parallelism: routing, replay, the auxiliary losses over the whole "
          "sequences, experts over ep across the cp ranks",
          "[world4][moe][cp]") {
  check_moe_inference<tiny8_qwen3_moe, layout{.rmpad = true, .cp = 2, .ep = 2}>();
  check_moe_inference<tiny8_mixtral, layout{.pp = 2, .cp = 2}>();
  check_moe_inference<tiny8_gpt_oss, layout{.rmpad = true, .cp = 2, .ep = 2}>();  // each cp rank's heads' sinks
  check_moe_inference<tiny8_llama4, layout{.rmpad = true, .cp = 2, .ep = 2}>();  // chunks and temperatures by position
  // The switch and z losses see every token of the micro-batch (gathered over cp), not a share.
  check_moe_training<tiny8_qwen3_moe, layout{.rmpad = true, .cp = 2, .ep = 2}>(2, true, nullptr, aux_losses::token);
  check_moe_training<tiny8_mixtral, layout{.cp = 2}>(1, false, nullptr, aux_losses::sequence);
  check_moe_training<tiny8_gpt_oss, layout{.rmpad = true, .cp = 2}>(1, false);  // the sinks' gradients over cp
  check_moe_training<tiny8_llama4, layout{.cp = 2}>(1, true);
  check_moe_training<tiny8_qwen2_moe, layout{.pp = 2, .rmpad = true, .cp = 2}>(2, true, nullptr, aux_losses::token);
  // Qwen3-Next: the gated DeltaNet and the gated attention under Ulysses (an all-to-all to whole
  // sequences of a share of the heads); at tp 2 x cp 2 one key head and one query head per rank,
  // the kv head gathered over cp.
  check_moe_inference<tiny8_qwen3_next, layout{.rmpad = true, .cp = 2, .ep = 2}>();
  check_moe_inference<tiny8_qwen3_next, layout{.tp = 2, .sp = true, .cp = 2}>();
  check_moe_inference<tiny8_qwen3_5_moe, layout{.cp = 2}>();  // in_proj_qkv's and the conv's slots, each cp rank's share
  check_moe_training<tiny8_qwen3_next, layout{.rmpad = true, .cp = 2, .ep = 2}>(2, true);
  check_moe_training<tiny8_qwen3_next, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}>(2, false);
  check_moe_training<tiny8_qwen3_5_moe, layout{.rmpad = true, .cp = 2}>(2, false);
  // HunYuan's q/k norms after RoPE: each cp rank rotates and norms its own rows before the all-to-all.
  check_moe_inference<tiny8_hunyuan_moe, layout{.rmpad = true, .cp = 2, .ep = 2}>();
  check_moe_training<tiny8_hunyuan_moe, layout{.tp = 2, .sp = true, .cp = 2}>(2, false);
  // Ring cp: the experts over ep across the cp ranks, the auxiliary losses over the whole
  // sequences gathered in the load-balanced split's order, replay by each token's own position.
  check_moe_inference<tiny8_qwen3_moe, layout{.rmpad = true, .cp = 2, .cp_comm = cp_comm_kind::ring, .ep = 2}>();
  check_moe_training<tiny8_qwen3_moe, layout{.rmpad = true, .cp = 2, .cp_comm = cp_comm_kind::ring, .ep = 2}>(
      2, true, nullptr, aux_losses::token);
  check_moe_training<tiny8_mixtral, layout{.cp = 2, .cp_comm = cp_comm_kind::ring}>(1, false, nullptr, aux_losses::sequence);
  check_moe_training<tiny8_hunyuan_moe, layout{.tp = 2, .sp = true, .cp = 2, .cp_comm = cp_comm_kind::ring}>(2, false);
  // Multi-head latent attention: q, k_nope and v by heads over cp, the shared rotary key gathered.
  check_moe_inference<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 2, .ep = 2}>();
  check_moe_inference<tiny8_moonlight, layout{.tp = 2, .sp = true, .cp = 2}>();
  check_moe_training<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 4}>(1, true);
  check_moe_training<tiny8_moonlight, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2, .recompute = recompute_kind::selective}>(2, false);
}

// The ring through the attention kinds beyond plain softmax attention: MLA (every head's k with
// the shared rotary key, v narrower than q and k), gpt-oss's sinks (one more logit per head in
// every row's softmax, its gradient summed over cp) with sliding windows, Llama 4's chunks (by each
// token's position in its sequence) and its NoPE layers' temperatures.
TEST_CASE("ring context parallelism through MLA, gpt-oss's sinks and Llama 4's chunks and temperatures: inference and "
          "training equal one process",
          "[world4][moe][cp][ring]") {
  constexpr auto ring = cp_comm_kind::ring;
  check_moe_inference<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 2, .cp_comm = ring, .ep = 2}>();
  check_moe_inference<tiny8_moonlight, layout{.tp = 2, .sp = true, .cp = 2, .cp_comm = ring}>();
  check_moe_training<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 4, .cp_comm = ring}>(1, true);
  check_moe_inference<tiny8_gpt_oss, layout{.rmpad = true, .cp = 2, .cp_comm = ring, .ep = 2}>();
  check_moe_training<tiny8_gpt_oss, layout{.rmpad = true, .cp = 2, .cp_comm = ring}>(1, false);
  check_moe_training<tiny8_gpt_oss, layout{.tp = 2, .sp = true, .cp = 2, .cp_comm = ring}>(2, false);
  check_moe_inference<tiny8_llama4, layout{.rmpad = true, .cp = 2, .cp_comm = ring, .ep = 2}>();
  check_moe_training<tiny8_llama4, layout{.cp = 2, .cp_comm = ring}>(1, true);
  check_moe_training<tiny8_llama4, layout{.rmpad = true, .cp = 4, .cp_comm = ring}>(1, false);
}

// Hierarchical cp (a2a+ring, cp 4 as all-to-all pairs around a ring of 2) through the same kinds:
// MLA's heads by all-to-all with its rotary key gathered, the sinks of each pair's half of the
// heads, Llama 4's chunks and temperatures at each row's own position.
TEST_CASE("hierarchical context parallelism through MLA, sinks and Llama 4's chunks: inference and training equal one "
          "process",
          "[world4][moe][cp][ring][hierarchical]") {
  constexpr auto a2a_ring = cp_comm_kind::a2a_ring;
  check_moe_inference<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2, .ep = 2}>();
  check_moe_training<tiny8_deepseek_v3, layout{.cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>(1, true);
  check_moe_training<tiny8_gpt_oss, layout{.rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>(1, false);
  check_moe_training<tiny8_llama4, layout{.cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>(1, true);
}

TEST_CASE("five PPO steps at tp 2 x ep 2 x pp 2 equal one process, with and without router replay",
          "[world8][moe][training]") {
  REQUIRE(dist().world() == 8);
  check_moe_training<tiny8_mixtral, layout{.tp = 2, .pp = 2, .ep = 2}>(2, false);
  check_moe_training<tiny8_mixtral, layout{.tp = 2, .pp = 2, .ep = 2}>(2, true);
  check_moe_training<tiny8_qwen2_moe, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_qwen3_moe, layout{.tp = 2, .pp = 2, .sp = true, .ep = 2}>(2, false);
  check_moe_training<tiny8_qwen2_moe_mixed, layout{.tp = 2, .pp = 2, .ep = 2}>(2, true);
  check_moe_training<tiny8_gpt_oss, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_llama4, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_qwen3_next, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_olmoe, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  // The expert biases balanced by load (summed over dp 2) move alike in every layout.
  check_moe_training<tiny8_glm4_moe, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, false);
  check_moe_training<tiny8_glm4_moe, layout{.tp = 2, .pp = 2, .ep = 2}>(2, true);
  check_moe_training<tiny8_deepseek_v3, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true);
  check_moe_training<tiny8_moonlight, layout{.tp = 2, .pp = 2, .ep = 2}>(2, false);
}

// The expert biases of M's sparse layers after one training step, against the balancing rule.
template <class M>
void check_balancing() {
  INFO(M::name);
  std::vector<std::int64_t> sparse;  // the layers with a router (and its bias)
  for (std::int64_t i = 0; i < M::shape.layers.get(); ++i)
    if (layer_routes(M::shape, i)) sparse.push_back(i);
  const optimizer_config opt{.lr = 1e-3, .eps = 1e-6, .weight_decay = 0.1, .clip_grad = 1.0};
  const rollout_batch rb = make_rollout(M::shape.vocab);
  auto single = parallel_groups::single();
  const auto biases = [](parallel_model<causal_lm<M>>& m) {
    std::vector<at::Tensor> out;
    for (const named_parameter& p : m.parameters())
      if (p.name.ends_with("router.expert_bias")) out.push_back(p.tensor.detach().clone());
    return out;
  };
  for (const double rate : {0.0, 0.01}) {
    INFO("rate " << rate);
    model_options mopt = test_options<M>();
    mopt.moe_expert_bias_update_rate = rate;
    parallel_model<causal_lm<M>> model(single, mopt);
    // The first training forward routes as this one does (the same parameters and rows).
    const at::Tensor routed = model.forward({.input_ids = rb.input_ids, .attention_mask = rb.attention_mask}, recording)
                                  .routed_experts;  // (b, s, layers, k), -1 at padding
    const std::vector<at::Tensor> before = biases(model);
    REQUIRE(before.size() == sparse.size());
    trainer t = make_trainer(model, single, opt, actor_loss_config{});
    t.step(rb, 1);
    const std::vector<at::Tensor> after = biases(model);
    for (std::size_t i = 0; i < after.size(); ++i) {
      const std::int64_t layer = sparse[i];
      const at::Tensor chosen = routed.select(2, layer).reshape({-1});
      const at::Tensor load = at::bincount(chosen.masked_select(chosen >= 0), {}, M::shape.experts.get()).to(at::kDouble);
      const at::Tensor want = before[i] + (at::sign(load.mean() - load) * rate).to(at::kFloat);
      INFO("layer " << layer << " load " << load);
      // With rate 0 the bias is exactly as it was: its gradient is zero and AdamW, with no decay on a
      // vector, leaves it; otherwise exactly one step of the balancing rule.
      CHECK(at::equal(after[i], want));
    }
  }
}

TEST_CASE("the aux-loss-free balancing: each expert bias moves by rate * sign(mean load - load), and nothing else "
          "moves it", "[world4][moe][training]") {
  check_balancing<tiny8_glm4_moe>();      // DeepSeek's sigmoid router: layers 1-7
  check_balancing<tiny8_ernie4_5_moe>();  // ERNIE's softmax router: layers 1-6
}

TEST_CASE("the auxiliary losses: a balanced router costs 1, the z-loss log(E)^2, and they move the router",
          "[world4][moe][training]") {
  // 8 tokens, 4 experts, top 2, every expert chosen 4 times, uniform probabilities: Megatron's
  // switch loss is exactly 1, and the z-loss of zero logits log(4)^2.
  const at::Tensor probs = at::full({8, 4}, 0.25, at::kFloat);
  const at::Tensor idx = at::tensor({0, 1, 2, 3, 0, 1, 2, 3, 0, 2, 1, 3, 0, 3, 1, 2}, at::kLong).view({8, 2});
  const at::Tensor all = at::ones({8}, at::kFloat);
  CHECK(switch_load_balancing_loss(probs, idx, all).item<double>() == Approx(1.0).epsilon(1e-6));
  CHECK(sequence_load_balancing_loss(probs, idx, all, at::tensor({0, 0, 0, 0, 1, 1, 1, 1}, at::kLong), 2).item<double>() ==
        Approx(1.0).epsilon(1e-6));
  CHECK(router_z_loss(at::zeros({8, 4}), all).item<double>() == Approx(std::log(4.0) * std::log(4.0)).epsilon(1e-6));
  // Everything on expert 0 with its probability 1: E / k = 2; invalid tokens do not count.
  const at::Tensor skewed = at::zeros({8, 4}).index_fill_(1, at::tensor({0}, at::kLong), 1.0);
  const at::Tensor to_zero = at::stack({at::zeros({8}, at::kLong), at::ones({8}, at::kLong)}, 1);
  CHECK(switch_load_balancing_loss(skewed, to_zero, all).item<double>() == Approx(2.0).epsilon(1e-6));
  CHECK(switch_load_balancing_loss(at::cat({skewed, probs}), at::cat({to_zero, idx}), at::cat({all, at::zeros({8})})).item<double>() ==
        Approx(2.0).epsilon(1e-6));
  // Added through the backward: the router's gradient changes, the loss callback's value does not.
  auto single = parallel_groups::single();
  model_options with = test_options<tiny8_mixtral>();
  with.moe_aux_loss_coeff = 0.1;
  parallel_model<causal_lm<tiny8_mixtral>> a(single, test_options<tiny8_mixtral>()), b(single, with);
  const padded_batch pb = make_batch(tiny8_mixtral::shape.vocab, true);
  const std::vector<batch> mbs{{.input_ids = pb.ids, .attention_mask = pb.mask}};
  const loss_function loss = [](const model_output& out, std::int64_t) { return probe_loss(out, true); };
  CHECK(a.forward_backward(mbs, loss) == b.forward_backward(mbs, loss));
  CHECK(a.moe_aux_loss() == 0);
  CHECK(b.moe_aux_loss() > 0.1 * 8 * 0.5);  // eight layers near balance (1 when balanced), times 0.1
  double router_change = 0;
  for (std::size_t i = 0; i < a.parameters().size(); ++i)
    if (a.parameters()[i].plan->row->geometry == &megadsl::geo::router)
      router_change = std::max(router_change, max_abs_diff(a.parameters()[i].tensor.grad(), b.parameters()[i].tensor.grad()));
  CHECK(router_change > 1e-4);
}

TEST_CASE("without router replay the update can route differently from the log-prob pass; with it, never",
          "[world4][moe][training]") {
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny8_qwen2_moe>> m(single, test_options<tiny8_qwen2_moe>());
  rollout_batch rb = make_rollout(tiny8_qwen2_moe::shape.vocab);
  const batch plain{.input_ids = rb.input_ids, .attention_mask = rb.attention_mask};
  const at::Tensor recorded = m.forward(plain, recording).routed_experts;  // the log-prob pass
  // A few large steps: the policy moves on, as it does between rollouts and late PPO epochs.
  trainer t = make_trainer(m, single, optimizer_config{.lr = 3e-2, .clip_grad = 0});
  for (int i = 0; i < 3; ++i) t.step(rb, 1);
  const std::int64_t live = routing_differences(m.forward(plain, recording).routed_experts, recorded, rb.attention_mask);
  batch replayed = plain;
  replayed.routed_experts = recorded;
  const std::int64_t kept = routing_differences(m.forward(replayed, recording).routed_experts, recorded, rb.attention_mask);
  INFO(live << " (token, layer) pairs routed differently without replay");
  CHECK(live > 0);
  CHECK(kept == 0);
  // A routing for another model is refused with its shape.
  replayed.routed_experts = recorded.narrow(2, 0, 4);
  CHECK_THROWS_WITH(m.forward(replayed), Catch::Contains("routed_experts has shape") && Catch::Contains("(8, 12, 8, 3) int64"));
}

TEST_CASE("training with dropout equals one process: MLA's heads at tp x cp, gpt-oss's sinks at tp x ep with sp, "
          "Qwen3-Next's gated attention at tp x cp",
          "[world4][moe][training][dropout]") {
  constexpr dropout_rates rates{.attention = 0.1, .residual = 0.1, .embedding = 0.1};
  check_moe_training<tiny8_deepseek_v3, layout{.tp = 2, .rmpad = true, .cp = 2}>(1, true, nullptr, aux_losses::off, rates);
  check_moe_training<tiny8_gpt_oss, layout{.tp = 2, .sp = true, .rmpad = true, .ep = 2}>(2, true, nullptr, aux_losses::off, rates);
  check_moe_training<tiny8_qwen3_next, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}>(2, true, nullptr, aux_losses::off, rates);
}

TEST_CASE("a run-time shape whose block keys or architecture differ from the type's is refused, naming them", "[world4][moe]") {
  auto single = parallel_groups::single();
  shape other_limit = tiny8_gpt_oss::shape;
  other_limit.settings = settings_given({{"swiglu_limit", 2.0}});
  CHECK_THROWS_WITH((parallel_model<causal_lm<tiny8_gpt_oss>>(single, {}, other_limit)),
                    Catch::Contains("swiglu_limit: the type says 0.5, the run-time value is 2"));
  shape other_arch = tiny8_gpt_oss::shape;
  other_arch.arch = tiny8_mixtral::shape.arch;
  CHECK_THROWS_WITH((parallel_model<causal_lm<tiny8_gpt_oss>>(single, {}, other_arch)),
                    Catch::Contains("architecture: the type says"));
}

}  // namespace megadsl::test
