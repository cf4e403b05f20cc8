// Context parallelism: each cp rank runs 1/cp of the stream's tokens, attention all-to-alls over
// heads (Ulysses). Every cp layout (alone, with tp and sp, with pp, with dp, padded and
// remove-padding, sequences of very different lengths and ones shorter than 2 cp tp) gives the
// single-process log-probs, entropy, values and gradients within 1e-5, and trains like it.
#include "../catch_torch.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <string>

#include "layout_checks.hpp"
#include "megadsl/formulas.hpp"

namespace megadsl::test {
namespace {

constexpr double tol = 1e-5;

// Rows of 37, 2 and 19 tokens in 37 positions: longer than a cp share, and shorter than 2 cp tp.
padded_batch uneven_batch(std::int64_t vocab, bool left_padding) {
  const std::int64_t b = 3, s = 37;
  const std::int64_t lengths[b] = {37, 2, 19};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor ids = at::randint(0, vocab, {b, s}, gen, at::kLong);
  at::Tensor mask = at::zeros({b, s}, at::kLong);
  for (std::int64_t r = 0; r < b; ++r) mask[r].narrow(0, left_padding ? s - lengths[r] : 0, lengths[r]).fill_(1);
  return {ids.masked_fill(mask == 0, vocab - 1), mask};
}

// Rows of 16, 8 and 24 tokens (48: a multiple of every tp x cp here, and of 2 cp chunks per row:
// no stream padding, every rank's share its own 48 / cp tokens), for the traffic counts.
batch packed_16_8_24(std::int64_t vocab) {
  const std::int64_t lengths[] = {16, 8, 24}, b = 3, s = 24;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor ids = at::randint(0, vocab, {b, s}, gen, at::kLong);
  at::Tensor mask = at::zeros({b, s}, at::kLong);
  for (std::int64_t r = 0; r < b; ++r) mask[r].narrow(0, 0, lengths[r]).fill_(1);
  return {.input_ids = ids, .attention_mask = mask};
}

// Outputs and every parameter's gradient (gathered to HF shape) equal one process's.
template <class M, layout L, bool Actor>
void check_gradients(const padded_batch& pb) {
  using spec = std::conditional_t<Actor, causal_lm<M, L>, value_model<M, L>>;
  using ref_spec = std::conditional_t<Actor, causal_lm<M>, value_model<M>>;
  INFO(M::name << (Actor ? " actor" : " critic") << " tp=" << L.tp.get() << " cp=" << L.cp.get() << " sp=" << L.sp.get()
               << " rmpad=" << L.rmpad.get() << " batch " << pb.ids.size(0) << "x" << pb.ids.size(1));
  const model_options opt = test_options<M>();
  auto single = parallel_groups::single();
  parallel_model<ref_spec> ref(single, opt);
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<spec> model(groups, opt);
  const batch b{.input_ids = pb.ids, .attention_mask = pb.mask};
  const model_output r = ref.forward(b), o = model.forward(b);
  if constexpr (Actor) {
    CHECK(max_abs_diff(r.log_probs, o.log_probs) <= tol);
    CHECK(max_abs_diff(r.entropy, o.entropy) <= tol);
    CHECK(at::equal(r.valid, o.valid));
  } else {
    CHECK(max_abs_diff(r.values, o.values) <= tol);
  }
  probe_loss(r, Actor).backward();
  // Every cp rank computes the whole loss from the gathered outputs; each dp replica takes 1/dp.
  (probe_loss(o, Actor) / static_cast<double>(groups.grid.dp)).backward();
  model.finalize_grads();
  const auto want = gather_hf_tensors(ref.parameters(), ref.config(), nullptr, true);
  const auto got = gather_hf_tensors(model.parameters(), model.config(), groups.tp.get(), true);
  REQUIRE(want.size() == got.size());
  for (const auto& [name, g] : want) {
    INFO("gradient of " << name);
    REQUIRE(got.count(name) == 1);
    CHECK(max_abs_diff(g, got.at(name)) <= tol * std::max(1.0, g.abs().max().template item<double>()));
  }
}

// What goes over cp in one forward + backward, against plan's count (formulas.hpp
// cp_all_to_all_bytes, each block's module_node::cp_sent) for the rank's own tokens: rows of 16, 8
// and 24 tokens packed (48, a multiple of every tp x cp here: no stream padding), in fp32. Beside
// the token mixers' traffic, the head gathers each per-token output it returns (log-probs, entropy)
// over cp: cp - 1 shares of the rank's rows of fp32 each, its backward keeping the rank's own rows.
// Where every token mixer moves all by all-to-all (kv groups that split over cp, DeltaNet layers),
// the all-to-alls alone send plan's count; where k and v (or MLA's rotary key) are gathered whole,
// the all-to-alls send less and the gathers the rest.
template <class M, layout L>
void check_cp_bytes(bool mixers_gather) {
  INFO(M::name << " tp=" << L.tp.get() << " cp=" << L.cp.get() << " sp=" << L.sp.get());
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<causal_lm<M, L>> model(groups, test_options<M>());
  const std::int64_t cp = L.cp.get(), own = (16 + 8 + 24) / cp;
  global_comm_stats().reset();
  const model_output o = model.forward(packed_16_8_24(M::shape.vocab.get()));
  probe_loss(o, true).backward();
  const double to_all = static_cast<double>(global_comm_stats().all_to_all_bytes.load());
  const double over_cp = static_cast<double>(global_comm_stats().cp_bytes.load());
  const double head = static_cast<double>((cp - 1) * own * 4 * (o.entropy.defined() ? 2 : 1));
  // Under a2a+ring both: all-to-alls within the a2a groups, blocks around the rings.
  const double a2a = cp_all_to_all_bytes(M::shape, L, own, 4), planned = cp_ring_bytes(M::shape, L, own, 4) + a2a;
  INFO("sent over cp " << over_cp << " B (by all-to-all " << to_all << " B, the head's gathers " << head
                       << " B), planned " << planned << " B (by all-to-all " << a2a << " B)");
  CHECK(planned > 0);
  CHECK(over_cp - head == planned);
  if (mixers_gather) CHECK(to_all < a2a);
  else CHECK(to_all == a2a);
}

template <class M, layout L>
void check_both_heads() {
  for (bool left : {true, false}) {
    check_gradients<M, L, true>(make_batch(M::shape.vocab, left));
    check_gradients<M, L, true>(uneven_batch(M::shape.vocab, left));
    check_gradients<M, L, false>(uneven_batch(M::shape.vocab, !left));
  }
}

}  // namespace

TEST_CASE("context parallelism: cp 2 and cp 4, alone, with tp 2 and sp, with dp, padded and packed, equal one process",
          "[world4][cp]") {
  check_both_heads<tiny8, layout{.cp = 2}>();                    // dp 2 x cp 2: gradients summed over both
  check_both_heads<tiny8, layout{.rmpad = true, .cp = 2}>();
  check_both_heads<tiny8_olmo2, layout{.cp = 4}>();              // full-width q/k norms before the all-to-all
  check_both_heads<tiny8_olmo2, layout{.rmpad = true, .cp = 4}>();
  check_both_heads<tiny8_olmo2, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}>();
  check_both_heads<tiny8_olmo2, layout{.tp = 2, .cp = 2}>();
  check_both_heads<tiny8_gemma2, layout{.rmpad = true, .cp = 2}>();  // a window of 5 across the cp shares
  check_both_heads<tiny8_qwen3, layout{.cp = 2}>();                  // per-head q/k norms
  check_both_heads<tiny8_neox, layout{.rmpad = true, .cp = 4}>();    // interleaved q/k/v, parallel residual
}

