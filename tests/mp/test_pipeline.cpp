// Pipeline parallelism and the training step: every layout gives the single-process numbers.
#include "../catch_torch.hpp"

#include <c10/core/GradMode.h>

#include "megadsl/layers/activation_offload.hpp"
#include "megadsl/layers/recompute.hpp"
#include "megadsl/runtime/trainer.hpp"
#include "layout_checks.hpp"

namespace megadsl::test {

TEST_CASE("pipeline inference equals one process: 1F1B stages, interleaved chunks, tp x pp, tied across stages", "[world4][pipeline]") {
  check_inference<tiny8, layout{.pp = 4}, true>(true);
  check_inference<tiny8, layout{.pp = 2, .vpp = 2}, true>(false);
  check_inference<tiny8, layout{.pp = 4, .vpp = 2}, false>(true);
  check_inference<tiny8, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(true);
  check_inference<tiny8_tied, layout{.tp = 2, .pp = 2, .sp = true}, true>(false);
  check_inference<tiny8_tied, layout{.pp = 4, .rmpad = true}, false>(true);
}

TEST_CASE("five PPO steps under pp 4 x vpp 2 (interleaved) equal single-process training", "[world4][pipeline][training]") {
  check_training<tiny8, layout{.pp = 4, .vpp = 2}, true>(4);
  check_training<tiny8_tied, layout{.pp = 4, .vpp = 2}, true>(4);
  check_training<tiny8, layout{.pp = 4, .vpp = 2}, false>(4);
  check_training<tiny8_tied, layout{.pp = 4, .vpp = 2, .rmpad = true}, false>(8);
}

TEST_CASE("selective and full activation recompute train exactly like keeping every activation",
          "[world4][training][recompute]") {
  using enum recompute_kind;
  check_training<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .recompute = selective}, true>(2);
  check_training<tiny8, layout{.tp = 4, .recompute = selective}, true>(1);  // the padded path
  check_training<tiny8_gemma2, layout{.tp = 2, .recompute = selective}, true>(2);  // soft-capped, windowed
  check_training<tiny8, layout{.tp = 2, .pp = 2, .recompute = full}, true>(2);
  check_training<tiny8_tied, layout{.pp = 4, .vpp = 2, .rmpad = true, .recompute = full}, false>(4);
  check_training<tiny8_qwen3, layout{.tp = 4, .sp = true, .recompute = full}, true>(1);
}

TEST_CASE("recompute runs each layer's region again in the backward, and full recompute its collectives",
          "[world4][recompute]") {
  const padded_batch pb = make_batch(tiny8::shape.vocab, true);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const auto step = [&]<layout L>() {
    auto groups = parallel_groups::build(dist(), L);
    parallel_model<causal_lm<tiny8, L>> model(groups, test_options<tiny8>());
    global_comm_stats().reset();
    const std::int64_t before = recompute_reruns();
    probe_loss(model.forward(b), true).backward();
    return std::pair{recompute_reruns() - before, global_comm_stats().calls.load()};
  };
  const auto [none_reruns, none_calls] = step.operator()<layout{.tp = 2}>();
  const auto [selective_reruns, selective_calls] = step.operator()<layout{.tp = 2, .recompute = recompute_kind::selective}>();
  const auto [full_reruns, full_calls] = step.operator()<layout{.tp = 2, .recompute = recompute_kind::full}>();
  const std::int64_t layers = tiny8::shape.layers.get();
  CHECK(none_reruns == 0);
  CHECK(selective_reruns == layers);
  CHECK(full_reruns == layers);
  CHECK(selective_calls == none_calls);  // the attention core has no collective
  // Each layer's forward all-reduces (after the attention and after the MLP) run again.
  CHECK(full_calls == none_calls + 2 * layers);
  // Qwen3-Next: the gated attention's core and the gated DeltaNet's chunked rule, one region a layer.
  {
    using M = tiny8_qwen3_next;
    constexpr layout L{.tp = 2, .recompute = recompute_kind::selective};
    const padded_batch qb = make_batch(M::shape.vocab, true);
    auto groups = parallel_groups::build(dist(), L);
    parallel_model<causal_lm<M, L>> model(groups, test_options<M>());
    const std::int64_t before = recompute_reruns();
    probe_loss(model.forward(batch{.input_ids = qb.ids, .attention_mask = qb.mask}), true).backward();
    CHECK(recompute_reruns() - before == M::shape.layers.get());
  }
  // Inference keeps nothing and reruns nothing.
  {
    auto groups = parallel_groups::build(dist(), layout{.tp = 2, .recompute = recompute_kind::full});
    parallel_model<causal_lm<tiny8, layout{.tp = 2, .recompute = recompute_kind::full}>> model(groups, test_options<tiny8>());
    const std::int64_t before = recompute_reruns();
    c10::NoGradGuard no_grad;
    model.forward(b);
    CHECK(recompute_reruns() == before);
  }
}

