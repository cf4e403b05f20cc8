// HF config.json -> megadsl::shape (hf_config.hpp): the published configs read into the presets'
// shapes, HF's defaults, the errors (file, field, fix), resolve() against a declared model, and
// to_string().
#include <algorithm>
#include <cmath>
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "megadsl/config_hook.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/models/presets.hpp"
#include "megadsl/models/registry.hpp"
#include "megadsl/rules.hpp"

namespace {

using megadsl::config_error;
using megadsl::layout;
using megadsl::parse_hf_config;
using megadsl::rope_type;
using megadsl::shape;

const std::filesystem::path data_dir = std::filesystem::path(__FILE__).parent_path().parent_path() / "data";

// Every field of `a` and `b` is static and equal (head_dim compared as written).
bool same_shape(const shape& a, const shape& b) {
  return megadsl::to_string(a) == megadsl::to_string(b);
}

std::string error_of(std::string_view json) {
  try {
    parse_hf_config(json, "models/x/config.json");
  } catch (const config_error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// `text` with its first `from` replaced by `to`.
std::string edited(std::string_view text, std::string_view from, std::string_view to) {
  std::string out(text);
  const auto at = out.find(from);
  REQUIRE(at != std::string::npos);
  return out.replace(at, from.size(), to);
}

constexpr std::string_view mixtral_like = R"({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "num_local_experts": 4,
  "router_jitter_noise": 0.0})";

constexpr std::string_view minimal = R"({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
  "num_attention_heads": 8, "intermediate_size": 1376, "vocab_size": 1000})";

}  // namespace

TEST_CASE("published config.json files read into the presets' shapes", "[spec][hf_config]") {
  const auto llama = megadsl::read_hf_config(data_dir / "llama3-8b");
  CHECK(llama.file == data_dir / "llama3-8b" / "config.json");
  CHECK(llama.model_type == "llama");
  CHECK(llama.notes.empty());
  CHECK(same_shape(llama.s, megadsl::llama3_8b::shape));
  CHECK(megadsl::mismatches(megadsl::llama3_8b::shape, llama.s).empty());
  CHECK(same_shape(megadsl::read_hf_config(data_dir / "llama3-8b" / "config.json").s, llama.s));

  const auto qwen = megadsl::read_hf_config(data_dir / "qwen2.5-0.5b");
  CHECK(qwen.model_type == "qwen2");
  CHECK(qwen.s.qkv_bias.get());       // Qwen2 always has q/k/v biases
  CHECK(qwen.s.tie_embeddings.get());
  CHECK(same_shape(qwen.s, megadsl::qwen2_5_0_5b::shape));

  // Read at run time, checked with the words of the compile-time check.
  CHECK(megadsl::check(llama.s, layout{.tp = 3}).joined().view() ==
        megadsl::check(megadsl::llama3_8b::shape, layout{.tp = 3}).joined().view());
  CHECK(megadsl::check(qwen.s, layout{.tp = 2, .pp = 2, .sp = true}).ok());
}

TEST_CASE("keys config.json leaves out take transformers' defaults, and say so", "[spec][hf_config]") {
  const auto cfg = parse_hf_config(minimal);
  CHECK(cfg.s.kv_heads.get() == 8);  // num_key_value_heads defaults to num_attention_heads
  CHECK(cfg.s.head_dim.get() == 0);  // hidden / heads
  CHECK(cfg.s.max_positions.get() == 2048);
  CHECK(cfg.s.rms_eps.get() == 1e-6);
  CHECK(cfg.s.rope_theta.get() == 10000.0);
  CHECK(cfg.s.rope.type.get() == rope_type::none);
  CHECK_FALSE(cfg.s.qkv_bias.get());
  CHECK_FALSE(cfg.s.tie_embeddings.get());
  REQUIRE(cfg.notes.size() == 4);
  CHECK(cfg.notes[0] == "num_key_value_heads not in config.json: using 8 (transformers' default)");
  CHECK(cfg.notes[2] == "rms_norm_eps not in config.json: using 1e-06 (transformers' default)");

  const std::string qwen = edited(minimal, "\"llama\"", "\"qwen2\"");
  CHECK(parse_hf_config(qwen).s.max_positions.get() == 32768);  // Qwen2Config's default
  CHECK(parse_hf_config(qwen).s.qkv_bias.get());
  CHECK(!parse_hf_config(qwen).s.out_bias.get());
  // Llama's attention_bias: q/k/v and o_proj biases; mlp_bias: the gated MLP's (read by llama only).
  const shape biased = parse_hf_config(edited(minimal, "}", ", \"attention_bias\": true, \"mlp_bias\": true}")).s;
  CHECK((biased.qkv_bias.get() && biased.out_bias.get() && biased.mlp_bias.get()));
  const shape plain = parse_hf_config(minimal).s;
  CHECK((!plain.qkv_bias.get() && !plain.out_bias.get() && !plain.mlp_bias.get()));
}

TEST_CASE("transformers 5's rope_parameters: theta and scaling read from it, agreeing with the 4.x keys", "[spec][hf_config]") {
  auto with = [](std::string_view extra) { return parse_hf_config(edited(minimal, "}", ", " + std::string(extra) + "}")); };
  // What transformers 5.23 writes for Llama 3.1 (LlamaConfig(...).to_dict()).
  const auto l3 = with(R"("rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_theta": 500000.0})");
  CHECK(l3.s.rope_theta.get() == 500000.0);
  CHECK(l3.s.rope.type.get() == rope_type::llama3);
  CHECK(l3.s.rope.factor.get() == 8.0);
  CHECK(l3.s.rope.original_max_positions.get() == 8192);
  for (const auto& n : l3.notes) CHECK(n.find("rope_theta") == std::string::npos);  // not defaulted
  const auto plain = with(R"("rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"})");
  CHECK(plain.s.rope_theta.get() == 1000000.0);
  CHECK(plain.s.rope.type.get() == rope_type::none);
  // Both generations in one file: fine when they agree, refused when they do not.
  CHECK(with(R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0})")
            .s.rope.type.get() == rope_type::linear);
  CHECK_THROWS_WITH(with(R"("rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})"),
                    Catch::Contains("rope_parameters.rope_theta: is 500000.0 but the top-level rope_theta is 10000.0"));
  CHECK_THROWS_WITH(with(R"("rope_scaling": {"rope_type": "linear", "factor": 2.0},
                            "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})"),
                    Catch::Contains("rope_parameters: disagrees with rope_scaling"));
  CHECK_THROWS_WITH(with(R"("rope_parameters": {"rope_type": "longrope", "factor": 4.0, "rope_theta": 10000.0})"),
                    Catch::Contains("rope_parameters.rope_type: \"longrope\" is not supported"));
  CHECK_THROWS_WITH(with(R"("rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}})"),
                    Catch::Contains("rope_parameters: holds RoPE parameters per layer type"));
  CHECK_THROWS_WITH(with(R"("rope_parameters": 5)"), Catch::Contains("rope_parameters: expected an object"));
}

TEST_CASE("rope_scaling: null, default, linear, dynamic, llama3", "[spec][hf_config]") {
  auto with_rope = [](std::string_view rope) {
    return parse_hf_config(edited(minimal, "}", ", \"rope_scaling\": " + std::string(rope) + "}")).s.rope;
  };
  CHECK(with_rope("null").type.get() == rope_type::none);
  CHECK(with_rope(R"({"rope_type": "default"})").type.get() == rope_type::none);
  const auto linear = with_rope(R"({"type": "linear", "factor": 2.0})");  // the older key
  CHECK(linear.type.get() == rope_type::linear);
  CHECK(linear.factor.get() == 2.0);
  CHECK(with_rope(R"({"type": "dynamic", "factor": 4})").type.get() == rope_type::dynamic_ntk);
  const auto l3 = with_rope(R"({"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"})");
  CHECK(l3.type.get() == rope_type::llama3);
  CHECK(l3.factor.get() == 32.0);
  CHECK(l3.low_freq_factor.get() == 1.0);
  CHECK(l3.high_freq_factor.get() == 4.0);
  CHECK(l3.original_max_positions.get() == 8192);
  CHECK_THROWS_WITH(with_rope(R"({"rope_type": "longrope", "factor": 4.0})"),
                    Catch::Contains("rope_scaling.rope_type: \"longrope\" is not supported"));
  CHECK_THROWS_WITH(with_rope(R"({"rope_type": "llama3", "factor": 8.0})"),
                    Catch::Contains("rope_scaling.low_freq_factor: missing (needed by rope type \"llama3\")"));
}

TEST_CASE("a malformed config.json is refused naming the file, the field and the fix", "[spec][hf_config]") {
  // A value with control characters is quoted printably (the fuzzer's find: a raw ESC in the line).
  const std::string esc = error_of(edited(minimal, "}", R"(, "rope_parameters": {"rope_type": "\u001b", "factor": 8.0}})"));
  CHECK(esc.find('\x1b') == std::string::npos);
  CHECK_THAT(esc, Catch::Contains("rope_type: \"\\x1b\" is not supported"));
  CHECK(error_of(R"({"model_type": "llama", "hidden_size": 4096,)")
            .starts_with("megadsl: models/x/config.json: not valid JSON: "));
  // Hostile files: deep nesting and out-of-range numbers are one line, not a crash or a raw exception.
  CHECK(error_of(std::string(100000, '[')) ==
        "megadsl: models/x/config.json: nested deeper than 64 levels of JSON, megadsl's limit for any file it "
        "reads; fix the file (an HF config.json is one JSON object)");
  CHECK_THAT(error_of(R"({"model_type": "llama", "hidden_size": 1e999})"),
             Catch::StartsWith("megadsl: models/x/config.json: not valid JSON: number overflow parsing '1e999'"));
  CHECK(error_of("[1]") ==
        "megadsl: models/x/config.json: expected a JSON object, got [1] (an array); an HF config.json is one "
        "JSON object");
  CHECK(error_of(R"({"hidden_size": 4096})") ==
        "megadsl: models/x/config.json: model_type: missing; megadsl reads model_type \"llama\", \"mistral\", "
        "\"qwen2\", \"qwen3\", \"gemma\", \"gemma2\", \"olmo2\", \"phi3\", \"starcoder2\", \"gpt_neox\", \"mixtral\", "
            "\"qwen2_moe\", \"qwen3_moe\", \"seed_oss\", \"smollm3\", \"olmoe\", \"glm4_moe\", \"deepseek_v3\", \"gemma3_text\", \"olmo3\", \"exaone4\", \"ernie4_5\", \"ernie4_5_moe\", \"glm4\", \"kimi_k2\", \"hunyuan_v1_dense\", \"granite\", \"cohere2\", \"hunyuan_v1_moe\", \"cohere\", \"apertus\", \"gpt_oss\", \"llama4_text\", \"qwen3_next\", \"qwen3_5_text\" or \"qwen3_5_moe_text\": add the model's");
  CHECK(error_of(R"({"model_type": "gpt2"})")
            .starts_with("megadsl: models/x/config.json: model_type: \"gpt2\" is not a family megadsl composes; "
                         "megadsl reads model_type \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"gemma\", \"gemma2\", \"olmo2\", \"phi3\", \"starcoder2\", "
                  "\"gpt_neox\", \"mixtral\", \"qwen2_moe\", \"qwen3_moe\", \"seed_oss\", \"smollm3\", \"olmoe\", \"glm4_moe\", \"deepseek_v3\", \"gemma3_text\", \"olmo3\", \"exaone4\", \"ernie4_5\", \"ernie4_5_moe\", \"glm4\", \"kimi_k2\", \"hunyuan_v1_dense\", \"granite\", \"cohere2\", \"hunyuan_v1_moe\", \"cohere\", \"apertus\", \"gpt_oss\", \"llama4_text\", \"qwen3_next\", \"qwen3_5_text\" or \"qwen3_5_moe_text\""));

  CHECK(error_of(edited(minimal, "\"num_attention_heads\": 8", "\"num_attention_heads\": \"8\"")) ==
        "megadsl: models/x/config.json: num_attention_heads: expected an integer, got \"8\" (a string); write "
        "it as a plain JSON integer");
  CHECK(error_of(edited(minimal, "\"vocab_size\": 1000", "\"vocab_size\": -5")) ==
        "megadsl: models/x/config.json: vocab_size: expected an integer >= 1, got -5; fix the value in "
        "config.json");
  CHECK(error_of(edited(minimal, ", \"vocab_size\": 1000", "")).starts_with("megadsl: models/x/config.json: vocab_size: missing (the vocabulary size)"));
  CHECK(error_of(edited(minimal, "}", ", \"attention_bias\": 1}")).starts_with("megadsl: models/x/config.json: attention_bias: expected"));
  CHECK(error_of(edited(minimal, "}", ", \"hidden_act\": \"gelu\"}")).starts_with("megadsl: models/x/config.json: hidden_act: is \"gelu\" (a string)"));

  CHECK_THROWS_WITH(megadsl::read_hf_config(data_dir / "no-such-model"),
                    Catch::Contains("no-such-model: no such file or directory"));
  CHECK_THROWS_AS(megadsl::read_hf_config(data_dir), config_error);  // a directory without config.json
}