TEST_CASE("context parallelism: what goes over cp is what plan counts", "[world4][cp]") {
  check_cp_bytes<tiny8, layout{.rmpad = true, .cp = 2}>(false);
  check_cp_bytes<tiny8_olmo2, layout{.rmpad = true, .cp = 4}>(false);
  check_cp_bytes<tiny8_olmo2, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}>(false);
  check_cp_bytes<tiny8_qwen3_next, layout{.rmpad = true, .cp = 2}>(false);  // gated DeltaNet layers, gated attention
  check_cp_bytes<tiny8, layout{.rmpad = true, .cp = 4}>(true);                // 2 kv groups over 4 ranks: k, v gathered
  check_cp_bytes<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}>(true);  // 1 group per tp rank
  check_cp_bytes<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 2}>(true);    // MLA: the rotary key gathered
}

TEST_CASE("context parallelism with fewer kv groups than cp ranks: shares of one group's query heads, its k and v "
          "gathered", "[world4][cp]") {
  check_both_heads<tiny8, layout{.rmpad = true, .cp = 4}>();                           // 2 groups of 2 heads over 4 ranks
  check_both_heads<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}>();      // 1 group of 2 heads per tp rank
  check_both_heads<tiny8_qwen3, layout{.tp = 2, .cp = 2}>();                           // per-head q/k norms first
  check_training<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}, true>(2);
}

