// The run-time twin of the static checks: require_valid() on values known only at run time throws
// std::invalid_argument with the very text the compiler shows for the same values, and check()
// with run facts covers the rules that only a running job can decide.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "megadsl/require_valid.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/presets.hpp"
#include "megadsl/rules.hpp"

namespace {

using megadsl::layout;
using megadsl::run_facts;
using megadsl::shape;

// What `causal_lm<M, L>` puts in its `invalid_layout<...>` diagnostic, computed by the compiler.
template <class M, layout L>
constexpr megadsl::message compile_time_message = megadsl::check(M::shape, L).joined();

// The same model and layout as run-time values (as if read from config.json and the command line).
shape runtime_copy(const shape& s) {
  volatile std::int64_t launder = 0;  // keeps the values out of constant evaluation
  shape r = s;
  r.heads = s.heads.get() + launder;
  r.layers = s.layers.get() + launder;
  return r;
}

std::string thrown_text(const shape& s, const layout& l, const run_facts& f = {}) {
  try {
    megadsl::require_valid(s, l, f);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

std::vector<std::string_view> rules_of(const megadsl::violations& v) {
  std::vector<std::string_view> out;
  for (int i = 0; i < v.count; ++i) out.push_back(v.items[static_cast<std::size_t>(i)].rule);
  return out;
}

}  // namespace

TEST_CASE("require_valid throws the compile-time message for the same values", "[spec][rules]") {
  using megadsl::llama3_8b;
  const std::string prefix = "megadsl: invalid layout: ";

  SECTION("heads % tp (with kv heads and ffn)") {
    constexpr auto& expected = compile_time_message<llama3_8b, layout{.tp = 3}>;
    static_assert(expected.view().starts_with(
        "heads_divisible_by_tp: num_heads = 32 is not divisible by tp = 3; valid tp: 1, 2, 4, 8, 16, 32"));
    int tp = 3;
    CHECK(thrown_text(runtime_copy(llama3_8b::shape), layout{.tp = tp}) == prefix + std::string(expected.view()));
    CHECK_THROWS_AS(megadsl::require_valid(llama3_8b::shape, layout{.tp = tp}), std::invalid_argument);
  }
  SECTION("layers over pp * vpp") {
    constexpr auto& expected = compile_time_message<llama3_8b, layout{.pp = 4, .vpp = 3}>;
    CHECK(thrown_text(runtime_copy(llama3_8b::shape), layout{.pp = 4, .vpp = 3}) ==
          prefix + std::string(expected.view()));
  }
  SECTION("sp without tp, vpp without pp") {
    constexpr auto& expected = compile_time_message<llama3_8b, layout{.sp = true}>;
    CHECK(thrown_text(llama3_8b::shape, layout{.sp = true}) == prefix + std::string(expected.view()));
    constexpr auto& vpp = compile_time_message<llama3_8b, layout{.vpp = 2}>;
    CHECK(thrown_text(llama3_8b::shape, layout{.vpp = 2}) == prefix + std::string(vpp.view()));
  }
  SECTION("a critic is checked like an actor") {
    constexpr auto& expected = compile_time_message<megadsl::qwen2_5_0_5b, layout{.tp = 4}>;
    CHECK(std::string(expected.view()) ==
          "heads_divisible_by_tp: num_heads = 14 is not divisible by tp = 4; valid tp: 1, 2, 7, 14");
    CHECK(thrown_text(runtime_copy(megadsl::qwen2_5_0_5b::shape), layout{.tp = 4}) ==
          prefix + std::string(expected.view()));
  }
  SECTION("valid layouts do not throw") {
    CHECK_NOTHROW(megadsl::require_valid(runtime_copy(llama3_8b::shape), layout{.tp = 8, .pp = 4, .sp = true}));
    CHECK_NOTHROW(megadsl::require_valid(megadsl::tiny_llama::shape, layout{.tp = 4, .pp = 2, .vpp = 2}));
  }
}

TEST_CASE("a dynamic field is checked once it is known, with the static wording", "[spec][rules]") {
  using megadsl::llama3_8b;
  shape s = llama3_8b::shape;
  s.heads = megadsl::dynamic;
  s.kv_heads = megadsl::dynamic;
  // While unknown, only the rules that do not read heads apply.
  CHECK(rules_of(megadsl::check(s, layout{.tp = 3})) == std::vector<std::string_view>{"ffn_divisible_by_tp"});
  // Known (e.g. from config.json): the same lines as the static model.
  s.heads = 32;
  s.kv_heads = 8;
  CHECK(megadsl::check(s, layout{.tp = 3}).joined().view() ==
        compile_time_message<llama3_8b, layout{.tp = 3}>.view());
}

TEST_CASE("run facts: world size, global batch, interleaved microbatches", "[spec][rules]") {
  const shape s = megadsl::llama3_8b::shape;

  SECTION("world_fits_layout") {
    const auto v = megadsl::check(s, layout{.tp = 8, .pp = 2}, run_facts{.world = 24});
    REQUIRE(rules_of(v) == std::vector<std::string_view>{"world_fits_layout"});
    CHECK(std::string(v.items[0].message.view()) ==
          "world_fits_layout: world size 24 is not divisible by tp * pp * cp = 16; valid world sizes are "
          "multiples of 16, or with this world size use tp * pp * cp in: 1, 2, 3, 4, 6, 8, 12, 24");
    CHECK(megadsl::check(s, layout{.tp = 8, .pp = 2}, run_facts{.world = 64}).ok());
    CHECK_THROWS_WITH(megadsl::require_valid(s, layout{.tp = 8, .pp = 2}, run_facts{.world = 24}),
                      Catch::Contains("world_fits_layout: world size 24"));
  }
  SECTION("global_batch_divisible") {
    // world 32 / (tp 8) = dp 4; micro batch 2 -> global batch must be a multiple of 8.
    const auto v = megadsl::check(s, layout{.tp = 8}, run_facts{.world = 32, .global_batch = 30, .micro_batch = 2});
    REQUIRE(rules_of(v) == std::vector<std::string_view>{"global_batch_divisible"});
    CHECK(std::string(v.items[0].message.view()) ==
          "global_batch_divisible: global batch 30 is not divisible by micro batch 2 * dp 4 = 8; use a "
          "global batch of 24 or 32");
    CHECK(megadsl::check(s, layout{.tp = 8}, run_facts{.world = 32, .global_batch = 32, .micro_batch = 2}).ok());
    // Without the world size, dp is unknown: nothing to decide yet.
    CHECK(megadsl::check(s, layout{.tp = 8}, run_facts{.global_batch = 30, .micro_batch = 2}).ok());
  }
  SECTION("interleaved_microbatches") {
    const auto v = megadsl::check(s, layout{.pp = 4, .vpp = 2}, run_facts{.microbatches = 6});
    REQUIRE(rules_of(v) == std::vector<std::string_view>{"interleaved_microbatches"});
    CHECK(std::string(v.items[0].message.view()) ==
          "interleaved_microbatches: number of microbatches 6 is not divisible by pp = 4 with the "
          "interleaved schedule; use 4 or 8 microbatches");
    CHECK(megadsl::check(s, layout{.pp = 4, .vpp = 2}, run_facts{.microbatches = 8}).ok());
    CHECK(megadsl::check(s, layout{.pp = 4}, run_facts{.microbatches = 6}).ok());  // 1F1B: any count
  }
  SECTION("facts combine with the layout rules") {
    const auto v = megadsl::check(s, layout{.tp = 3}, run_facts{.world = 8});
    CHECK(rules_of(v) == std::vector<std::string_view>{"heads_divisible_by_tp", "kv_heads_fit_tp",
                                                       "ffn_divisible_by_tp", "world_fits_layout"});
  }
}