TEST_CASE("resolve: a declared model against a checkpoint's config.json", "[spec][hf_config]") {
  const shape from_config = megadsl::read_hf_config(data_dir / "llama3-8b").s;

  SECTION("agreeing static fields, dynamic ones filled in") {
    CHECK(same_shape(megadsl::resolve(megadsl::llama3_8b::shape, from_config), megadsl::llama3_8b::shape));
    shape partial = megadsl::llama3_8b::shape;
    partial.layers = megadsl::dynamic;
    partial.vocab = megadsl::dynamic;
    CHECK(same_shape(megadsl::resolve(partial, from_config), megadsl::llama3_8b::shape));
    CHECK(same_shape(megadsl::resolve(megadsl::dynamic_shape, from_config), from_config));
  }
  SECTION("every disagreeing field, named, with both values and the fix") {
    shape declared = megadsl::llama3_8b::shape;
    declared.hidden = 2048;
    declared.layers = megadsl::dynamic;  // dynamic never disagrees
    declared.rope_theta = 10000.0;
    declared.tie_embeddings = true;
    const auto lines = megadsl::mismatches(declared, from_config);
    REQUIRE(lines.size() == 3);
    CHECK(lines[0] == "hidden (hidden_size): declared 2048, config.json has 4096");
    CHECK(lines[1] == "rope_theta (rope_theta): declared 10000.0, config.json has 500000.0");
    CHECK(lines[2] == "tie_embeddings (tie_word_embeddings): declared true, config.json has false");
    CHECK_THROWS_WITH(
        megadsl::resolve(declared, from_config, "ckpt/config.json", "my_model"),
        "megadsl: my_model does not match ckpt/config.json: hidden (hidden_size): declared 2048, config.json "
        "has 4096; rope_theta (rope_theta): declared 10000.0, config.json has 500000.0; tie_embeddings "
        "(tie_word_embeddings): declared true, config.json has false; fix: use the model that matches this "
        "checkpoint (megadsl presets lists them), or declare these fields `dynamic` so that config.json "
        "supplies them");
  }
  SECTION("compared by meaning: head_dim 0 is hidden / heads; unused rope parameters") {
    shape explicit_hd = megadsl::llama3_8b::shape;
    explicit_hd.head_dim = 128;
    CHECK(megadsl::mismatches(explicit_hd, from_config).empty());
    explicit_hd.head_dim = 64;
    CHECK(megadsl::mismatches(explicit_hd, from_config) ==
          std::vector<std::string>{"head_dim (head_dim): declared 64, config.json has 0 (= hidden / heads = 128)"});
    shape other_rope = megadsl::llama3_8b::shape;
    other_rope.rope.factor = 8.0;  // ignored: no rope scaling on either side
    CHECK(megadsl::mismatches(other_rope, from_config).empty());
    other_rope.rope.type = rope_type::linear;
    CHECK(megadsl::mismatches(other_rope, from_config) ==
          std::vector<std::string>{"rope.type (rope_scaling.rope_type): declared linear, config.json has none"});
  }
  SECTION("a different model disagrees everywhere it differs") {
    const shape qwen = megadsl::read_hf_config(data_dir / "qwen2.5-0.5b").s;
    CHECK(megadsl::mismatches(megadsl::llama3_8b::shape, qwen).size() == 11);  // head_dim: both 0
    CHECK_THROWS_AS(megadsl::resolve(megadsl::llama3_8b::shape, qwen), config_error);
  }
}

TEST_CASE("to_string prints every field, dynamic where unknown", "[spec][hf_config]") {
  CHECK(megadsl::to_string(megadsl::tiny_llama3::shape) ==
        "shape{.hidden = 256, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 688, .vocab = 1000, .head_dim = 0, "
        ".max_positions = 512, .rms_eps = 1e-05, .rope_theta = 500000.0, .rope = {.type = llama3, .factor = 8.0, "
        ".low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_max_positions = 64}, .local_rope_theta = 0.0, .qkv_bias = false, "
        ".tie_embeddings = true, .out_bias = false, .mlp_bias = false, .query_pre_attn_scalar = 0.0, .attn_softcap = 0.0, "
        ".final_softcap = 0.0, .rotary_fraction = 1.0, .rope_interleave = false, .experts = 0, .top_k = 0, .expert_ffn = 0, "
        ".shared_expert_ffn = 0, .norm_topk = false, .sparse_step = 1, .dense_layers = 0, .nope_layers = 0, "
        ".linear_layers = 0, .arch = decoder(embedding, block(pre_norm(rms_norm<rms>, attention<separate>), pre_norm(rms_norm<rms>, gated_mlp<silu>)), "
        "rms_norm<rms>)}");
  CHECK(megadsl::to_string(megadsl::qwen2_5_0_5b::shape).find(".rope = {.type = none}, .local_rope_theta = 0.0, .qkv_bias = true") !=
        std::string::npos);
  CHECK(megadsl::to_string(megadsl::dynamic_shape).starts_with("shape{.hidden = dynamic, .layers = dynamic,"));
}

TEST_CASE("sliding windows as transformers 5 derives them per family", "[spec][hf_config]") {
  using megadsl::sliding_window;
  auto window = [](std::string_view type, std::string_view extra) {
    std::string text = edited(minimal, "\"llama\"", "\"" + std::string(type) + "\"");
    if (!extra.empty()) text = edited(text, "}", ", " + std::string(extra) + "}");
    return parse_hf_config(text).attention_window;
  };
  const sliding_window none{};
  auto on = [](std::int64_t size, std::vector<bool> layers) { return sliding_window{size, std::move(layers)}; };
  CHECK(window("mistral", R"("sliding_window": 4096)") == on(4096, {true, true, true, true}));  // every layer
  CHECK(window("mistral", R"("sliding_window": 4096)").every_layer());
  CHECK(window("mistral", R"("sliding_window": null)") == none);
  CHECK(window("mistral", "") == none);
  // MistralModel slides every layer whatever layer_types says (transformers warns and ignores it).
  CHECK(window("mistral", R"("sliding_window": 8, "layer_types": ["full_attention", "full_attention", "full_attention", "sliding_attention"])")
            .every_layer());
  // Qwen2: only with use_sliding_window, on the layers from max_window_layers on (4 layers here).
  CHECK(window("qwen2", R"("sliding_window": 4096, "use_sliding_window": false)") == none);
  CHECK(window("qwen2", R"("sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 2)") ==
        on(4096, {false, false, true, true}));
  CHECK(window("qwen2", R"("sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 4)") == none);
  CHECK(window("qwen2", R"("sliding_window": 64, "use_sliding_window": true, "max_window_layers": 4,
      "layer_types": ["full_attention", "full_attention", "full_attention", "sliding_attention"])") ==
        on(64, {false, false, false, true}));
  // Gemma2: alternate layers from the first, unless layer_types says otherwise; 4096 by default.
  const std::string gemma2_keys = R"("hidden_activation": "gelu_pytorch_tanh")";
  CHECK(window("gemma2", gemma2_keys) == on(4096, {true, false, true, false}));
  CHECK(window("gemma2", gemma2_keys + R"(, "sliding_window": 7, "layer_types": ["full_attention", "full_attention", "sliding_attention", "sliding_attention"])") ==
        on(7, {false, false, true, true}));
  // A null window: transformers fails on sliding layers without one (refused, naming the key); with
  // every layer full it has none.
  {
    std::string text = edited(edited(minimal, "\"llama\"", "\"gemma2\""), "}", ", " + gemma2_keys + R"(, "sliding_window": null})");
    CHECK_THROWS_WITH(parse_hf_config(text), Catch::Contains("sliding_window") && Catch::Contains("is null while the layer pattern has sliding layers"));
  }
  CHECK(window("gemma2", gemma2_keys + R"(, "sliding_window": null, "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"])") ==
        none);
  // LlamaConfig has no window: transformers ignores the key, and so does megadsl (with a note).
  const auto llama = parse_hf_config(edited(minimal, "}", R"(, "sliding_window": 16})"));
  CHECK(llama.attention_window == none);
  CHECK_THAT(llama.notes.back(), Catch::Contains("unknown to transformers' llama config") && Catch::Contains("sliding_window"));
  // GPTNeoXConfig has no window at all, and Phi3's and Starcoder2's attention slides every layer
  // whatever layer_types says: transformers ignores those keys, and so does megadsl (noted).
  const auto neox = parse_hf_config(edited(edited(minimal, "\"llama\"", "\"gpt_neox\""), "}",
                                           R"(, "hidden_act": "gelu", "sliding_window": 16})"));
  CHECK(neox.attention_window == none);
  CHECK_THAT(neox.notes.back(), Catch::Contains("unknown to transformers' gpt_neox config") && Catch::Contains("sliding_window"));
  const auto phi3 = parse_hf_config(edited(edited(minimal, "\"llama\"", "\"phi3\""), "}",
      R"(, "sliding_window": 8, "layer_types": ["full_attention", "full_attention", "full_attention", "sliding_attention"]})"));
  CHECK(phi3.attention_window.every_layer());
  CHECK_THAT(phi3.notes.back(), Catch::Contains("unknown to transformers' phi3 config") && Catch::Contains("layer_types"));
  CHECK_THROWS_WITH(megadsl::hf_config_json(neox.s, "gpt_neox", false, "float32", {32}), Catch::Contains("has no sliding window"));
  CHECK(error_of(edited(edited(minimal, "\"llama\"", "\"qwen2\""), "}", R"(, "sliding_window": 8, "use_sliding_window": true, "layer_types": ["chunked_attention", "full_attention", "full_attention", "full_attention"]})"))
            .starts_with("megadsl: models/x/config.json: layer_types: holds \"chunked_attention\" (a string), a layer "
                         "type megadsl does not have"));
  // hf_config_json writes the window back in each family's own keys; Llama refuses one, Mistral one
  // on some layers only.
  const auto mistral = parse_hf_config(edited(minimal, "\"llama\"", "\"mistral\""));
  CHECK(parse_hf_config(megadsl::hf_config_json(mistral.s, "mistral", false, "float32", {32})).attention_window == on(32, {}));
  CHECK(parse_hf_config(megadsl::hf_config_json(mistral.s, "mistral", false, "float32", {})).attention_window == none);
  shape with_bias = mistral.s;
  with_bias.qkv_bias = true;
  const sliding_window upper = on(32, {false, true, true, true});
  CHECK(parse_hf_config(megadsl::hf_config_json(with_bias, "qwen2", false, "float32", upper)).attention_window == upper);
  CHECK_THROWS_WITH(megadsl::hf_config_json(with_bias, "mistral", false), Catch::Contains("has no q/k/v bias"));
  CHECK_THROWS_WITH(megadsl::hf_config_json(mistral.s, "llama", false, "float32", {32}),
                    Catch::Contains("save it as model_type mistral"));
  CHECK_THROWS_WITH(megadsl::hf_config_json(mistral.s, "mistral", false, "float32", upper),
                    Catch::Contains("on some layers only"));
  CHECK(megadsl::model_type_for(mistral.s, upper).empty());  // qwen2 would need a q/k/v bias: no class describes it
  CHECK(megadsl::model_type_for(mistral.s, on(32, {})) == "mistral");
  CHECK(megadsl::model_type_for(mistral.s) == "llama");
  // Gemma2 round-trips its window, score scale and soft-caps.
  const auto gemma2 = parse_hf_config(edited(edited(minimal, "\"llama\"", "\"gemma2\""), "}", ", " + gemma2_keys + "}"));
  CHECK(gemma2.s.query_pre_attn_scalar.get() == 256.0);
  CHECK(gemma2.s.attn_softcap.get() == 50.0);
  CHECK(gemma2.s.final_softcap.get() == 30.0);
  const auto back = parse_hf_config(megadsl::hf_config_json(gemma2.s, "gemma2", false, "float32", gemma2.attention_window));
  CHECK(back.attention_window == gemma2.attention_window);
  CHECK(megadsl::mismatches(back.s, gemma2.s).empty());
  CHECK(megadsl::model_type_for(gemma2.s) == "gemma2");
  // null soft-caps are no soft-caps (transformers' None).
  CHECK(parse_hf_config(edited(edited(minimal, "\"llama\"", "\"gemma2\""), "}", ", " + gemma2_keys +
                               R"(, "attn_logit_softcapping": null, "final_logit_softcapping": null})")).s.final_softcap.get() == 0.0);
  CHECK_THROWS_WITH(megadsl::hf_config_json(gemma2.s, "gemma", false), Catch::Contains("not those of model_type gemma"));
}

TEST_CASE("GPT-NeoX configs in both generations: rotary_pct / rotary_emb_base (4.x) and rope_parameters (5.x)",
          "[spec][hf_config]") {
  const std::string neox = edited(edited(minimal, "\"llama\"", "\"gpt_neox\""), "}", R"(, "hidden_act": "gelu"})");
  // 4.x keys, and GPTNeoXConfig's default share (0.25) when neither generation names it.
  const auto old = parse_hf_config(edited(neox, "}", R"(, "rotary_pct": 0.5, "rotary_emb_base": 5000.0})"));
  CHECK(old.s.rotary_fraction.get() == 0.5);
  CHECK(old.s.rope_theta.get() == 5000.0);
  CHECK(old.s.arch == megadsl::gpt_neox_config.arch);
  CHECK(old.s.arch->hf_layers == "gpt_neox.layers.");
  CHECK(old.s.kv_heads.get() == old.s.heads.get());
  CHECK((old.s.qkv_bias.get() && old.s.out_bias.get()));
  CHECK(parse_hf_config(neox).s.rotary_fraction.get() == 0.25);
  const auto v5 = parse_hf_config(edited(neox, "}", R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}})"));
  CHECK(v5.s.rotary_fraction.get() == 0.25);
  // The two generations must agree; what the composition cannot do is refused with its reason.
  CHECK_THAT(error_of(edited(neox, "}", R"(, "rotary_pct": 0.5, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}})")),
             Catch::Contains("rotary_pct: is 0.5 but rope_parameters says 0.25"));
  CHECK_THAT(error_of(edited(neox, "}", R"(, "use_parallel_residual": false})")),
             Catch::Contains("use_parallel_residual: is false"));
  CHECK_THAT(error_of(edited(edited(minimal, "\"llama\"", "\"gpt_neox\""), "}", R"(, "hidden_act": "gelu_new"})")),
             Catch::Contains("the exact GELU"));
  CHECK_THAT(error_of(edited(minimal, "}", R"(, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})")),
             Catch::Contains("attention rotates the whole head"));
  // classifier_dropout (0.1 by default in GPTNeoXConfig) is noted: the value head has no dropout.
  const auto noted = parse_hf_config(edited(neox, "}", R"(, "classifier_dropout": 0.1})"));
  CHECK(std::any_of(noted.notes.begin(), noted.notes.end(), [](const std::string& n) { return n.find("classifier_dropout") != std::string::npos; }));
  // Written back as transformers 5 reads it.
  const auto back = parse_hf_config(megadsl::hf_config_json(old.s, "gpt_neox", true));
  CHECK(megadsl::mismatches(back.s, old.s).empty());
  CHECK(megadsl::model_type_for(old.s) == "gpt_neox");
}