TEST_CASE("context parallelism with pipeline stages: inference and PPO training equal one process",
          "[world4][cp][pipeline]") {
  check_inference<tiny8_olmo2, layout{.pp = 2, .rmpad = true, .cp = 2}, true>(true);
  check_inference<tiny8, layout{.pp = 2, .cp = 2}, false>(false);
  check_training<tiny8, layout{.pp = 2, .rmpad = true, .cp = 2}, true>(2);
}

TEST_CASE("five PPO steps at cp 2 (with dp 2, with tp 2 and sp) equal one process, the distributed optimizer over dp x cp",
          "[world4][cp][training]") {
  check_training<tiny8, layout{.rmpad = true, .cp = 2}, true>(2);
  check_training<tiny8, layout{.cp = 2}, false>(1);
  check_training<tiny8_olmo2, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}, true>(2);
  check_training<tiny8_gemma2, layout{.cp = 2}, true>(2);
}

// Ring context parallelism (cp_comm ring): each cp rank holds chunks i and 2 cp - 1 - i of every
// sequence and keeps every head; k/v blocks go around the ring. The batches above include a row
// of 2 tokens, shorter than 2 cp chunks, and rows of very different lengths, padded and packed.
constexpr auto ring = cp_comm_kind::ring;

TEST_CASE("ring context parallelism: cp 2 and 4, alone, with tp 2 and sp, padded and packed, windows and soft-caps, "
          "equal one process", "[world4][cp][ring]") {
  check_both_heads<tiny8, layout{.cp = 2, .cp_comm = ring}>();                  // dp 2 x cp 2
  check_both_heads<tiny8, layout{.rmpad = true, .cp = 4, .cp_comm = ring}>();   // 2 kv groups, 4 ranks: no gather
  check_both_heads<tiny8_olmo2, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2, .cp_comm = ring}>();
  check_both_heads<tiny8_gemma2, layout{.rmpad = true, .cp = 2, .cp_comm = ring}>();  // a window of 5, the soft-cap
  check_both_heads<tiny8_qwen3, layout{.tp = 2, .cp = 2, .cp_comm = ring}>();        // per-head q/k norms
  check_both_heads<tiny8_neox, layout{.rmpad = true, .cp = 4, .cp_comm = ring}>();   // interleaved q/k/v, partial rotary
}

TEST_CASE("ring context parallelism with pipeline stages, a mixture's experts over ep and HunYuan's q/k norms after "
          "RoPE: inference and training equal one process", "[world4][cp][ring][training]") {
  check_inference<tiny8_olmo2, layout{.pp = 2, .rmpad = true, .cp = 2, .cp_comm = ring}, true>(true);
  check_training<tiny8, layout{.pp = 2, .rmpad = true, .cp = 2, .cp_comm = ring}, true>(2);
  check_training<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2, .cp_comm = ring}, true>(2);
  check_training<tiny8_gemma2, layout{.cp = 2, .cp_comm = ring}, true>(2);
}