// verl's enable_activation_offload: the same layout and steps with the layer inputs through host
// memory give the same bits (on the CPU the host copy is a separate tensor: the bookkeeping, slots
// and order over micro-batches and interleaved chunks are what is tested; CUDA's streams in [cuda]).
TEST_CASE("activation offload trains to the bits of full recompute without it, and is refused without full recompute",
          "[world4][training][recompute]") {
  const optimizer_config opt{.lr = 1e-4, .eps = 1e-6};
  const actor_loss_config acfg{.clip_ratio = 0.2, .entropy_coeff = 0.01};
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const auto check = [&]<layout L>(std::int64_t microbatches) {
    INFO("tp=" << L.tp.get() << " pp=" << L.pp.get() << " vpp=" << L.vpp.get() << " microbatches=" << microbatches);
    auto groups = parallel_groups::build(dist(), L);
    model_options offloaded = test_options<tiny8>();
    offloaded.offload_activations = true;
    parallel_model<causal_lm<tiny8, L>> plain(groups, test_options<tiny8>()), moved(groups, offloaded);
    trainer a = make_trainer(plain, groups, opt, acfg), b = make_trainer(moved, groups, opt, acfg);
    for (int step = 0; step < 3; ++step) {
      const std::int64_t before = activation_offload_bytes();
      const step_metrics ma = a.step(rb, microbatches);
      const std::int64_t plain_bytes = activation_offload_bytes() - before;
      const step_metrics mb = b.step(rb, microbatches);
      CHECK(plain_bytes == 0);
      CHECK(activation_offload_bytes() - before > 0);
      CHECK(ma.loss == mb.loss);
      CHECK(ma.grad_norm == mb.grad_norm);
    }
    for (std::size_t i = 0; i < plain.parameters().size(); ++i) {
      INFO(plain.parameters()[i].name);
      CHECK(at::equal(plain.parameters()[i].tensor, moved.parameters()[i].tensor));
    }
  };
  using enum recompute_kind;
  check.operator()<layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .recompute = full}>(2);
  check.operator()<layout{.pp = 2, .vpp = 2, .recompute = full}>(4);
  // Without full recompute a layer keeps all its activations: offload has nothing it moves.
  auto groups = parallel_groups::build(dist(), layout{.tp = 2, .recompute = selective});
  model_options offloaded = test_options<tiny8>();
  offloaded.offload_activations = true;
  CHECK_THROWS_WITH((parallel_model<causal_lm<tiny8, layout{.tp = 2, .recompute = selective}>>(groups, offloaded)),
                    Catch::Matchers::Contains("offload_activations") && Catch::Matchers::Contains("recompute is selective") &&
                        Catch::Matchers::Contains("set recompute full"));
}

TEST_CASE("five PPO steps under tp 2 x pp 2 x dp 2 equal single-process training", "[world8][pipeline][training]") {
  REQUIRE(dist().world() == 8);
  check_training<tiny8, layout{.tp = 2, .pp = 2}, true>(2);
  check_training<tiny8_tied, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8, layout{.tp = 2, .pp = 2, .sp = true}, false>(4);
  check_training<tiny8_tied, layout{.tp = 2, .pp = 2}, false>(1);
}