TEST_CASE("every key is read, refused unless neutral, or known to change nothing; unknown keys are named",
          "[spec][hf_config]") {
  auto with = [](std::string_view extra) { return edited(minimal, "}", ", " + std::string(extra) + "}"); };
  // Dropout is read (applied in training steps); a rate that is no probability below 1 is refused.
  CHECK(parse_hf_config(with(R"("attention_dropout": 0.1)")).dropout == megadsl::dropout_rates{.attention = 0.1});
  CHECK(error_of(with(R"("attention_dropout": 1.0)"))
            .starts_with("megadsl: models/x/config.json: attention_dropout: is 1.0 (a number with a fraction), not a "
                         "probability below 1"));
  CHECK_THAT(error_of(with(R"("attention_dropout": "0.1")")), Catch::Contains("expected a dropout probability"));
  CHECK_THAT(error_of(with(R"("classifier_dropout": 0.1)")), Catch::Contains("megadsl's value head has no dropout"));
  CHECK_NOTHROW(parse_hf_config(with(R"("attention_dropout": 0.0, "classifier_dropout": null)")));
  CHECK(error_of(with(R"("quantization_config": {"quant_method": "gptq"})"))
            .starts_with("megadsl: models/x/config.json: quantization_config: is {\"quant_method\":\"gptq\"} (an "
                         "object), which megadsl does not implement; dequantize the checkpoint"));
  // Bookkeeping keys pass without a word; an unknown key is named, escaped.
  const auto quiet = parse_hf_config(with(R"("bos_token_id": 1, "pretraining_tp": 1, "torch_dtype": "bfloat16",
      "transformers_version": "4.57.6", "architectures": ["LlamaForCausalLM"], "use_cache": true)"));
  for (const std::string& n : quiet.notes) CHECK_THAT(n, !Catch::Contains("unknown"));
  const auto odd = parse_hf_config(with(R"("my_scale\u001b[2J": 2.0)"));
  CHECK_THAT(odd.notes.back(), Catch::EndsWith("my_scale\\x1b[2J"));
}

TEST_CASE("mixtures of experts: the published configs read into the presets, and dense layers are refused",
          "[spec][hf_config][moe]") {
  const auto mixtral = megadsl::read_hf_config(data_dir / "mixtral-8x7b");
  CHECK(mixtral.model_type == "mixtral");
  CHECK(mixtral.notes.empty());
  CHECK(same_shape(mixtral.s, megadsl::mixtral_8x7b::shape));
  const auto qwen2 = megadsl::read_hf_config(data_dir / "qwen1.5-moe-a2.7b");
  CHECK(same_shape(qwen2.s, megadsl::qwen1_5_moe_a2_7b::shape));
  CHECK(megadsl::has_shared_expert(qwen2.s));
  CHECK(!qwen2.attention_window.any());  // sliding_window 32768, but use_sliding_window false
  const auto qwen3 = megadsl::read_hf_config(data_dir / "qwen3-30b-a3b");
  CHECK(same_shape(qwen3.s, megadsl::qwen3_30b_a3b::shape));
  CHECK(megadsl::model_type_for(qwen3.s, {}) == "qwen3_moe");
  CHECK(megadsl::model_type_for(mixtral.s, {}) == "mixtral");
  CHECK(megadsl::model_type_for(qwen2.s, {}) == "qwen2_moe");

  // Read back from the config.json megadsl writes, the same shape.
  for (const auto* c : {&mixtral, &qwen2, &qwen3}) {
    INFO(c->model_type);
    const std::string written = megadsl::hf_config_json(c->s, c->model_type, false, "bfloat16", {});
    CHECK(megadsl::mismatches(parse_hf_config(written, "written/config.json").s, c->s).empty());
  }

  const std::string qwen3_text = R"({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [], "decoder_sparse_step": 1})";
  CHECK(parse_hf_config(qwen3_text, "x/config.json").s.experts.get() == 8);
  // Dense layers among the sparse ones, as Qwen's configs say it.
  const shape mixed = parse_hf_config(edited(edited(qwen3_text, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [0, 9]"),
                                             "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2"), "x").s;
  CHECK(mixed.dense_layers.get() == 1);  // layer 9 does not exist: transformers matches none either
  CHECK(mixed.sparse_step.get() == 2);
  CHECK((!megadsl::layer_routes(mixed, 0) && megadsl::layer_routes(mixed, 1) && !megadsl::layer_routes(mixed, 2) &&
         megadsl::layer_routes(mixed, 3)));
  CHECK_THAT(megadsl::hf_config_json(mixed, "qwen3_moe", false, "float32", {}),
             Catch::Contains("\"decoder_sparse_step\": 2") && Catch::Contains("\"mlp_only_layers\": [\n    0\n  ]"));
  CHECK_THAT(error_of(edited(qwen3_text, "\"mlp_only_layers\": []", "\"mlp_only_layers\": 3")),
             Catch::Contains("mlp_only_layers") && Catch::Contains("list of layer indices"));
  // Counted per layer: a dense layer has the gated MLP, a sparse one the router and experts.
  CHECK(megadsl::layer_parameter_count(mixed, 0) != megadsl::layer_parameter_count(mixed, 1));
  CHECK(megadsl::parameter_count(mixed) == 2 * megadsl::layer_parameter_count(mixed, 0) +
                                               2 * megadsl::layer_parameter_count(mixed, 1) + 2 * 100 * 64 + 64);
  CHECK_THAT(error_of(edited(qwen3_text, "\"num_experts\": 8", "\"num_experts\": 8, \"num_local_experts\": 6")),
             Catch::Contains("num_experts") && Catch::Contains("keep one"));
  CHECK_THAT(error_of(edited(mixtral_like, "\"router_jitter_noise\": 0.0", "\"router_jitter_noise\": 0.01")),
             Catch::Contains("router_jitter_noise") && Catch::Contains("set it to 0.0"));
  // top_k beyond the experts: the rule's words.
  const shape bad_k = parse_hf_config(edited(qwen3_text, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9"), "x").s;
  CHECK_THAT(std::string(megadsl::check(bad_k, layout{}).joined().view()),
             Catch::Contains("moe_routing_valid") && Catch::Contains("top_k = 9"));
  CHECK_THAT(std::string(megadsl::check(bad_k, layout{.ep = 3}).joined().view()),
             Catch::Contains("ep_needs_experts") && Catch::Contains("valid ep: 1, 2, 4, 8"));
}

TEST_CASE("the 2026 families' config.json: Seed-OSS's two bias keys and dropouts, SmolLM3's NoPE layers, OLMoE's "
          "experts",
          "[spec][hf_config]") {
  // Seed-OSS: attention_bias (q/k/v, true by default) and attention_out_bias (o_proj, false).
  const std::string seed = R"({"model_type": "seed_oss", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
    "attention_dropout": 0.0, "residual_dropout": 0.0})";
  const shape s = parse_hf_config(seed, "x/config.json").s;
  CHECK((s.qkv_bias.get() && !s.out_bias.get() && s.head_dim.get() == 128));  // SeedOssConfig's head_dim default
  const shape out = parse_hf_config(edited(seed, "\"vocab_size\": 100", "\"vocab_size\": 100, \"attention_bias\": false, "
                                                                        "\"attention_out_bias\": true"), "x").s;
  CHECK((!out.qkv_bias.get() && out.out_bias.get()));
  const std::string written = megadsl::hf_config_json(s, "seed_oss", false, "float32", {});
  CHECK_THAT(written, Catch::Contains("\"attention_out_bias\": false") && Catch::Contains("\"residual_dropout\": 0.0"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, s).empty());
  // A dropout left to SeedOssConfig's default is its 0.1 (said in a note), and is written back.
  const auto defaulted = parse_hf_config(edited(seed, "\"attention_dropout\": 0.0, \"residual_dropout\": 0.0", "\"use_cache\": true"), "x");
  CHECK(defaulted.dropout == megadsl::dropout_rates{.attention = 0.1, .residual = 0.1});
  CHECK(std::any_of(defaulted.notes.begin(), defaulted.notes.end(), [](const std::string& n) {
    return n.starts_with("residual_dropout not in config.json: using 0.1");
  }));
  CHECK(parse_hf_config(megadsl::hf_config_json(s, "seed_oss", false, "float32", {}, defaulted.dropout), "w").dropout ==
        defaulted.dropout);
  // Each family's keys: StarCoder2's residual and embedding, GPT-NeoX's one hidden_dropout for both,
  // Phi-3's resid_pdrop (its embd_pdrop is applied by no transformers code: noted, not read).
  const std::string star = R"({"model_type": "starcoder2", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
    "residual_dropout": 0.2, "embedding_dropout": 0.3})";
  CHECK(parse_hf_config(star, "x").dropout == megadsl::dropout_rates{.residual = 0.2, .embedding = 0.3});
  const std::string neox = R"({"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "hidden_dropout": 0.25})";
  const auto neox_cfg = parse_hf_config(neox, "x");
  CHECK(neox_cfg.dropout == megadsl::dropout_rates{.residual = 0.25, .embedding = 0.25});
  CHECK_THAT(megadsl::hf_config_json(neox_cfg.s, "gpt_neox", false, "float32", {}, neox_cfg.dropout),
             Catch::Contains("\"hidden_dropout\": 0.25"));
  CHECK_THROWS_WITH(megadsl::hf_config_json(neox_cfg.s, "gpt_neox", false, "float32", {}, {.residual = 0.25}),
                    Catch::Contains("one rate for several dropouts (hidden_dropout)"));
  CHECK_THROWS_WITH(megadsl::hf_config_json(s, "seed_oss", false, "float32", {}, {.embedding = 0.1}),
                    Catch::Contains("a SeedOss config has no embedding dropout"));
  const std::string phi = R"({"model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
    "resid_pdrop": 0.1, "embd_pdrop": 0.1})";
  const auto phi_cfg = parse_hf_config(phi, "x");
  CHECK(phi_cfg.dropout == megadsl::dropout_rates{.residual = 0.1});
  CHECK(std::any_of(phi_cfg.notes.begin(), phi_cfg.notes.end(),
                    [](const std::string& n) { return n.find("applies no embedding dropout") != std::string::npos; }));

  // SmolLM3: no_rope_layers (1 = RoPE), else every no_rope_layer_interval-th layer without.
  const std::string smol = R"({"model_type": "smollm3", "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100})";
  CHECK(parse_hf_config(smol, "x").s.nope_layers.get() == ((1 << 3) | (1 << 7)));  // the default interval 4
  CHECK(parse_hf_config(edited(smol, "\"vocab_size\": 100", "\"vocab_size\": 100, \"no_rope_layer_interval\": 2"), "x")
            .s.nope_layers.get() == 0xAA);
  const auto listed = parse_hf_config(edited(smol, "\"vocab_size\": 100",
                                             "\"vocab_size\": 100, \"no_rope_layers\": [0, 1, 1, 1, 1, 1, 1, 0], "
                                             "\"use_sliding_window\": true, \"sliding_window\": 16"), "x");
  CHECK(listed.s.nope_layers.get() == ((1 << 0) | (1 << 7)));
  CHECK((megadsl::smollm3_layer(listed.s, 0) == 1 && megadsl::smollm3_layer(listed.s, 1) == 0));
  // With use_sliding_window the NoPE layers slide (SmolLM3Config's layer_types).
  CHECK((listed.attention_window.of(0) == 16 && listed.attention_window.of(1) == 0 && listed.attention_window.of(7) == 16));
  const std::string smol_written = megadsl::hf_config_json(listed.s, "smollm3", false, "float32", listed.attention_window);
  CHECK_THAT(smol_written, Catch::Contains("\"no_rope_layers\": [\n    0,\n    1,"));
  const auto back = parse_hf_config(smol_written, "w");
  CHECK((megadsl::mismatches(back.s, listed.s).empty() && back.attention_window == listed.attention_window));
  CHECK_THAT(error_of(edited(smol, "\"vocab_size\": 100", "\"vocab_size\": 100, \"no_rope_layers\": [1, 0]")),
             Catch::Contains("no_rope_layers: expected a list of 8 zeros and ones"));
  // use_sliding_window false keeps sliding_window in SmolLM3Config, and an explicit sliding layer
  // is slid by transformers' sdpa mask but not by its flash attention: refused. Without a window
  // (null, as the published config has it) or without sliding layers, nothing slides.
  const std::string types = R"("layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention",
    "full_attention", "full_attention", "full_attention", "full_attention"])";
  CHECK_THAT(error_of(edited(smol, "\"vocab_size\": 100",
                             "\"vocab_size\": 100, \"use_sliding_window\": false, \"sliding_window\": 16, " + types)),
             Catch::Contains("layer_types: has sliding_attention layers while use_sliding_window is false") &&
                 Catch::Contains("set use_sliding_window true"));
  CHECK(parse_hf_config(edited(smol, "\"vocab_size\": 100",
                               "\"vocab_size\": 100, \"use_sliding_window\": false, \"sliding_window\": null, " + types), "x")
            .attention_window.size == 0);
  // The two kinds of layer are summed per layer; a NoPE layer has the same parameters.
  CHECK(megadsl::parameter_count(listed.s) == 8 * megadsl::layer_parameter_count(listed.s, 1) + 100 * 64 + 64);

  // OLMoE: experts of intermediate_size, norm_topk_prob read (false by default), clip_qkv refused.
  const std::string olmoe = R"({"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 32, "vocab_size": 100, "num_experts": 8,
    "num_experts_per_tok": 2, "clip_qkv": null})";
  const shape o = parse_hf_config(olmoe, "x").s;
  CHECK((o.experts.get() == 8 && o.expert_ffn.get() == 0 && !o.norm_topk.get() && o.kv_heads.get() == 4));
  CHECK(parse_hf_config(edited(olmoe, "\"clip_qkv\": null", "\"norm_topk_prob\": true"), "x").s.norm_topk.get());
  CHECK_THAT(error_of(edited(olmoe, "\"clip_qkv\": null", "\"clip_qkv\": 8.0")),
             Catch::Contains("clip_qkv") && Catch::Contains("does not implement"));
  const std::string olmoe_written = megadsl::hf_config_json(o, "olmoe", false, "float32", {});
  CHECK_THAT(olmoe_written, Catch::Contains("\"norm_topk_prob\": false") && !Catch::Contains("moe_intermediate_size"));
  CHECK(megadsl::mismatches(parse_hf_config(olmoe_written, "w").s, o).empty());
  CHECK(megadsl::model_type_for(o, {}) == "olmoe");
}