// Under the ring (check_cp_bytes with cp_comm ring) the k/v blocks around the ring are plan's
// cp_ring_bytes, beside the head's gathers, and nothing goes by all-to-all.
TEST_CASE("ring context parallelism: what goes around the ring is what plan counts", "[world4][cp][ring]") {
  check_cp_bytes<tiny8, layout{.rmpad = true, .cp = 2, .cp_comm = ring}>(false);
  check_cp_bytes<tiny8, layout{.rmpad = true, .cp = 4, .cp_comm = ring}>(false);
  check_cp_bytes<tiny8_olmo2, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2, .cp_comm = ring}>(false);
  check_cp_bytes<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 2, .cp_comm = ring}>(false);  // MLA: k and v at their widths
}

// Hierarchical cp (cp_comm a2a+ring, Megatron's a2a+p2p): cp 4 as all-to-all groups of 2 ranks
// (each then holds its group's rows of half the heads) around rings of 2 (the load-balanced split
// over all 4). tiny8's 2 kv groups go whole by the all-to-all; at tp 2 (below) each tp rank's one
// group is shared, its k and v gathered within the all-to-all group.
constexpr auto a2a_ring = cp_comm_kind::a2a_ring;

TEST_CASE("hierarchical context parallelism, cp 4 as two pairs around rings of 2: padded and packed, windows, soft caps "
          "and qk norms equal one process and train like it",
          "[world4][cp][ring][hierarchical]") {
  check_both_heads<tiny8, layout{.cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>();
  check_both_heads<tiny8_gemma2, layout{.rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>();
  check_gradients<tiny8_qwen3, layout{.rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}, true>(uneven_batch(500, true));
  check_gradients<tiny8_neox, layout{.cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}, true>(uneven_batch(500, false));
  check_training<tiny8, layout{.rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}, true>(2);
  check_training<tiny8_olmo2, layout{.cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}, false>(2);
}

TEST_CASE("hierarchical context parallelism sends what plan counts, by all to all and around the ring",
          "[world4][cp][ring][hierarchical]") {
  check_cp_bytes<tiny8, layout{.rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>(false);
  check_cp_bytes<tiny8_deepseek_v3, layout{.rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>(true);  // MLA: rotary key gathered
}

TEST_CASE("hierarchical context parallelism at tp 2 x cp 4 with sp (one kv group shared) and at pp 2 x cp 4 equals "
          "one process and trains like it",
          "[world8][cp][ring][hierarchical]") {
  REQUIRE(dist().world() == 8);
  check_gradients<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}, true>(
      uneven_batch(500, false));
  check_training<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}, true>(1);
  check_training<tiny8_olmo2, layout{.pp = 2, .rmpad = true, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}, true>(2);
}

// 6 query heads: at tp 2 a rank's 3 do not split over cp 4 (Ulysses refuses: cp_splits_heads);
// the ring keeps every head on every cp rank.
struct tiny8_six_heads : llama<shape{.hidden = 96, .layers = 4, .heads = 6, .kv_heads = 2, .ffn = 160, .vocab = 500,
                                     .max_positions = 256}> {
  static constexpr std::string_view name = "tiny8-six-heads";
};
static_assert(violates<tiny8_six_heads, layout{.tp = 2, .cp = 4}>("cp_splits_heads"));
static_assert(valid_layout<tiny8_six_heads, layout{.tp = 2, .cp = 4, .cp_comm = ring}>);

TEST_CASE("ring context parallelism runs a layout Ulysses refuses for its heads: 6 query heads at tp 2 x cp 4",
          "[world8][cp][ring]") {
  REQUIRE(dist().world() == 8);
  check_gradients<tiny8_six_heads, layout{.tp = 2, .cp = 4, .cp_comm = ring}, true>(uneven_batch(500, true));
  check_gradients<tiny8_six_heads, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 4, .cp_comm = ring}, true>(
      uneven_batch(500, false));
  check_training<tiny8_six_heads, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 4, .cp_comm = ring}, true>(1);
}

TEST_CASE("five PPO steps at tp 2 x cp 2 x pp 2 with sp and remove-padding equal one process", "[world8][cp][training]") {
  REQUIRE(dist().world() == 8);
  check_training<tiny8_olmo2, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true, .cp = 2}, true>(2);
  check_training<tiny8_olmo2, layout{.tp = 2, .pp = 2, .cp = 2}, false>(2);
}

}  // namespace megadsl::test
