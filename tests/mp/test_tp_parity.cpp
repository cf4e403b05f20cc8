// Every tensor/sequence-parallel layout of the tiny GQA model equals the single-process model:
// log-probs, entropy, values and the gradient of every parameter (gathered to HF shape), fp32,
// within 1e-5; left- and right-padded batches, a single-token row, padded and remove-padding.
#include "../catch_torch.hpp"

#include <utility>

#include "megadsl/formulas.hpp"
#include "megadsl/parallel/comm.hpp"
#include "mp_support.hpp"

namespace megadsl::test {
namespace {

constexpr double tol = 1e-5;

// tp in {1, 2, 4} x sp in {off, on} x rmpad in {off, on}; sp needs tp > 1 (rule sp_needs_tp).
constexpr layout layouts[] = {
    {.tp = 1},
    {.tp = 1, .rmpad = true},
    {.tp = 2},
    {.tp = 2, .sp = true},
    {.tp = 2, .rmpad = true},
    {.tp = 2, .sp = true, .rmpad = true},
    {.tp = 4},
    {.tp = 4, .sp = true},
    {.tp = 4, .rmpad = true},
    {.tp = 4, .sp = true, .rmpad = true},
};

std::string describe(const layout& l) {
  return "tp=" + std::to_string(l.tp.get()) + " sp=" + std::to_string(l.sp.get()) +
         " rmpad=" + std::to_string(l.rmpad.get());
}

void require_close(const std::map<std::string, at::Tensor>& ref, const std::map<std::string, at::Tensor>& got) {
  REQUIRE(ref.size() == got.size());
  for (const auto& [name, r] : ref) {
    INFO("gradient of " << name);
    REQUIRE(got.count(name) == 1);
    REQUIRE(got.at(name).sizes() == r.sizes());
    const double scale = std::max(1.0, r.abs().max().item<double>());
    CHECK(max_abs_diff(r, got.at(name)) <= tol * scale);
  }
}

template <class M, layout L, bool Actor>
void check_against_reference(bool left_padding) {
  using spec = std::conditional_t<Actor, causal_lm<M, L>, value_model<M, L>>;
  using ref_spec = std::conditional_t<Actor, causal_lm<M>, value_model<M>>;
  INFO(M::name << (Actor ? " actor " : " critic ") << describe(L) << (left_padding ? " left-padded" : " right-padded"));
  const model_options opt{.test_init = true};
  auto single = parallel_groups::single();
  parallel_model<ref_spec> ref(single, opt);
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<spec> model(groups, opt);

  const padded_batch pb = make_batch(M::shape.vocab, left_padding);
  const model_output r = ref.forward({.input_ids = pb.ids, .attention_mask = pb.mask});
  const model_output o = model.forward({.input_ids = pb.ids, .attention_mask = pb.mask});
  if constexpr (Actor) {
    CHECK(max_abs_diff(r.log_probs, o.log_probs) <= tol);
    CHECK(max_abs_diff(r.entropy, o.entropy) <= tol);
    CHECK(at::equal(r.valid, o.valid));
    CHECK(r.log_probs.masked_select(r.valid.logical_not()).abs().sum().item<double>() == 0.0);
  } else {
    CHECK(max_abs_diff(r.values, o.values) <= tol);
  }
  probe_loss(r, Actor).backward();
  // Every dp replica saw the whole batch: each takes 1/dp of the loss, as the dp sum expects.
  (probe_loss(o, Actor) / static_cast<double>(groups.grid.dp)).backward();
  model.finalize_grads();
  const auto ref_grads = gather_hf_tensors(ref.parameters(), ref.config(), nullptr, true);
  const auto got_grads = gather_hf_tensors(model.parameters(), model.config(), groups.tp.get(), true);
  require_close(ref_grads, got_grads);
}

template <class M, std::size_t... I>
void every_layout(std::index_sequence<I...>) {
  for (bool left : {true, false}) {
    (check_against_reference<M, layouts[I], true>(left), ...);
    (check_against_reference<M, layouts[I], false>(left), ...);
  }
}

}  // namespace

TEST_CASE("every tp x sp x rmpad layout equals the single-process model, GQA with kv replication", "[world4][parity]") {
  REQUIRE(dist().world() == 4);
  every_layout<tiny_llama>(std::make_index_sequence<std::size(layouts)>());
}

TEST_CASE("tied embeddings and qkv bias (Qwen2-style) under tp and sp", "[world4][parity]") {
  for (bool left : {true, false}) {
    check_against_reference<tiny_qwen, layout{.tp = 2, .sp = true, .rmpad = true}, true>(left);
    check_against_reference<tiny_qwen, layout{.tp = 4, .sp = true}, true>(left);
    check_against_reference<tiny_qwen, layout{.tp = 4, .rmpad = true}, false>(left);
  }
}

TEST_CASE("llama3 rope scaling under tp", "[world4][parity]") {
  check_against_reference<tiny_llama3, layout{.tp = 4, .sp = true, .rmpad = true}, true>(true);
}

TEST_CASE("padded and remove-padding paths agree within 1e-6", "[world4][parity]") {
  auto single = parallel_groups::single();
  const model_options opt{.test_init = true};
  parallel_model<causal_lm<tiny_llama>> padded(single, opt);
  parallel_model<causal_lm<tiny_llama, layout{.rmpad = true}>> packed(single, opt);
  parallel_model<value_model<tiny_llama>> padded_critic(single, opt);
  parallel_model<value_model<tiny_llama, layout{.rmpad = true}>> packed_critic(single, opt);
  for (bool left : {true, false}) {
    INFO((left ? "left" : "right") << "-padded");
    const padded_batch pb = make_batch(tiny_llama::shape.vocab, left);
    const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
    const auto a = padded.forward(b), c = packed.forward(b);
    CHECK(max_abs_diff(a.log_probs, c.log_probs) <= 1e-6);
    CHECK(max_abs_diff(a.entropy, c.entropy) <= 1e-6);
    CHECK(max_abs_diff(padded_critic.forward(b).values, packed_critic.forward(b).values) <= 1e-6);
  }
}

TEST_CASE("a static tp = 1 model issues no collective; a tp = 2 model does", "[world4][collectives]") {
  static_assert(!parallel_model<causal_lm<tiny_llama>>::tensor_parallel);
  static_assert(parallel_model<causal_lm<tiny_llama, layout{.tp = 2}>>::tensor_parallel);
  auto single = parallel_groups::single();
  parallel_model<causal_lm<tiny_llama>> alone(single);
  auto groups = parallel_groups::build(dist(), layout{.tp = 2});
  parallel_model<causal_lm<tiny_llama, layout{.tp = 2, .sp = true}>> sharded(groups);
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, true);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};

  global_comm_stats().reset();
  probe_loss(alone.forward(b), true).backward();
  CHECK(global_comm_stats().calls == 0);

  global_comm_stats().reset();
  probe_loss(sharded.forward(b), true).backward();
  CHECK(global_comm_stats().calls > 0);
}