TEST_CASE("ERNIE 4.5 MoE's config.json: a range of sparse layers, its router's floor, shared experts as a count",
          "[spec][hf_config]") {
  const std::string ernie = R"({"model_type": "ernie4_5_moe", "hidden_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100,
    "moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 48, "moe_num_shared_experts": 2,
    "moe_layer_start_index": 1, "moe_layer_end_index": 4, "moe_layer_interval": 2, "moe_norm_min": 1e-9,
    "use_bias": false, "tie_word_embeddings": true, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})";
  const auto c = parse_hf_config(ernie, "x/config.json");
  const shape& s = c.s;
  CHECK((s.experts.get() == 8 && s.top_k.get() == 2 && s.expert_ffn.get() == 48 && s.shared_expert_ffn.get() == 96));
  CHECK((s.norm_topk.get() && setting(s, "moe_norm_min") == 1e-9 && s.rope_interleave.get() && s.tie_embeddings.get()));
  // transformers: layer i is sparse when (i + 1) % 2 == 0 and 1 <= i <= 4: layers 1 and 3.
  for (std::int64_t i = 0; i < 6; ++i) CHECK(megadsl::layer_routes(s, i) == (i == 1 || i == 3));
  // Defaults: the experts from layer 1 to the last (end -1), the floor 1e-12; num_experts and
  // num_experts_per_tok are read as the class maps them (onto moe_num_experts, moe_k).
  const shape d = parse_hf_config(R"({"model_type": "ernie4_5_moe", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 3})", "x").s;
  CHECK((d.experts.get() == 8 && d.top_k.get() == 3 && setting(d, "moe_norm_min") == 1e-12 && d.shared_expert_ffn.get() == 3072));
  for (std::int64_t i = 0; i < 4; ++i) CHECK(megadsl::layer_routes(d, i) == (i >= 1));
  CHECK_THAT(error_of(edited(ernie, "\"moe_k\": 2", "\"moe_k\": 2, \"num_experts_per_tok\": 4")),
             Catch::Contains("num_experts_per_tok: is 4 (an integer) but moe_k is 2"));
  // Written back: the range and the interval, the floor; read again, the same model.
  const std::string written = megadsl::hf_config_json(s, "ernie4_5_moe", false, "float32", {});
  CHECK_THAT(written, Catch::Contains("\"moe_layer_start_index\": 1") && Catch::Contains("\"moe_layer_end_index\": 3") &&
                          Catch::Contains("\"moe_layer_interval\": 2") && Catch::Contains("\"moe_num_shared_experts\": 2") &&
                          Catch::Contains("\"moe_norm_min\": 1e-09") && !Catch::Contains("mlp_only_layers") &&
                          !Catch::Contains("routed_scaling_factor"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, s).empty());
  CHECK(megadsl::model_type_for(s, {}) == "ernie4_5_moe");
  // A pattern no range says (layers 1 and 4 sparse, 3 dense between them) is refused at save.
  shape gap = s;
  gap.sparse_step = 1;
  gap.dense_layers = 0b101101;
  CHECK_THROWS_WITH(megadsl::hf_config_json(gap, "ernie4_5_moe", false, "float32", {}), Catch::Contains("are not such a range"));
  // The floor is ERNIE's router's own key, refused where it is no number >= 0.
  CHECK_THAT(error_of(edited(ernie, "\"moe_norm_min\": 1e-9", "\"moe_norm_min\": -1")), Catch::Contains("moe_norm_min"));
  CHECK_THAT(error_of(edited(ernie, "\"moe_norm_min\": 1e-9", "\"moe_norm_min\": null")), Catch::Contains("moe_norm_min: is null"));
  // Refused: biases (the shared experts' and lm_head's are not in the composition).
  CHECK_THAT(error_of(edited(ernie, "\"use_bias\": false", "\"use_bias\": true")),
             Catch::Contains("use_bias: is true (a boolean), which megadsl does not implement (biases on every projection"));
  // ERNIE-4.5-300B-A47B's sizes (its configs as summarised from the hub: no shared experts, layers
  // 3-53 sparse, untied): no shared-expert rows, and transformers' count of Ernie4_5_MoeForCausalLM
  // built from them on the meta device, 299,484,163,264.
  const shape big = parse_hf_config(R"({"model_type": "ernie4_5_moe", "hidden_size": 8192, "num_hidden_layers": 54,
    "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 103424,
    "moe_num_experts": 64, "moe_k": 8, "moe_intermediate_size": 3584, "moe_num_shared_experts": 0,
    "moe_layer_start_index": 3, "moe_layer_end_index": 53, "moe_layer_interval": 1, "tie_word_embeddings": false,
    "use_bias": false, "rope_theta": 500000.0, "max_position_embeddings": 131072})", "x").s;
  CHECK((big.shared_expert_ffn.get() == 0 && big.dense_layers.get() == 0b111 && megadsl::check(big, layout{}).ok()));
  CHECK(megadsl::parameter_count(big) == 299'484'163'264);
  CHECK_THAT(megadsl::hf_config_json(big, "ernie4_5_moe", false, "float32", {}), Catch::Contains("\"moe_num_shared_experts\": 0"));
  // DeepSeek's keys say at least one shared expert: a GLM-4.5 model without one is refused at save.
  shape unshared = parse_hf_config(R"({"model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100, "n_routed_experts": 8})", "x").s;
  unshared.shared_expert_ffn = 0;
  CHECK_THROWS_WITH(megadsl::hf_config_json(unshared, "glm4_moe", false, "float32", {}), Catch::Contains("has none"));
  // The expert bias: (experts) here, one row (1, experts) in HF's file.
  const auto* bias = megadsl::find_row(megadsl::arch_of(s), "layers.{layer}.router.expert_bias");
  REQUIRE(bias != nullptr);
  CHECK((bias->hf[0] == "model.layers.{layer}.mlp.moe_statics.e_score_correction_bias" && bias->form == megadsl::hf_form::one_row));
}

TEST_CASE("GLM-4.5's config.json: DeepSeek's router keys, shared experts as a count, the first layers dense", "[spec][hf_config]") {
  const std::string glm = R"({"model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 176, "vocab_size": 100,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "n_shared_experts": 2,
    "first_k_dense_replace": 2, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "attention_bias": true,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}})";
  const auto c = parse_hf_config(glm, "x/config.json");
  const shape& s = c.s;
  CHECK((s.experts.get() == 8 && s.expert_ffn.get() == 48 && s.shared_expert_ffn.get() == 96 && s.norm_topk.get()));
  CHECK((setting(s, "routed_scaling_factor") == 2.5 && setting(s, "n_group") == 4 && setting(s, "topk_group") == 2));
  CHECK((s.dense_layers.get() == 3 && s.sparse_step.get() == 1 && s.rotary_fraction.get() == 0.5));
  CHECK((s.qkv_bias.get() && !s.out_bias.get()));  // o_proj never has a bias in GLM-4.5
  CHECK((!megadsl::layer_routes(s, 1) && megadsl::layer_routes(s, 2)));
  // Defaults: one dense layer, one shared expert, no groups, x 1, partial rotary 0.5.
  const shape d = parse_hf_config(R"({"model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100, "n_routed_experts": 8})", "x").s;
  CHECK((d.dense_layers.get() == 1 && d.shared_expert_ffn.get() == 1408 && setting(d, "n_group") == 1 &&
         setting(d, "topk_group") == 1 && setting(d, "routed_scaling_factor") == 1.0 && d.rotary_fraction.get() == 0.5 &&
         d.top_k.get() == 8));
  const std::string written = megadsl::hf_config_json(s, "glm4_moe", false, "float32", {});
  CHECK_THAT(written, Catch::Contains("\"first_k_dense_replace\": 2") && Catch::Contains("\"n_shared_experts\": 2") &&
                          Catch::Contains("\"n_group\": 4") && Catch::Contains("\"routed_scaling_factor\": 2.5") &&
                          !Catch::Contains("mlp_only_layers"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, s).empty());
  // GLM-4.5-Air's layers have no q/k norms (use_qk_norm false by default); GLM-4.5's have them on
  // every layer, dense and sparse, before RoPE, written back.
  const auto* q_norm = megadsl::find_row(megadsl::arch_of(s), "layers.{layer}.q_norm.weight");
  REQUIRE(q_norm != nullptr);
  CHECK(q_norm->hf[0] == "model.layers.{layer}.self_attn.q_norm.weight");
  const auto normed_layers = [&](const shape& x) {
    int n = 0;
    for (std::int64_t i = 0; i < x.layers.get(); ++i) n += (q_norm->layer_kinds >> megadsl::kind_of_layer(x, i)) & 1u;
    return n;
  };
  CHECK((setting(s, "use_qk_norm") == 0 && normed_layers(s) == 0));
  const shape normed = parse_hf_config(edited(glm, "\"attention_bias\": true", "\"attention_bias\": true, \"use_qk_norm\": true"), "x").s;
  CHECK((setting(normed, "use_qk_norm") == 1 && normed_layers(normed) == 4));
  CHECK(megadsl::parameter_count(normed) == megadsl::parameter_count(s) + 4 * 2 * 32);  // 4 layers, q and k, head_dim 32
  const std::string written_normed = megadsl::hf_config_json(normed, "glm4_moe", false, "float32", {});
  CHECK_THAT(written_normed, Catch::Contains("\"use_qk_norm\": true"));
  CHECK(megadsl::mismatches(parse_hf_config(written_normed, "w").s, normed).empty());
  CHECK_FALSE(megadsl::mismatches(normed, s).empty());  // a model declared without them refuses such a checkpoint
  // Refused: groups that do not split the experts.
  const shape bad = parse_hf_config(edited(glm, "\"n_group\": 4", "\"n_group\": 3"), "x").s;
  CHECK_THAT(std::string(megadsl::check(bad, layout{}).joined().view()),
             Catch::Contains("moe_routing_valid") && Catch::Contains("n_group = 3 does not split 8 experts"));
  const shape few = parse_hf_config(edited(glm, "\"topk_group\": 2", "\"topk_group\": 5"), "x").s;
  CHECK_THAT(std::string(megadsl::check(few, layout{}).joined().view()), Catch::Contains("topk_group = 5 of 4 groups of 2 experts"));
  // The expert bias is a row of the sparse layers: (experts), replicated.
  const auto* bias = megadsl::find_row(megadsl::arch_of(s), "layers.{layer}.router.expert_bias");
  REQUIRE(bias != nullptr);
  CHECK(bias->hf[0] == "model.layers.{layer}.mlp.gate.e_score_correction_bias");
}

