// Dropout (megadsl/dropout.hpp, layers/dropout.hpp): a checkpoint's rates are read and written
// back, forward passes apply none (they equal transformers' eval mode), training steps apply them
// with the same masks in every layout, and the masks keep 1 - p of the elements.
#include "layout_checks.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

#include "megadsl/hf_config.hpp"
#include "megadsl/layers/dropout.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/io/safetensors.hpp"

namespace megadsl::test {
namespace {

namespace fs = std::filesystem;
const fs::path fixtures = MEGADSL_FIXTURES;

constexpr dropout_rates everywhere{.attention = 0.1, .residual = 0.1, .embedding = 0.1};

TEST_CASE("a dropout mask keeps 1 - p of the elements, scaled by 1 / (1 - p), independently of rows, columns and "
          "heads",
          "[world4][dropout]") {
  const at::Tensor keys = at::bitwise_and(at::arange(4096, at::kLong) * 2654435761LL, 0xFFFFFFFFLL);  // distinct keys
  for (const double p : {0.01, 0.1, 0.3, 0.5, 0.9}) {
    INFO("p = " << p);
    const at::Tensor k = dropout_keep(keys, 256, p, 42, at::kFloat);  // (4096, 256)
    const double n = static_cast<double>(k.numel()), sigma = std::sqrt(p * (1 - p) / n);
    const double kept = k.ne(0).to(at::kDouble).mean().item<double>();
    CHECK(std::abs(kept - (1 - p)) <= 5 * sigma);
    CHECK(at::equal(k.ne(0), k.eq(static_cast<float>(1.0 / (1.0 - p)))));  // kept ones scaled, the rest 0
    // Every column's and every row's share near 1 - p (no column or row drops more than chance).
    const double col_sigma = std::sqrt(p * (1 - p) / 4096.0), row_sigma = std::sqrt(p * (1 - p) / 256.0);
    CHECK((k.ne(0).to(at::kDouble).mean(0) - (1 - p)).abs().max().item<double>() <= 6 * col_sigma);
    CHECK((k.ne(0).to(at::kDouble).mean(1) - (1 - p)).abs().max().item<double>() <= 6 * row_sigma);
    // Another salt: another mask, as independent as chance (two masks agree on p^2 + (1-p)^2).
    const at::Tensor other = dropout_keep(keys, 256, p, 43, at::kFloat);
    const double agree = k.ne(0).eq(other.ne(0)).to(at::kDouble).mean().item<double>();
    CHECK(std::abs(agree - (p * p + (1 - p) * (1 - p))) <= 10 * sigma);
    CHECK(at::equal(k, dropout_keep(keys, 256, p, 42, at::kFloat)));  // a function of its inputs
  }
  // The attention probabilities' masks: per head, query and key position.
  const attention_dropout d{.p = 0.25, .salt = 7, .first_head = 3};
  const at::Tensor q = keys.narrow(0, 0, 256).view({2, 128});
  const at::Tensor pos = at::arange(128, at::kLong).repeat({2, 1});
  const at::Tensor a = attention_keep(q, pos, 4, d);  // (2, 4, 128, 128)
  REQUIRE(a.sizes().vec() == std::vector<std::int64_t>{2, 4, 128, 128});
  const double sigma = std::sqrt(0.25 * 0.75 / static_cast<double>(a.numel()));
  CHECK(std::abs(a.ne(0).to(at::kDouble).mean().item<double>() - 0.75) <= 5 * sigma);
  CHECK((a.ne(0).to(at::kDouble).mean({0, 2, 3}) - 0.75).abs().max().item<double>() <= 0.01);  // each head
  // A head's mask depends on its global number only: heads 4.. of this call are heads 1.. of one from head 3.
  attention_dropout later = d;
  later.first_head = 4;
  CHECK(at::equal(a.narrow(1, 1, 3), attention_keep(q, pos, 3, later)));
}

// A tiny Llama built twice from one seed, with and without dropout: forward passes equal bit for
// bit, training steps differ, and a step is a function of the seed and the step's number.
TEST_CASE("dropout applies in training steps only: log-probs and values are the model's without it", "[world4][dropout]") {
  auto single = parallel_groups::single();
  model_options with = test_options<tiny8>(), without = test_options<tiny8>();
  with.dropout = everywhere;
  parallel_model<causal_lm<tiny8>> a(single, with), b(single, without), again(single, with);
  parallel_model<value_model<tiny8>> va(single, with), vb(single, without);
  const rollout_batch rb = make_rollout(tiny8::shape.vocab);
  const batch in{.input_ids = rb.input_ids, .attention_mask = rb.attention_mask};
  CHECK(at::equal(a.forward(in).log_probs, b.forward(in).log_probs));
  CHECK(at::equal(a.forward(in).entropy, b.forward(in).entropy));
  CHECK(at::equal(va.forward(in).values, vb.forward(in).values));
  const loss_function mean_log_prob = [&](const model_output& o, std::int64_t) {
    return (o.log_probs * rb.loss_mask).sum() / rb.loss_mask.sum();
  };
  const double dropped = a.forward_backward({in}, mean_log_prob), plain = b.forward_backward({in}, mean_log_prob);
  INFO("loss with dropout " << dropped << ", without " << plain);
  CHECK(std::abs(dropped - plain) > 1e-4);
  CHECK(again.forward_backward({in}, mean_log_prob) == dropped);     // the same seed and step: the same masks
  CHECK(std::abs(a.forward_backward({in}, mean_log_prob) - dropped) > 1e-6);  // the next step: new masks
  // Each place alone changes the numbers: attention, residual, embedding.
  for (const dropout_rates one : {dropout_rates{.attention = 0.3}, dropout_rates{.residual = 0.3}, dropout_rates{.embedding = 0.3}}) {
    model_options o = test_options<tiny8>();
    o.dropout = one;
    parallel_model<causal_lm<tiny8>> m(single, o);
    INFO(describe(one));
    CHECK(std::abs(m.forward_backward({in}, mean_log_prob) - plain) > 1e-5);
  }
}

TEST_CASE("training with dropout equals one process in every layout: tp, sp, pp, vpp, cp, dp, recompute, padded and "
          "packed",
          "[world4][dropout][training]") {
  REQUIRE(dist().world() == 4);
  check_training<tiny8, layout{.tp = 2, .sp = true, .rmpad = true}, true>(2, nullptr, everywhere);  // dp 2
  check_training<tiny8, layout{.tp = 2, .pp = 2}, false>(2, nullptr, everywhere);
  check_training<tiny8, layout{.pp = 2, .vpp = 2, .rmpad = true}, true>(4, nullptr, everywhere);
  check_training<tiny8, layout{.tp = 2, .sp = true, .rmpad = true, .cp = 2}, true>(2, nullptr, everywhere);
  check_training<tiny8, layout{.tp = 2, .pp = 2, .recompute = recompute_kind::full}, true>(2, nullptr, everywhere);
  check_training<tiny8, layout{.tp = 4, .recompute = recompute_kind::selective}, true>(1, nullptr, everywhere);
  check_training<tiny8_neox, layout{.tp = 2, .pp = 2, .sp = true, .rmpad = true}, true>(2, nullptr, everywhere);  // parallel residual
  check_training<tiny8_cohere, layout{.tp = 2, .rmpad = true, .cp = 2}, true>(2, nullptr, everywhere);  // one norm, side by side
}

// A fixture's config.json with `edit` applied, beside its weights and transformers' outputs: one
// directory for the job (its launcher's port names it), written by rank 0.
fs::path with_config(const std::string& name, const std::function<void(nlohmann::json&)>& edit, const comm_group& world) {
  const char* port = std::getenv("MASTER_PORT");
  const fs::path d = fs::temp_directory_path() / ("megadsl-test-" + std::string(port ? port : "0") + "-dropout-" + name);
  if (world.rank() == 0) {
    fs::remove_all(d);
    fs::remove_all(d.string() + "-saved");
    fs::create_directories(d);
    std::ifstream in(fixtures / name / "config.json");
    nlohmann::json j = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
    edit(j);
    std::ofstream(d / "config.json") << j.dump(2);
    for (const char* f : {"model.safetensors", "reference.safetensors"}) fs::copy_file(fixtures / name / f, d / f);
  }
  world.barrier();
  return d;
}

struct dropout_fixture {
  std::string name;
  std::function<void(nlohmann::json&)> edit;
  dropout_rates want;
};

TEST_CASE("a checkpoint's dropout is read from its family's keys, its forward equals transformers' eval mode, "
          "load_hf holds the model to it and save_hf writes it back",
          "[world4][dropout][hf]") {
  const std::vector<dropout_fixture> cases = {
      // Seed-OSS's class defaults (0.1 and 0.1) where config.json is silent.
      {"seed-oss-tf5", [](nlohmann::json& j) { j.erase("attention_dropout"), j.erase("residual_dropout"); },
       {.attention = 0.1, .residual = 0.1}},
      {"starcoder2-tf5",
       [](nlohmann::json& j) { j["attention_dropout"] = 0.1, j["residual_dropout"] = 0.2, j["embedding_dropout"] = 0.3; },
       {.attention = 0.1, .residual = 0.2, .embedding = 0.3}},
      {"gpt-neox-tf5", [](nlohmann::json& j) { j["hidden_dropout"] = 0.2; }, {.residual = 0.2, .embedding = 0.2}},
      {"phi3-tf5", [](nlohmann::json& j) { j["resid_pdrop"] = 0.2, j["embd_pdrop"] = 0.5; }, {.residual = 0.2}},
  };
  constexpr layout L{.tp = 2, .sp = true, .rmpad = true};
  for (const dropout_fixture& f : cases) {
    INFO(f.name);
    auto groups = parallel_groups::build(dist(), L);
    const fs::path dir = with_config(f.name, f.edit, *groups.world);
    const hf_config cfg = read_hf_config(dir);
    CHECK(cfg.dropout == f.want);
    const model_options given{.attention_window = cfg.attention_window, .dropout = cfg.dropout};
    parallel_model<causal_lm<any_llama, L>> actor(groups, given, cfg.s);
    load_hf(actor, groups, dir);
    const safetensors_file ref = safetensors_file::open(dir / "reference.safetensors");
    for (const std::string side : {"left", "right"}) {
      INFO(side << "-padded");
      const at::Tensor ids = ref.read(side + ".input_ids"), mask = ref.read(side + ".attention_mask");
      const model_output o = actor.forward(batch{.input_ids = ids, .attention_mask = mask});
      const at::Tensor diff = ((o.log_probs.to(at::kDouble) - ref.read(side + ".log_probs").to(at::kDouble)) * o.valid).abs();
      CHECK(diff.max().item<double>() <= 1e-4);
    }
    // Built without the checkpoint's rates: refused, unless the caller chose them (0: off).
    parallel_model<causal_lm<any_llama, L>> plain(groups, {.attention_window = cfg.attention_window}, cfg.s);
    CHECK_THROWS_WITH(load_hf(plain, groups, dir), Catch::Contains("trains with " + describe(cfg.dropout)) &&
                                                       Catch::Contains("the model was built with no dropout"));
    parallel_model<causal_lm<any_llama, L>> off(groups, {.attention_window = cfg.attention_window, .dropout_chosen = true}, cfg.s);
    CHECK_NOTHROW(load_hf(off, groups, dir));
    // save_hf writes the rates the model trains with, in the family's keys.
    const fs::path saved = dir.string() + "-saved";
    save_hf(actor, groups, saved, at::kFloat, cfg.model_type, dir);
    groups.world->barrier();
    CHECK(read_hf_config(saved).dropout == f.want);
    groups.world->barrier();
    if (groups.world->rank() == 0) {
      fs::remove_all(saved);
      fs::remove_all(dir);
    }
  }
}

}  // namespace
}  // namespace megadsl::test