// The bytes each rank sends through the collectives of one forward + backward + finalize equal
// the analytical ring count (formulas.hpp), with Gloo's real reduce-scatter and all-gather; and
// SP sends exactly what the all-reduces without it send.
template <layout L>
double measured_step_bytes(const batch& b) {
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<tiny_llama, L>> model(groups);
  global_comm_stats().reset();
  model.forward(b).log_probs.sum().backward();
  model.finalize_grads();
  return static_cast<double>(global_comm_stats().bytes.load());
}

TEST_CASE("bytes per step equal the analytical ring count, with and without SP", "[world4][collectives]") {
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, true);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const std::int64_t positions = pb.ids.numel(), tokens = pb.mask.sum().item<std::int64_t>();
  const std::int64_t dp = dist().world() / 2;
  const auto sp_stream = (tokens + 1) / 2 * 2;
  const double padded = measured_step_bytes<layout{.tp = 2}>(b);
  const double rmpad = measured_step_bytes<layout{.tp = 2, .rmpad = true}>(b);
  const double sp = measured_step_bytes<layout{.tp = 2, .sp = true, .rmpad = true}>(b);
  // (the padded layout's LM head and log-probs run on its real tokens alone)
  CHECK(padded == actor_step_comm_bytes(tiny_llama::shape, layout{.tp = 2}, positions, tokens, dp));
  CHECK(rmpad == actor_step_comm_bytes(tiny_llama::shape, layout{.tp = 2, .rmpad = true}, tokens, tokens, dp));
  CHECK(sp == actor_step_comm_bytes(tiny_llama::shape, layout{.tp = 2, .sp = true, .rmpad = true}, sp_stream,
                                    tokens, dp));
  // SP's gathers and scatters move the activations' bytes of the all-reduces they replace (for
  // the same stream, padded to tp); the difference is the norms' gradient sums.
  const double norms = ring_all_reduce_bytes((2.0 * tiny_llama::shape.layers.get() + 1) * tiny_llama::shape.hidden.get() * 4, 2);
  CHECK(sp - norms == actor_step_comm_bytes(tiny_llama::shape, layout{.tp = 2, .rmpad = true}, sp_stream, tokens, dp));
  if (sp_stream == tokens) CHECK(sp - norms == rmpad);
}