TEST_CASE("DeepSeek-V3's config.json: multi-head latent attention's sizes, q_lora_rank null, YaRN refused", "[spec][hf_config]") {
  const std::string ds = R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 176, "vocab_size": 100,
    "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
    "head_dim": 8, "qk_head_dim": 24, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})";
  const shape s = parse_hf_config(ds, "x/config.json").s;
  // Its sizes are the MLA block's own keys.
  CHECK((megadsl::setting(s, "q_lora_rank") == 24 && megadsl::setting(s, "kv_lora_rank") == 32 &&
         megadsl::setting(s, "qk_nope_head_dim") == 16 && megadsl::setting(s, "v_head_dim") == 12));
  CHECK((megadsl::effective_head_dim(s).get() == 8 && s.rope_interleave.get()));  // head_dim: the rotated share
  // DeepseekV3Config's defaults: 3 dense layers, groups 8 / 4, x 2.5 (here clipped to the 4 layers' first 3).
  CHECK((s.dense_layers.get() == 7 && setting(s, "n_group") == 8 && setting(s, "topk_group") == 4 &&
         setting(s, "routed_scaling_factor") == 2.5));
  const shape direct = parse_hf_config(edited(ds, "\"q_lora_rank\": 24", "\"q_lora_rank\": null"), "x").s;
  CHECK(megadsl::setting(direct, "q_lora_rank") == 0);
  // 0 written as a number would build an empty q_a_proj in DeepseekV3Config: only null means none.
  CHECK_THAT(error_of(edited(ds, "\"q_lora_rank\": 24", "\"q_lora_rank\": 0")), Catch::Contains("q_lora_rank: is 0"));
  CHECK_THAT(error_of(edited(ds, "\"kv_lora_rank\": 32", "\"kv_lora_rank\": null")), Catch::Contains("kv_lora_rank: is null"));
  // Without qk_rope_head_dim (and head_dim) the class's 64, not hidden / heads.
  CHECK(megadsl::effective_head_dim(parse_hf_config(edited(edited(ds, "\"qk_rope_head_dim\": 8, ", ""), "\"head_dim\": 8, ", ""),
                                                    "x").s).get() == 64);
  CHECK(megadsl::parameter_count(direct) != megadsl::parameter_count(s));  // q_proj instead of q_a/q_b
  const std::string written = megadsl::hf_config_json(direct, "deepseek_v3", false, "float32", {});
  CHECK_THAT(written, Catch::Contains("\"q_lora_rank\": null") && Catch::Contains("\"qk_rope_head_dim\": 8"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, direct).empty());
  CHECK_THAT(error_of(edited(ds, "\"head_dim\": 8", "\"head_dim\": 24")),
             Catch::Contains("head_dim: is 24 (an integer) but qk_rope_head_dim is 8"));
  // YaRN (DeepSeek-V3's published RoPE): read with transformers' defaults, written back the same.
  const shape yarn = parse_hf_config(edited(ds, "\"rope_type\": \"default\"",
                                            "\"rope_type\": \"yarn\", \"factor\": 40.0, \"original_max_position_embeddings\": 4096, "
                                            "\"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"beta_fast\": null"), "x").s;
  CHECK((yarn.rope.type.get() == rope_type::yarn && yarn.rope.factor.get() == 40.0 && yarn.rope.beta_fast.get() == 32.0 &&
         yarn.rope.beta_slow.get() == 1.0 && yarn.rope.original_max_positions.get() == 4096 && yarn.rope.truncate.get()));
  CHECK(megadsl::rope_attention_factor(yarn.rope) == 1.0);  // m(40, 1) / m(40, 1)
  CHECK(megadsl::rope_attention_factor(parse_hf_config(edited(ds, "\"rope_type\": \"default\"",
      "\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32"), "x").s.rope) ==
        Approx(0.1 * std::log(4.0) + 1.0));
  CHECK(megadsl::mismatches(parse_hf_config(megadsl::hf_config_json(yarn, "deepseek_v3", false, "float32", {}), "w").s, yarn).empty());
  CHECK_THAT(error_of(edited(ds, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\", \"factor\": 40.0")),
             Catch::Contains("original_max_position_embeddings: missing"));
  CHECK_THAT(error_of(edited(ds, "\"v_head_dim\": 12", "\"v_head_dim\": 12, \"attention_bias\": true")),
             Catch::Contains("attention_bias"));
  // Context parallelism splits the heads over cp (Ulysses), the shared rotary key gathered.
  CHECK_FALSE(megadsl::check(s, layout{.cp = 2}).has("cp_splits_heads"));
}

TEST_CASE("Gemma 3 and OLMo 3: RoPE per layer type, their sliding patterns, Gemma 3's null soft-caps", "[spec][hf_config]") {
  const std::string g = R"({"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 12,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 176, "vocab_size": 100,
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})";
  const auto c = parse_hf_config(g, "x/config.json");
  CHECK((c.s.rope_theta.get() == 1e6 && c.s.rope.type.get() == rope_type::linear && c.s.local_rope_theta.get() == 1e4));
  CHECK((c.s.attn_softcap.get() == 0 && c.s.final_softcap.get() == 0 && c.s.query_pre_attn_scalar.get() == 256));
  // Gemma3TextConfig's defaults: a window of 4096 on five layers of six.
  CHECK((c.attention_window.size == 4096 && c.attention_window.of(4) == 4096 && c.attention_window.of(5) == 0 &&
         c.attention_window.of(11) == 0 && c.attention_window.of(6) == 4096));
  const std::string written = megadsl::hf_config_json(c.s, "gemma3_text", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("\"sliding_attention\"") && !Catch::Contains("\"rope_scaling\""));
  const auto back = parse_hf_config(written, "w");
  CHECK((megadsl::mismatches(back.s, c.s).empty() && back.attention_window == c.attention_window));
  // 4.x's form: rope_theta / rope_scaling for the full layers, rope_local_base_freq for the others.
  const auto legacy = parse_hf_config(R"({"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100, "rope_theta": 500000.0,
    "rope_local_base_freq": 20000.0, "sliding_window_pattern": 2})", "x");
  CHECK((legacy.s.rope_theta.get() == 5e5 && legacy.s.local_rope_theta.get() == 2e4 && legacy.attention_window.of(1) == 0));
  CHECK_THAT(error_of(edited(g, "\"rope_type\": \"default\", \"rope_theta\": 10000.0", "\"rope_type\": \"linear\", \"factor\": 2.0")),
             Catch::Contains("rope_parameters.sliding_attention.rope_type: is \"linear\""));
  // OLMo 3: every fourth layer full, both RoPEs of base 5e5 by default.
  const auto o = parse_hf_config(R"({"model_type": "olmo3", "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100})", "x");
  CHECK((o.s.local_rope_theta.get() == 5e5 && o.s.rope_theta.get() == 5e5 && o.attention_window.of(2) == 4096 &&
         o.attention_window.of(3) == 0));
  CHECK(megadsl::model_type_for(o.s, o.attention_window) == "olmo3");
  // A model with one RoPE everywhere cannot be written as OLMo 3's scaled-full-only form.
  shape scaled = o.s;
  scaled.local_rope_theta = 0.0;
  scaled.rope = {.type = rope_type::linear, .factor = 2.0};
  CHECK_THROWS_WITH(megadsl::hf_config_json(scaled, "olmo3", false, "float32", o.attention_window),
                    Catch::Contains("scales the full layers' RoPE only"));
}

TEST_CASE("EXAONE 4: no RoPE on the full layers exactly when a window is set", "[spec][hf_config]") {
  const std::string e = R"({"model_type": "exaone4", "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100,
    "sliding_window": 16, "sliding_window_pattern": 4})";
  const auto c = parse_hf_config(e, "x");
  CHECK((c.s.nope_layers.get() == ((1 << 3) | (1 << 7)) && c.attention_window.of(0) == 16 && c.attention_window.of(3) == 0));
  CHECK(megadsl::exaone4_layer(c.s, 3) == 1);
  const auto back = parse_hf_config(megadsl::hf_config_json(c.s, "exaone4", false, "float32", c.attention_window), "w");
  CHECK((megadsl::mismatches(back.s, c.s).empty() && back.attention_window == c.attention_window));
  // No window: RoPE everywhere (transformers' `sliding_window is None` branch), with every layer full;
  // a null window beside sliding layers is refused (Exaone4Config itself divides by a pattern of 0).
  CHECK(parse_hf_config(edited(e, "\"sliding_window\": 16, \"sliding_window_pattern\": 4",
                               "\"sliding_window\": null, \"layer_types\": [\"full_attention\", \"full_attention\", "
                               "\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\", "
                               "\"full_attention\", \"full_attention\"]"),
                        "x").s.nope_layers.get() == 0);
  CHECK_THAT(error_of(edited(e, "\"sliding_window\": 16", "\"sliding_window\": null")), Catch::Contains("is null while"));
  CHECK_THAT(error_of(edited(e, "\"sliding_window_pattern\": 4", "\"sliding_window_pattern\": \"LLLG\"")),
             Catch::Contains("sliding_window_pattern"));
}

TEST_CASE("ERNIE 4.5: RoPE on interleaved pairs, and one use_bias for q/k/v, o_proj and the MLP", "[spec][hf_config]") {
  const std::string e = R"({"model_type": "ernie4_5", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100})";
  const auto c = parse_hf_config(e, "x");
  // Ernie4_5Config's defaults: head_dim 128, theta 5e5, tied, no biases; the pairs always.
  CHECK((c.s.rope_interleave.get() && c.s.head_dim.get() == 128 && c.s.rope_theta.get() == 5e5 &&
         c.s.tie_embeddings.get() && !c.s.qkv_bias.get() && !c.s.out_bias.get() && !c.s.mlp_bias.get()));
  const auto b = parse_hf_config(edited(e, "\"vocab_size\": 100", "\"vocab_size\": 100, \"use_bias\": true"), "x");
  CHECK((b.s.qkv_bias.get() && b.s.out_bias.get() && b.s.mlp_bias.get()));
  CHECK(megadsl::model_type_for(b.s, b.attention_window) == "ernie4_5");
  const auto back = parse_hf_config(megadsl::hf_config_json(b.s, "ernie4_5", false, "float32", b.attention_window), "w");
  CHECK(megadsl::mismatches(back.s, b.s).empty());
  // What its config cannot say: biases on some projections only; halves; and Llama cannot say pairs.
  shape some = b.s;
  some.mlp_bias = false;
  CHECK_THROWS_WITH(megadsl::hf_config_json(some, "ernie4_5", false, "float32", b.attention_window),
                    Catch::Contains("one use_bias for q/k/v, o_proj and the MLP"));
  shape halves = c.s;
  halves.rope_interleave = false;
  CHECK_THROWS_WITH(megadsl::hf_config_json(halves, "ernie4_5", false, "float32", c.attention_window),
                    Catch::Contains("rotates interleaved pairs, and this model rotates halves"));
  CHECK_THROWS_WITH(megadsl::hf_config_json(c.s, "llama", false, "float32", c.attention_window),
                    Catch::Contains("rotates each head's halves, and this model rotates interleaved pairs"));
}

TEST_CASE("GLM-4: q/k/v biases unless attention_bias says not, RoPE on pairs of half of each head", "[spec][hf_config]") {
  const std::string g = R"({"model_type": "glm4", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100})";
  const auto c = parse_hf_config(g, "x");
  // Glm4Config's defaults: head_dim 128, partial_rotary_factor 0.5, attention_bias true, untied.
  CHECK((c.s.rope_interleave.get() && c.s.rotary_fraction.get() == 0.5 && c.s.head_dim.get() == 128 &&
         c.s.qkv_bias.get() && !c.s.out_bias.get() && !c.s.tie_embeddings.get()));
  CHECK(megadsl::model_type_for(c.s, c.attention_window) == "glm4");
  CHECK_FALSE(parse_hf_config(edited(g, "\"vocab_size\": 100", "\"vocab_size\": 100, \"attention_bias\": false"), "x").s.qkv_bias.get());
  const auto back = parse_hf_config(megadsl::hf_config_json(c.s, "glm4", false, "float32", c.attention_window), "w");
  CHECK(megadsl::mismatches(back.s, c.s).empty());
  shape o = c.s;
  o.out_bias = true;
  CHECK_THROWS_WITH(megadsl::hf_config_json(o, "glm4", false, "float32", c.attention_window),
                    Catch::Contains("no o_proj bias"));
}