TEST_CASE("the qwen3, gemma, gemma2, olmo2, phi3, starcoder2 and gpt_neox compositions: every layout equals one process", "[world4][pipeline][families]") {
  check_inference<tiny8_neox, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);  // parallel residual
  check_inference<tiny8_neox, layout{.tp = 2, .pp = 2}, false>(false);
  check_inference<tiny8_neox, layout{.pp = 2, .vpp = 2, .rmpad = true}, true>(false);
  check_inference<tiny8_gemma2, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);  // windows, soft-caps
  check_inference<tiny8_gemma2, layout{.tp = 2, .pp = 2}, false>(false);
  check_inference<tiny8_gemma2, layout{.pp = 2, .vpp = 2, .rmpad = true}, true>(false);
  check_inference<tiny8_gemma2, layout{.tp = 2, .sp = true}, true>(true);
  check_inference<tiny8_qwen3, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);  // kv replicated
  check_inference<tiny8_qwen3, layout{.tp = 2, .pp = 2, .sp = true}, false>(false);
  check_inference<tiny8_qwen3, layout{.pp = 2, .vpp = 2, .rmpad = true}, true>(false);
  check_inference<tiny8_gemma, layout{.tp = 4, .sp = true}, true>(false);
  check_inference<tiny8_gemma, layout{.tp = 2, .pp = 2, .rmpad = true}, false>(true);
  check_inference<tiny8_gemma, layout{.pp = 2, .vpp = 2}, true>(true);
  check_inference<tiny8_olmo2, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);
  check_inference<tiny8_olmo2, layout{.tp = 2, .pp = 2}, false>(false);
  check_inference<tiny8_olmo2, layout{.pp = 2, .vpp = 2, .rmpad = true}, true>(false);
  check_inference<tiny8_phi3, layout{.tp = 4, .sp = true}, true>(true);
  check_inference<tiny8_phi3, layout{.tp = 2, .pp = 2, .rmpad = true}, false>(false);
  check_inference<tiny8_starcoder2, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);
  check_inference<tiny8_starcoder2, layout{.tp = 2, .pp = 2, .sp = true}, false>(false);
  check_inference<tiny8_smollm3, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);  // NoPE layers
  check_inference<tiny8_smollm3, layout{.pp = 2, .vpp = 2, .rmpad = true}, true>(false);
  check_inference<tiny8_seed_oss, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, false>(true);
  check_inference<tiny8_gemma3, layout{.tp = 2, .sp = true, .rmpad = true}, true>(true);  // RoPE per layer type
  check_inference<tiny8_gemma3, layout{.pp = 2, .vpp = 2}, true>(false);
  check_inference<tiny8_olmo3, layout{.tp = 4, .sp = true, .rmpad = true}, false>(true);
  check_inference<tiny8_exaone4, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(true);
  check_inference<tiny8_ernie4_5, layout{.tp = 4, .sp = true, .rmpad = true}, false>(true);  // RoPE on pairs
  check_inference<tiny8_glm4, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(false);
  check_inference<tiny8_hunyuan, layout{.tp = 2, .pp = 2, .rmpad = true}, false>(true);  // q/k norms after RoPE
  check_inference<tiny8_granite, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(true);  // multipliers, tied
  check_inference<tiny8_cohere2, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(false);  // one norm, side by side
  check_inference<tiny8_cohere2, layout{.tp = 4, .sp = true}, false>(true);
  check_inference<tiny8_cohere, layout{.tp = 2, .rmpad = true, .cp = 2}, true>(true);  // context parallel
  check_inference<tiny8_cohere_plus, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);  // a q/k norm weight per head
  check_inference<tiny8_cohere_plus, layout{.tp = 2, .rmpad = true, .cp = 2}, false>(false);
  check_inference<tiny8_apertus, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, false>(true);  // xIELU
  check_inference<tiny8_apertus, layout{.tp = 4}, true>(false);
}

TEST_CASE("five PPO steps of the qwen3, gemma, gemma2, olmo2, phi3, starcoder2 and gpt_neox compositions under tp 2 x pp 2 x dp 2 equal one process",
          "[world8][pipeline][training][families]") {
  REQUIRE(dist().world() == 8);
  check_training<tiny8_neox, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_neox, layout{.tp = 2, .pp = 2}, false>(2);
  check_training<tiny8_gemma2, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_gemma2, layout{.tp = 2, .pp = 2}, false>(2);
  check_training<tiny8_qwen3, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_qwen3, layout{.tp = 2, .pp = 2}, false>(2);
  check_training<tiny8_gemma, layout{.tp = 2, .pp = 2, .sp = true}, true>(2);
  check_training<tiny8_gemma, layout{.tp = 2, .pp = 2, .rmpad = true}, false>(2);
  check_training<tiny8_olmo2, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_olmo2, layout{.tp = 2, .pp = 2}, false>(2);
  check_training<tiny8_phi3, layout{.tp = 2, .pp = 2, .sp = true}, true>(2);
  check_training<tiny8_starcoder2, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_starcoder2, layout{.tp = 2, .pp = 2}, false>(2);
  check_training<tiny8_smollm3, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_seed_oss, layout{.tp = 2, .pp = 2, .rmpad = true}, false>(2);
  check_training<tiny8_gemma3, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_olmo3, layout{.tp = 2, .pp = 2}, false>(2);
  check_training<tiny8_exaone4, layout{.tp = 2, .pp = 2, .rmpad = true}, true>(2);
  check_training<tiny8_ernie4_5, layout{.tp = 2, .pp = 2, .sp = true}, false>(2);
  check_training<tiny8_glm4, layout{.tp = 2, .pp = 2, .rmpad = true}, false>(2);
  check_training<tiny8_hunyuan, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, false>(2);
  check_training<tiny8_granite, layout{.tp = 2, .pp = 2, .sp = true}, true>(2);
  check_training<tiny8_cohere2, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_cohere, layout{.tp = 2, .pp = 2, .rmpad = true}, false>(2);
  check_training<tiny8_cohere_plus, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2);
  check_training<tiny8_apertus, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, false>(2);
  check_training<tiny8_apertus, layout{.tp = 2, .pp = 2}, true>(2);
}