TEST_CASE("a layout that does not fit the world is refused with the rule's words", "[world4]") {
  REQUIRE_THROWS_WITH(parallel_groups::build(dist(), layout{.tp = 3}),
                      Catch::Contains("world_fits_layout: world size 4 is not divisible by tp * pp * cp = 3"));
}

namespace {
// The LM head chunked over the tokens in training (forward_options::head_chunk_tokens) against the
// whole head, in the same layout: log-probs, entropy and every gradient within 1e-6.
template <layout L>
void chunked_head_equals_whole(std::int64_t chunk, bool left_padding, double temperature) {
  INFO(describe(L) << " chunk " << chunk << (left_padding ? " left-padded" : " right-padded") << " temperature " << temperature);
  const model_options opt{.test_init = true};
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<tiny_llama, L>> whole(groups, opt), chunked(groups, opt);
  const padded_batch pb = make_batch(tiny_llama::shape.vocab, left_padding);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output w = whole.forward(b, {.temperature = temperature, .head_chunk_tokens = -1});
  const model_output c = chunked.forward(b, {.temperature = temperature, .head_chunk_tokens = chunk});
  CHECK(max_abs_diff(w.log_probs, c.log_probs) <= 1e-6);
  CHECK(max_abs_diff(w.entropy, c.entropy) <= 1e-6);
  probe_loss(w, true).backward();
  probe_loss(c, true).backward();
  whole.finalize_grads();
  chunked.finalize_grads();
  const auto wg = gather_hf_tensors(whole.parameters(), whole.config(), groups.tp.get(), true);
  const auto cg = gather_hf_tensors(chunked.parameters(), chunked.config(), groups.tp.get(), true);
  REQUIRE(wg.size() == cg.size());
  for (const auto& [name, g] : wg) {
    INFO("gradient of " << name);
    CHECK(max_abs_diff(g, cg.at(name)) <= 1e-6 * std::max(1.0, g.abs().max().template item<double>()));
  }
}
}  // namespace

TEST_CASE("the LM head chunked over the tokens in training equals the whole head: tp, sp, padded and packed",
          "[world4][parity]") {
  for (const bool left : {true, false}) {
    chunked_head_equals_whole<layout{.tp = 1}>(5, left, 1.0);
    chunked_head_equals_whole<layout{.tp = 2, .sp = true, .rmpad = true}>(3, left, 0.7);
    chunked_head_equals_whole<layout{.tp = 4}>(1, left, 1.0);
    chunked_head_equals_whole<layout{.tp = 4, .sp = true}>(7, left, 1.3);
  }
}

}  // namespace megadsl::test