TEST_CASE("the multi-token-prediction layers a DeepSeek-V3 or GLM-4.5 checkpoint stores are counted", "[spec][hf_config]") {
  const std::string g = R"({"model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100,
    "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1})";
  CHECK(parse_hf_config(g, "x").mtp_layers == 1);  // transformers skips one layer's names when the key is absent
  CHECK(parse_hf_config(edited(g, "\"vocab_size\": 100", "\"vocab_size\": 100, \"num_nextn_predict_layers\": 2"), "x").mtp_layers == 2);
  CHECK(parse_hf_config(edited(g, "\"vocab_size\": 100", "\"vocab_size\": 100, \"num_nextn_predict_layers\": 0"), "x").mtp_layers == 0);
  CHECK_THAT(error_of(edited(g, "\"vocab_size\": 100", "\"vocab_size\": 100, \"num_nextn_predict_layers\": -1")),
             Catch::Contains("num_nextn_predict_layers"));
  CHECK(parse_hf_config(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100})", "x").mtp_layers == 0);
}

TEST_CASE("Kimi K2's model_type reads as DeepSeek-V3's composition and is written back as it was", "[spec][hf_config]") {
  const std::string d = R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 176, "vocab_size": 100,
    "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16})";
  const auto ds = parse_hf_config(d, "x");
  const auto kimi = parse_hf_config(edited(d, "\"deepseek_v3\"", "\"kimi_k2\""), "x");
  CHECK(kimi.model_type == "kimi_k2");
  CHECK(megadsl::mismatches(kimi.s, ds.s).empty());
  const std::string written = megadsl::hf_config_json(kimi.s, "kimi_k2", false, "float32", kimi.attention_window);
  CHECK_THAT(written, Catch::Contains("\"model_type\": \"kimi_k2\"") && Catch::Contains("DeepseekV3ForCausalLM"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, kimi.s).empty());
}

TEST_CASE("HunYuan dense: its fixed NTK-alpha RoPE reads as plain RoPE on the stretched base", "[spec][hf_config]") {
  const std::string h = R"({"model_type": "hunyuan_v1_dense", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 176, "vocab_size": 100,
    "attention_bias": true,
    "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}})";
  const auto c = parse_hf_config(h, "x");
  CHECK(c.s.rope.type.get() == rope_type::none);
  CHECK(c.s.rope_theta.get() == 10000.0 * std::pow(1000.0, 16.0 / 14.0));  // as Python computes it
  CHECK((c.s.qkv_bias.get() && c.s.out_bias.get()));
  const auto back = parse_hf_config(megadsl::hf_config_json(c.s, "hunyuan_v1_dense", false, "float32", c.attention_window), "w");
  CHECK(megadsl::mismatches(back.s, c.s).empty());
  // Without alpha, "dynamic" is transformers' dynamic NTK, as for Llama.
  CHECK(parse_hf_config(edited(h, "\"alpha\": 1000.0, ", ""), "x").s.rope.type.get() == rope_type::dynamic_ntk);
  CHECK_THAT(error_of(edited(h, "\"alpha\": 1000.0", "\"alpha\": -1.0")), Catch::Contains("rope_parameters.alpha"));
}

TEST_CASE("Granite: its four multipliers, its blocks' own keys, read, written back, and refused where a config has none", "[spec][hf_config]") {
  const std::string g = R"({"model_type": "granite", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100,
    "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125, "logits_scaling": 8,
    "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": true})";
  const auto c = parse_hf_config(g, "x");
  CHECK(setting(c.s, "embedding_multiplier") == 12.0);
  CHECK(setting(c.s, "residual_multiplier") == 0.22);
  CHECK(setting(c.s, "attention_multiplier") == 0.0078125);
  CHECK(setting(c.s, "logits_scaling") == 8.0);
  for (const std::string& n : c.notes)  // (the defaults of the keys left out are noted; these are read)
    CHECK((n.find("multiplier") == std::string::npos && n.find("logits_scaling") == std::string::npos));
  const std::string written = megadsl::hf_config_json(c.s, "granite", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("GraniteForCausalLM") && Catch::Contains("\"logits_scaling\": 8.0"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, c.s).empty());
  // GraniteConfig's defaults: every multiplier 1.0 (the scores' scale too).
  const auto plain = parse_hf_config(R"({"model_type": "granite", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100})", "x");
  CHECK((setting(plain.s, "embedding_multiplier") == 1.0 && setting(plain.s, "attention_multiplier") == 1.0 &&
         setting(plain.s, "logits_scaling") == 1.0 && setting(plain.s, "residual_multiplier") == 1.0));
  CHECK_THAT(error_of(edited(g, "\"attention_multiplier\": 0.0078125", "\"attention_multiplier\": 0")),
             Catch::Contains("attention_multiplier") && Catch::Contains("where the block takes at least"));
  CHECK_THAT(error_of(edited(g, "\"logits_scaling\": 8", "\"logits_scaling\": 0")), Catch::Contains("logits_scaling"));
  CHECK_THAT(error_of(edited(g, "\"logits_scaling\": 8", "\"logits_scaling\": \"8\"")), Catch::Contains("logits_scaling"));
  // Granite's composition (Llama's blocks with its multipliers): Granite's config writes it, Llama's
  // refuses and names Granite's.
  CHECK(megadsl::model_type_for(c.s, c.attention_window) == "granite");
  CHECK_THROWS_WITH(megadsl::hf_config_json(c.s, "llama", false, "float32", c.attention_window), Catch::Contains("granite"));
  // A Granite checkpoint is written as Granite whatever its multipliers; a Llama model as Llama.
  CHECK(megadsl::model_type_for(plain.s, plain.attention_window) == "granite");
  CHECK(megadsl::model_type_for(megadsl::tiny_llama3::shape, {}) == "llama");
}

TEST_CASE("Cohere2: RoPE on the sliding layers only, its logit_scale, one LayerNorm's eps", "[spec][hf_config]") {
  const std::string c2 = R"({"model_type": "cohere2", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100,
    "layer_norm_eps": 1e-05, "logit_scale": 0.5, "sliding_window": 5, "sliding_window_pattern": 4})";
  const auto c = parse_hf_config(c2, "x");
  CHECK(setting(c.s, "logit_scale") == 0.5);
  CHECK(c.s.rms_eps.get() == 1e-5);
  CHECK(c.s.rope_interleave.get());
  CHECK(c.s.tie_embeddings.get());  // Cohere2Config's default
  CHECK(c.s.nope_layers.get() == 0b1000);  // layer 3 is full and rotates nothing
  CHECK((c.attention_window.size == 5 && c.attention_window.of(0) == 5 && c.attention_window.of(3) == 0));
  const std::string written = megadsl::hf_config_json(c.s, "cohere2", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("Cohere2ForCausalLM") && Catch::Contains("\"logit_scale\": 0.5"));
  const auto back = parse_hf_config(written, "w");
  CHECK(megadsl::mismatches(back.s, c.s).empty());
  CHECK(back.attention_window.of(2) == 5);
  // sliding_window null beside sliding layers: transformers' Cohere2 fails (its sliding layers take a
  // None window), so it is refused naming the key; with every layer full, none slides or rotates.
  CHECK_THAT(error_of(edited(c2, "\"sliding_window\": 5", "\"sliding_window\": null")),
             Catch::Contains("sliding_window") && Catch::Contains("is null while the layer pattern has sliding layers"));
  const auto none = parse_hf_config(edited(c2, "\"sliding_window\": 5", "\"sliding_window\": null, \"layer_types\": "
                                               "[\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\"]"), "x");
  CHECK(!none.attention_window.any());
  CHECK(none.s.nope_layers.get() == 0b1111);
  const auto none_back = parse_hf_config(megadsl::hf_config_json(none.s, "cohere2", false, "float32", none.attention_window), "w");
  CHECK((none_back.s.nope_layers.get() == 0b1111 && !none_back.attention_window.any()));
  // The defaults: logit_scale 0.0625, a window of 4096 on three layers of four.
  const auto plain = parse_hf_config(edited(edited(c2, ", \"logit_scale\": 0.5", ""), ", \"sliding_window\": 5", ""), "x");
  CHECK((setting(plain.s, "logit_scale") == 0.0625 && plain.attention_window.size == 4096));
  // A model whose NoPE layers are not exactly the full ones has no Cohere2 config; Llama's has no logit_scale.
  megadsl::shape other = c.s;
  other.nope_layers = 0;
  CHECK_THROWS_WITH(megadsl::hf_config_json(other, "cohere2", false, "float32", c.attention_window),
                    Catch::Contains("rotates exactly the sliding layers"));
  CHECK_THAT(error_of(edited(c2, "\"logit_scale\": 0.5", "\"logit_scale\": true")), Catch::Contains("logit_scale"));
  // Command A's 64 layers: layer 63 is full and rotates nothing (bit 63 of the mask); a 68th is refused.
  const auto wide = parse_hf_config(edited(c2, "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 64"), "x");
  CHECK((megadsl::nope_layer(wide.s, 63) && megadsl::nope_layer(wide.s, 59) && !megadsl::nope_layer(wide.s, 62)));
  const auto wide_back = parse_hf_config(megadsl::hf_config_json(wide.s, "cohere2", false, "float32", wide.attention_window), "w");
  CHECK((megadsl::mismatches(wide_back.s, wide.s).empty() && wide_back.attention_window.of(63) == 0));
  CHECK_THAT(error_of(edited(c2, "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 68")),
             Catch::Contains("first 64 only"));
}

TEST_CASE("HunYuan MoE: moe_topk one per layer, its shared MLP of intermediate_size", "[spec][hf_config]") {
  const std::string h = R"({"model_type": "hunyuan_v1_moe", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 176, "vocab_size": 100,
    "num_experts": 8, "moe_topk": [2, 2], "attention_bias": false})";
  const auto c = parse_hf_config(h, "x");
  CHECK((c.s.experts.get() == 8 && c.s.top_k.get() == 2 && c.s.norm_topk.get()));
  CHECK((c.s.expert_ffn.get() == 0 && c.s.shared_expert_ffn.get() == 176));
  const std::string written = megadsl::hf_config_json(c.s, "hunyuan_v1_moe", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("\"moe_topk\": 2") && Catch::Contains("HunYuanMoEV1ForCausalLM"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, c.s).empty());
  CHECK(parse_hf_config(edited(h, "[2, 2]", "3"), "x").s.top_k.get() == 3);
  CHECK_THAT(error_of(edited(h, "[2, 2]", "[2, 4]")), Catch::Contains("moe_topk") && Catch::Contains("one top-k for every layer"));
  CHECK_THAT(error_of(edited(h, "[2, 2]", "[2]")), Catch::Contains("one per layer (2)"));
  megadsl::shape narrow = c.s;
  narrow.shared_expert_ffn = 64;
  CHECK_THROWS_WITH(megadsl::hf_config_json(narrow, "hunyuan_v1_moe", false, "float32", c.attention_window),
                    Catch::Contains("shared MLP by intermediate_size"));
}

TEST_CASE("Apertus: xIELU only, its RoPE stated, all four biases by attention_bias", "[spec][hf_config]") {
  const std::string a = R"({"model_type": "apertus", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 100,
    "hidden_act": "xielu", "attention_bias": true, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}})";
  const auto c = parse_hf_config(a, "x");
  CHECK((c.s.qkv_bias.get() && c.s.out_bias.get() && !c.s.tie_embeddings.get()));
  CHECK((c.s.rope.type.get() == megadsl::rope_type::llama3 && c.s.rope_theta.get() == 10000.0));
  CHECK(c.s.max_positions.get() == 65536);  // ApertusConfig's default
  const std::string written = megadsl::hf_config_json(c.s, "apertus", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("ApertusForCausalLM") && Catch::Contains("\"hidden_act\": \"xielu\"") &&
                          Catch::Contains("\"rope_parameters\"") && !Catch::Contains("rope_scaling"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, c.s).empty());
  // Plain RoPE is written as rope_parameters too (ApertusConfig ignores a rope_theta alone).
  const auto plain = parse_hf_config(edited(a, R"("rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 32)", R"("rope_type": "default", "rope_theta": 500.0)"), "x");
  CHECK((plain.s.rope.type.get() == megadsl::rope_type::none && plain.s.rope_theta.get() == 500.0));
  const std::string plain_written = megadsl::hf_config_json(plain.s, "apertus", false, "float32", plain.attention_window);
  CHECK_THAT(plain_written, Catch::Contains("\"rope_type\": \"default\""));
  CHECK(parse_hf_config(plain_written, "w").s.rope_theta.get() == 500.0);
  CHECK_THAT(error_of(edited(a, "\"xielu\"", "\"silu\"")), Catch::Contains("hidden_act") && Catch::Contains("xIELU"));
  const std::string no_rope = R"({"model_type": "apertus", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100, "rope_theta": 500.0})";
  CHECK_THAT(error_of(no_rope), Catch::Contains("rope_parameters") && Catch::Contains("whatever rope_theta"));
}