TEST_CASE("qwen3 at tp 4 with kv replication, olmo2 and Command R+ with their q/k norms over 4 ranks, train like one process", "[world4][training][families]") {
  check_training<tiny8_qwen3, layout{.tp = 4, .sp = true}, true>(2);
  check_training<tiny8_olmo2, layout{.tp = 4, .sp = true}, true>(2);  // q/k norms over 4 ranks
  check_training<tiny8_cohere_plus, layout{.tp = 4, .sp = true, .rmpad = true}, false>(2);  // 2 kv heads' k weights over 4 ranks
}

TEST_CASE("dynamic batching (dp balanced by Karmarkar-Karp, a token budget) trains like one process", "[world4][pipeline][training]") {
  // The rollout's rows hold 3..12 tokens; a budget of 20 forces several uneven micro-batches.
  const micro_batch_options budget{.max_token_len = 20};
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const at::Tensor lengths = rb.attention_mask.sum(1);
  const std::vector<std::int64_t> seqlens(lengths.data_ptr<std::int64_t>(), lengths.data_ptr<std::int64_t>() + lengths.numel());
  const micro_batches mbs = rearrange_micro_batches(seqlens, budget);
  CHECK(mbs.size() > 2);
  for (std::int64_t t : mbs.tokens) CHECK(t <= 20);
  check_training<tiny8, layout{.tp = 2, .pp = 2}, true>(0, &budget);
  check_training<tiny8_tied, layout{.pp = 2}, false>(0, &budget);  // dp 2
}

template <layout L>
void check_pipelined_inference() {
  INFO("tp=" << L.tp.get() << " pp=" << L.pp.get() << " vpp=" << L.vpp.get() << " sp=" << L.sp.get()
             << " rmpad=" << L.rmpad.get());
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<tiny8, L>> model(groups, model_options{.test_init = true});
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const model_output whole = model.forward({.input_ids = rb.input_ids, .attention_mask = rb.attention_mask});
  std::vector<batch> micro;
  for (std::int64_t i = 0; i < 4; ++i) {
    const rollout_batch mb = slice_rows(rb, 2 * i, 2 * i + 2);
    micro.push_back({.input_ids = mb.input_ids, .attention_mask = mb.attention_mask});
  }
  const std::vector<model_output> parts = model.forward(micro);
  REQUIRE(parts.size() == 4);
  std::vector<at::Tensor> lp, ent;
  for (const model_output& p : parts) {
    lp.push_back(p.log_probs);
    ent.push_back(p.entropy);
  }
  CHECK(max_abs_diff(whole.log_probs, at::cat(lp, 0)) <= 1e-6);
  CHECK(max_abs_diff(whole.entropy, at::cat(ent, 0)) <= 1e-6);
}

TEST_CASE("micro-batches pipelined over the stages in inference give the whole batch's outputs", "[world4][pipeline]") {
  check_pipelined_inference<layout{.pp = 4}>();
  check_pipelined_inference<layout{.pp = 2, .vpp = 2}>();
  check_pipelined_inference<layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}>();
}

TEST_CASE("log-probs do not depend on how the batch is split into micro-batches", "[world4][pipeline]") {
  auto single = parallel_groups::single();
  const model_options opt{.test_init = true};
  parallel_model<causal_lm<tiny8, layout{.rmpad = true}>> model(single, opt);
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const model_output whole = model.forward({.input_ids = rb.input_ids, .attention_mask = rb.attention_mask});
  for (std::int64_t parts : {2, 4, 8}) {
    std::vector<at::Tensor> pieces;
    for (std::int64_t i = 0; i < parts; ++i) {
      const rollout_batch mb = slice_rows(rb, i * 8 / parts, (i + 1) * 8 / parts);
      pieces.push_back(model.forward({.input_ids = mb.input_ids, .attention_mask = mb.attention_mask}).log_probs);
    }
    INFO(parts << " micro-batches");
    CHECK(max_abs_diff(whole.log_probs, at::cat(pieces, 0)) <= 1e-6);
  }
}

}  // namespace megadsl::test