TEST_CASE("gpt-oss: biases on unless said, window 128 on alternate layers, the clamped SwiGLU's keys, YaRN stated", "[spec][hf_config]") {
  const std::string g = R"({"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48, "vocab_size": 100,
    "num_local_experts": 4, "num_experts_per_tok": 2, "swiglu_limit": 1.0, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                        "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096}})";
  const auto c = parse_hf_config(g, "x");
  CHECK((c.s.qkv_bias.get() && c.s.out_bias.get() && !c.s.tie_embeddings.get()));  // attention_bias: true by default
  CHECK((c.s.experts.get() == 4 && c.s.top_k.get() == 2 && c.s.norm_topk.get() && megadsl::expert_ffn_of(c.s).get() == 48));
  CHECK((megadsl::setting(c.s, "swiglu_alpha") == 1.702 && megadsl::setting(c.s, "swiglu_limit") == 1.0));
  CHECK((c.s.rope.type.get() == megadsl::rope_type::yarn && !c.s.rope.truncate.get() && c.s.rope_theta.get() == 150000.0));
  // Layer 0 slides, layer 1 attends in full, ...; the window is the class default, 128.
  CHECK((c.attention_window.size == 128 && c.attention_window.of(0) == 128 && c.attention_window.of(1) == 0 &&
         c.attention_window.of(2) == 128));
  const std::string written = megadsl::hf_config_json(c.s, "gpt_oss", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("GptOssForCausalLM") && Catch::Contains("\"swiglu_limit\": 1.0") &&
                          Catch::Contains("\"sliding_window\": 128") && Catch::Contains("\"num_local_experts\": 4"));
  const auto back = parse_hf_config(written, "w");
  CHECK(megadsl::mismatches(back.s, c.s).empty());
  CHECK(back.attention_window == c.attention_window);
  // hidden_act changes nothing (the experts' SwiGLU is their own); a limit must be positive.
  CHECK(megadsl::setting(parse_hf_config(edited(g, "\"silu\"", "\"gelu\""), "x").s, "swiglu_limit") == 1.0);
  CHECK_THAT(error_of(edited(g, "\"swiglu_limit\": 1.0", "\"swiglu_limit\": 0.0")), Catch::Contains("swiglu_limit"));
  const auto off = parse_hf_config(edited(g, "\"hidden_act\"", "\"attention_bias\": false, \"hidden_act\""), "x");
  CHECK((!off.s.qkv_bias.get() && !off.s.out_bias.get()));
  // Without rope_parameters GptOssConfig substitutes its own YaRN: refused, not guessed.
  const std::string no_rope = R"({"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 48, "vocab_size": 100, "num_local_experts": 4})";
  CHECK_THAT(error_of(no_rope), Catch::Contains("rope_parameters"));
  // The keys are the mixture block's own (a block's config_setting): gpt-oss's composition declares
  // them, Mixtral's does not (there swiglu_limit is a key transformers ignores, and so megadsl).
  CHECK(megadsl::setting_index(*c.s.arch, "swiglu_limit") >= 0);
  const auto mixtral = parse_hf_config(R"({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 48, "vocab_size": 100, "num_local_experts": 4, "swiglu_limit": 7.0})", "m");
  CHECK(megadsl::setting_index(*mixtral.s.arch, "swiglu_limit") < 0);
  CHECK_THAT(megadsl::hf_config_json(mixtral.s, "mixtral", false, "float32", {}), !Catch::Contains("swiglu"));
}

TEST_CASE("Llama 4: the MLP widths' own keys, interleaved mixtures, NoPE layers, chunks, q/k norm and temperature", "[spec][hf_config]") {
  const std::string l = R"({"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
    "intermediate_size_mlp": 96, "vocab_size": 100, "num_local_experts": 4, "interleave_moe_layer_step": 2,
    "no_rope_layers": [], "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
    "low_freq_factor": 1.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}})";
  const auto c = parse_hf_config(l, "x");
  // The dense MLP from intermediate_size_mlp, each expert and the shared one from intermediate_size.
  CHECK((c.s.ffn.get() == 96 && megadsl::expert_ffn_of(c.s).get() == 48 && c.s.shared_expert_ffn.get() == 48));
  CHECK((c.s.experts.get() == 4 && c.s.top_k.get() == 1 && !c.s.norm_topk.get()));
  // Odd layers route (interleave_moe_layer_step 2); an empty no_rope_layers is the default: 3 and 7 NoPE.
  for (std::int64_t i = 0; i < 8; ++i) {
    CHECK(megadsl::layer_routes(c.s, i) == (i % 2 == 1));
    CHECK(megadsl::nope_layer(c.s, i) == (i == 3 || i == 7));
  }
  // The blocks' own keys at Llama4TextConfig's defaults: chunks of 8192, the q/k norm, temperature
  // tuning by 8192 and 0.1.
  CHECK((setting(c.s, "attention_chunk_size") == 8192 && setting(c.s, "use_qk_norm") == 1 &&
         setting(c.s, "attn_temperature_tuning") == 1 && setting(c.s, "floor_scale") == 8192.0 &&
         setting(c.s, "attn_scale") == 0.1 && c.s.rope_interleave.get() && c.s.rope.low_freq_factor.get() == 1.0));
  const std::string written = megadsl::hf_config_json(c.s, "llama4_text", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("Llama4ForCausalLM") && Catch::Contains("\"intermediate_size_mlp\": 96") &&
                          Catch::Contains("\"intermediate_size\": 48") && Catch::Contains("\"moe_layers\"") &&
                          Catch::Contains("\"chunked_attention\"") && Catch::Contains("\"attention_chunk_size\": 8192"));
  const auto back = parse_hf_config(written, "w");
  for (const std::string& m : megadsl::mismatches(back.s, c.s)) FAIL_CHECK(m);
  // moe_layers overrides the step; use_qk_norm and temperature tuning can be off.
  const auto listed = parse_hf_config(edited(l, "\"no_rope_layers\"", "\"moe_layers\": [0, 5], \"use_qk_norm\": false, "
                                                                      "\"attn_temperature_tuning\": false, \"no_rope_layers\""), "x");
  for (std::int64_t i = 0; i < 8; ++i) CHECK(megadsl::layer_routes(listed.s, i) == (i == 0 || i == 5));
  CHECK((setting(listed.s, "use_qk_norm") == 0 && setting(listed.s, "attn_temperature_tuning") == 0));
  // Tested for truth as Llama4TextAttention does: null and 0 are off, a number on.
  const auto truth = [&](const char* key, const char* value) {
    return setting(parse_hf_config(edited(l, "\"no_rope_layers\"", "\"" + std::string(key) + "\": " + value + ", \"no_rope_layers\""), "x").s, key);
  };
  CHECK((truth("use_qk_norm", "null") == 0 && truth("attn_temperature_tuning", "null") == 0 &&
         truth("attn_temperature_tuning", "0") == 0 && truth("attn_temperature_tuning", "4") == 1));
  CHECK_THAT(error_of(edited(l, "\"no_rope_layers\"", "\"use_qk_norm\": \"yes\", \"no_rope_layers\"")),
             Catch::Contains("use_qk_norm") && Catch::Contains("true or false"));
  CHECK(megadsl::kind_of_layer(listed.s, 0) == 3 + 1);  // a RoPE layer without the q/k norm, routed
  CHECK(megadsl::kind_of_layer(listed.s, 3) == 2);      // NoPE, dense
  // Refused: a null chunk (HF cannot build the mask), layer types that chunk a NoPE layer, a zero floor_scale.
  CHECK_THAT(error_of(edited(l, "\"no_rope_layers\"", "\"attention_chunk_size\": null, \"no_rope_layers\"")),
             Catch::Contains("attention_chunk_size"));
  CHECK_THAT(error_of(edited(l, "\"no_rope_layers\": []", "\"no_rope_layers\": [1, 1, 1, 0, 1, 1, 1, 0], \"layer_types\": "
                                "[\"chunked_attention\", \"chunked_attention\", \"chunked_attention\", \"chunked_attention\", "
                                "\"chunked_attention\", \"chunked_attention\", \"chunked_attention\", \"full_attention\"]")),
             Catch::Contains("layer_types") && Catch::Contains("layer 3"));
  // A zero floor_scale with the tuning on is refused by the attention block's rule; with it off it is unused.
  const auto floor0 = parse_hf_config(edited(l, "\"no_rope_layers\"", "\"floor_scale\": 0, \"no_rope_layers\""), "x");
  CHECK(megadsl::check(floor0.s, megadsl::layout{}).has("floor_scale_positive"));
  CHECK(megadsl::check(parse_hf_config(edited(l, "\"no_rope_layers\"", "\"floor_scale\": 0, \"attn_temperature_tuning\": false, "
                                                 "\"no_rope_layers\""), "x").s, megadsl::layout{}).ok());
  // The written config reads back the same keys, the chunk as an integer.
  CHECK_THAT(megadsl::hf_config_json(listed.s, "llama4_text", false, "float32", listed.attention_window),
             Catch::Contains("\"use_qk_norm\": false") && Catch::Contains("\"attn_temperature_tuning\": false"));
  // Llama 4 as published: the multimodal class's config, its text model read from text_config (a
  // key's error names where it is), the LM head tied by the top level (Llama4Config's default: not).
  CHECK_THAT(error_of(R"({"model_type": "llama4", "text_config": {"model_type": "llama4_text", "hidden_size": 64}})"),
             Catch::Contains("text_config.num_hidden_layers: missing"));
  const auto wrapped = parse_hf_config(R"({"model_type": "llama4", "text_config": )" + l + "}", "mm");
  CHECK((wrapped.wrapper == "llama4" && wrapped.model_type == "llama4_text"));
  for (const std::string& x : megadsl::mismatches(wrapped.s, parse_hf_config(l, "x").s)) FAIL_CHECK(x);
  const auto tied = parse_hf_config(R"({"model_type": "llama4", "tie_word_embeddings": true, "text_config": )" + l + "}", "mm");
  CHECK(tied.s.tie_embeddings.get());
  CHECK_THAT(tied.notes, Catch::VectorContains(std::string("text_config.tie_word_embeddings is false, but "
                                                           "Llama4ForConditionalGeneration ties its LM head by the top level's (true): using that")));
  // A multimodal class megadsl does not know to run the text model as it is: refused, with the way out.
  CHECK_THAT(error_of(R"({"model_type": "llava", "text_config": )" + l + "}"),
             Catch::Contains("\"llava\" is a multimodal checkpoint") && Catch::Contains("\"llama4_text\"") &&
                 Catch::Contains("save_pretrained(out)"));
  // Each text family names its own multimodal class (family_config::multimodal): Gemma 3's class
  // around Llama 4's text model is not one megadsl knows to run as it is; the message lists them.
  CHECK_THAT(error_of(R"({"model_type": "gemma3", "text_config": )" + l + "}"),
             Catch::Contains("\"gemma3\" is a multimodal checkpoint") && Catch::Contains("\"llama4\"") &&
                 Catch::Contains("\"qwen3_5_moe\""));
}

TEST_CASE("Cohere: RoPE on pairs everywhere, logit_scale, Command R+'s q/k norms by use_qk_norm", "[spec][hf_config]") {
  const std::string c1 = R"({"model_type": "cohere", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100, "layer_norm_eps": 1e-05,
    "logit_scale": 0.0625, "use_qk_norm": false})";
  const auto c = parse_hf_config(c1, "x");
  CHECK((setting(c.s, "logit_scale") == 0.0625 && c.s.rope_interleave.get() && c.s.tie_embeddings.get()));
  CHECK((c.s.nope_layers.get() == 0 && !c.attention_window.any()));
  const auto back = parse_hf_config(megadsl::hf_config_json(c.s, "cohere", false, "float32", c.attention_window), "w");
  CHECK(megadsl::mismatches(back.s, c.s).empty());
  // use_qk_norm (Command R+): q_norm (heads, d) and k_norm (kv_heads, d) on every layer, each split
  // over tp with its heads; written back; a model declared without them refuses such a checkpoint.
  const shape normed = parse_hf_config(edited(c1, "\"use_qk_norm\": false", "\"use_qk_norm\": true"), "x").s;
  CHECK((setting(normed, "use_qk_norm") == 1 && setting(c.s, "use_qk_norm") == 0));
  const auto* k_norm = megadsl::find_row(megadsl::arch_of(normed), "layers.{layer}.k_norm.weight");
  REQUIRE(k_norm != nullptr);
  CHECK(k_norm->hf[0] == "model.layers.{layer}.self_attn.k_norm.weight");
  CHECK((k_norm->layer_kinds >> megadsl::kind_of_layer(normed, 0) & 1u) == 1u);
  CHECK((k_norm->layer_kinds >> megadsl::kind_of_layer(c.s, 0) & 1u) == 0u);
  CHECK(megadsl::parameter_count(normed) == megadsl::parameter_count(c.s) + 2 * (4 + 4) * 16);  // 2 layers, 4 + 4 heads of 16
  const megadsl::param_plan q_plan = megadsl::plan_of(*megadsl::find_row(megadsl::arch_of(normed), "layers.{layer}.q_norm.weight"),
                                                      normed, layout{.tp = 2});
  CHECK((q_plan.hf_shapes[0] == megadsl::mat(4, 16) && q_plan.local == megadsl::mat(2, 16) && q_plan.split_dim == 0));
  const std::string written = megadsl::hf_config_json(normed, "cohere", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("\"use_qk_norm\": true"));
  CHECK(megadsl::mismatches(parse_hf_config(written, "w").s, normed).empty());
  CHECK_FALSE(megadsl::mismatches(normed, c.s).empty());
  // The k norm's weights follow the kv heads over tp: 2 kv heads over tp 4, each rank its group's.
  const shape gqa = parse_hf_config(edited(edited(c1, "\"use_qk_norm\": false", "\"use_qk_norm\": true"),
                                           "\"num_attention_heads\": 4", "\"num_attention_heads\": 4, \"num_key_value_heads\": 2"), "x").s;
  CHECK(megadsl::check(gqa, layout{.tp = 4}).ok());
  const megadsl::param_plan k_plan = megadsl::plan_of(*megadsl::find_row(megadsl::arch_of(gqa), "layers.{layer}.k_norm.weight"),
                                                      gqa, layout{.tp = 4});
  CHECK((k_plan.hf_shapes[0] == megadsl::mat(2, 16) && k_plan.local == megadsl::mat(1, 16) &&
         k_plan.global == megadsl::mat(4, 16) && k_plan.split_dim == 0));
}

TEST_CASE("Qwen3-Next: the linear layers by interval or layer_types, the DeltaNet's heads, a quarter of each head rotated",
          "[spec][hf_config]") {
  const std::string q = R"({"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
    "num_experts": 16, "mlp_only_layers": [1], "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 8, "rope_parameters": {"rope_type": "default",
    "rope_theta": 10000000.0}})";
  const auto c = parse_hf_config(q, "x");
  // Qwen3NextConfig's defaults: head_dim 256, a quarter rotated, top 10 renormalised, experts and the
  // shared expert of 512, a conv of 4, full attention every fourth layer.
  CHECK((megadsl::effective_head_dim(c.s).get() == 256 && c.s.rotary_fraction.get() == 0.25 && c.s.top_k.get() == 10 &&
         c.s.norm_topk.get() && megadsl::expert_ffn_of(c.s).get() == 512 && c.s.shared_expert_ffn.get() == 512));
  // The DeltaNet's sizes: its block's own keys.
  CHECK((setting(c.s, "linear_num_key_heads") == 2 && setting(c.s, "linear_num_value_heads") == 4 &&
         setting(c.s, "linear_key_head_dim") == 16 && setting(c.s, "linear_value_head_dim") == 8 &&
         setting(c.s, "linear_conv_kernel_dim") == 4));
  for (std::int64_t i = 0; i < 8; ++i) {
    CHECK(megadsl::linear_layer(c.s, i) == (i % 4 != 3));
    // Kinds: 0 linear, 1 full, + 2 routed (every layer but 1).
    CHECK(megadsl::kind_of_layer(c.s, i) == (i % 4 != 3 ? 0 : 1) + (i == 1 ? 0 : 2));
  }
  const std::string written = megadsl::hf_config_json(c.s, "qwen3_next", false, "float32", c.attention_window);
  CHECK_THAT(written, Catch::Contains("Qwen3NextForCausalLM") && Catch::Contains("\"linear_attention\"") &&
                          Catch::Contains("\"linear_num_value_heads\": 4") && Catch::Contains("\"partial_rotary_factor\": 0.25"));
  const auto back = parse_hf_config(written, "w");
  for (const std::string& m : megadsl::mismatches(back.s, c.s)) FAIL_CHECK(m);
  // layer_types overrides the interval.
  const auto typed = parse_hf_config(edited(q, "\"num_experts\"", "\"layer_types\": [\"full_attention\", \"linear_attention\", "
      "\"linear_attention\", \"linear_attention\", \"linear_attention\", \"linear_attention\", \"linear_attention\", "
      "\"full_attention\"], \"num_experts\""), "x");
  for (std::int64_t i = 0; i < 8; ++i) CHECK(megadsl::linear_layer(typed.s, i) == (i != 0 && i != 7));
  const auto every2 = parse_hf_config(edited(q, "\"num_experts\"", "\"full_attention_interval\": 2, \"num_experts\""), "x");
  for (std::int64_t i = 0; i < 8; ++i) CHECK(megadsl::linear_layer(every2.s, i) == (i % 2 == 0));
  // Refused: a layer type it does not have, a list of the wrong length, value heads not whole per key head.
  CHECK_THAT(error_of(edited(q, "\"num_experts\"", "\"layer_types\": [\"sliding_attention\", \"full_attention\", "
      "\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\", "
      "\"full_attention\"], \"num_experts\"")), Catch::Contains("layer_types") && Catch::Contains("sliding_attention"));
  CHECK_THAT(error_of(edited(q, "\"num_experts\"", "\"layer_types\": [\"full_attention\"], \"num_experts\"")),
             Catch::Contains("one entry per layer"));
  const auto odd = parse_hf_config(edited(q, "\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 3"), "x");
  CHECK(megadsl::check(odd.s, layout{}).has("linear_value_heads_per_key_head"));
  CHECK_THAT(error_of(edited(q, "\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 0")),
             Catch::Contains("linear_num_value_heads") && Catch::Contains("at least 1"));
  // Its layouts: whole key heads per tp rank (kv heads may be fewer than ranks: replicated), and of
  // those an equal share per cp rank (Ulysses).
  megadsl::shape s = c.s;
  CHECK(megadsl::check(s, megadsl::layout{.tp = 2}).ok());
  const auto tp4 = megadsl::check(s, megadsl::layout{.tp = 4});
  CHECK((tp4.count == 1 && tp4.has("linear_heads_divisible_by_tp")));
  s.settings.set("linear_num_key_heads", 4);
  s.settings.set("linear_num_value_heads", 8);
  CHECK(megadsl::check(s, megadsl::layout{.tp = 4}).ok());  // 2 kv heads over 4 ranks
  CHECK(megadsl::check(s, megadsl::layout{.tp = 2, .cp = 2}).ok());
  const auto cp8 = megadsl::check(s, megadsl::layout{.cp = 8});
  CHECK((cp8.has("cp_splits_heads") && std::string(cp8.joined().view()).find("linear_num_key_heads = 4 is not divisible by tp x cp = 8") != std::string::npos));
}

TEST_CASE("Qwen3.5: its text models' configs, the DeltaNet's projections stored apart, mixtures in every layer",
          "[spec][hf_config]") {
  const std::string d = R"({"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "layer_types": ["linear_attention", "full_attention",
    "linear_attention", "full_attention"], "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true}})";
  const auto c = parse_hf_config(d, "x");
  CHECK((c.model_type == "qwen3_5_text" && c.s.rotary_fraction.get() == 0.25 && c.s.experts.get() == 0));
  for (std::int64_t i = 0; i < 4; ++i) CHECK(megadsl::kind_of_layer(c.s, i) == (i % 2 == 0 ? 0 : 1));
  const auto back = parse_hf_config(megadsl::hf_config_json(c.s, "qwen3_5_text", false, "float32", c.attention_window), "w");
  for (const std::string& m : megadsl::mismatches(back.s, c.s)) FAIL_CHECK(m);
  // The MoE text model: no dense width (the experts' is the shape's ffn), every layer routes, top 8 renormalised.
  const std::string m = R"({"model_type": "qwen3_5_moe_text", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "num_experts": 16,
    "moe_intermediate_size": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4})";
  const auto e = parse_hf_config(m, "x");
  CHECK((e.s.top_k.get() == 8 && e.s.norm_topk.get() && megadsl::expert_ffn_of(e.s).get() == 32 && e.s.shared_expert_ffn.get() == 512));
  for (std::int64_t i = 0; i < 4; ++i) CHECK(megadsl::layer_routes(e.s, i));
  const std::string written = megadsl::hf_config_json(e.s, "qwen3_5_moe_text", false, "float32", e.attention_window);
  CHECK_THAT(written, Catch::Contains("Qwen3_5MoeForCausalLM") && !Catch::Contains("mlp_only_layers") &&
                          !Catch::Contains("decoder_sparse_step") && !Catch::Contains("norm_topk_prob"));
  const auto eback = parse_hf_config(written, "w");
  for (const std::string& x : megadsl::mismatches(eback.s, e.s)) FAIL_CHECK(x);
  // The published multimodal checkpoints: their text model read, untied unless the top level says
  // so (Qwen3_5Config's default); an error names the key inside text_config. Qwen3.5-9B's config
  // as the hub has it (its vision_config abridged): the preset's shape and count, its MTP and
  // gate keys reported as transformers ignores them.
  const std::string q9 = R"({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "image_token_id": 248056, "tie_word_embeddings": false, "vision_config": {"depth": 27, "hidden_size": 1152,
    "model_type": "qwen3_5", "out_hidden_size": 4096, "patch_size": 16}, "text_config": {"attn_output_gate": true,
    "dtype": "bfloat16", "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 12288, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false,
    "num_attention_heads": 16, "num_hidden_layers": 32, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "vocab_size": 248320, "mamba_ssm_dtype": "float32", "attention_bias": false, "attention_dropout": 0.0,
    "tie_word_embeddings": false, "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
    "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}})";
  const auto nine = parse_hf_config(q9, "Qwen3.5-9B/config.json");
  CHECK((nine.wrapper == "qwen3_5" && nine.model_type == "qwen3_5_text"));
  for (const std::string& x : megadsl::mismatches(megadsl::qwen3_5_9b::shape, nine.s)) FAIL_CHECK(x);
  CHECK(megadsl::parameter_count(nine.s) == megadsl::qwen3_5_9b::published_params);
  CHECK_THAT(error_of(R"({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "hidden_size": 64}})"),
             Catch::Contains("text_config.num_hidden_layers: missing"));
}

TEST_CASE("register_family refuses a model_type registered already, naming both; the same one again is a no-op",
          "[spec][hf_config]") {
  static constexpr megadsl::family_config mine{.model_type = "llama", .hf_class = "MyLlama", .display = "my Llama",
                                               .arch = megadsl::llama_config.arch};
  CHECK_THROWS_WITH(megadsl::register_family(mine),
                    Catch::Contains("model_type \"llama\" is registered already, by megadsl (") &&
                        Catch::Contains("this one (my Llama, MyLlama) would never be used"));
  static constexpr megadsl::family_config own{.model_type = "my_llama_variant", .hf_class = "MyLlama",
                                              .display = "my Llama", .arch = megadsl::llama_config.arch};
  megadsl::register_family(own);
  megadsl::register_family(own);  // the same declaration again
  static constexpr megadsl::family_config again{.model_type = "my_llama_variant", .hf_class = "Other",
                                                .display = "another", .arch = megadsl::llama_config.arch};
  CHECK_THROWS_WITH(megadsl::register_family(again), Catch::Contains("registered already, by this program (my Llama"));
}

namespace {
// A user's family with a reading of its own (family_config::read_own): its key scales rope_theta.
void my_theta_scale(const megadsl::config_view& c, megadsl::shape& s) {
  const std::optional<double> k = c.number("my_rope.theta_scale");
  if (!k) return;
  if (*k <= 0) c.fail("my_rope.theta_scale", "is " + c.shown(*k), "give a positive scale");
  c.note("my_rope.theta_scale " + c.shown(*k) + " applied");
  s.rope_theta = s.rope_theta.get() * *k;
}
constexpr megadsl::config_key_rule my_keys[] = {{"my_rope", megadsl::key_use::read}};
}  // namespace

TEST_CASE("A family's own reading (read_own) sees config.json through config_view, with no core edit", "[spec][hf_config]") {
  static constexpr megadsl::family_config mine{.model_type = "my_scaled_llama", .hf_class = "MyScaledLlama",
                                               .display = "my scaled Llama", .arch = megadsl::llama_config.arch,
                                               .read_own = &my_theta_scale, .keys = my_keys};
  megadsl::register_family(mine);
  const std::string cfg = R"({"model_type": "my_scaled_llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 100, "rope_theta": 1000.0,
    "my_rope": {"theta_scale": 2.5}})";
  const auto c = parse_hf_config(cfg, "mine/config.json");
  CHECK(c.s.rope_theta.get() == 2500.0);
  CHECK(std::find(c.notes.begin(), c.notes.end(), "my_rope.theta_scale 2.5 applied") != c.notes.end());
  CHECK(parse_hf_config(edited(cfg, "\"theta_scale\": 2.5", "\"other\": 1"), "x").s.rope_theta.get() == 1000.0);
  CHECK_THAT(error_of(edited(cfg, "\"theta_scale\": 2.5", "\"theta_scale\": -1")),
             Catch::Contains("my_rope.theta_scale: is -1.0; give a positive scale"));
  CHECK_THAT(error_of(edited(cfg, "\"theta_scale\": 2.5", "\"theta_scale\": \"big\"")),
             Catch::Contains("my_rope.theta_scale: expected a number"));
}
