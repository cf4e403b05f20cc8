// The README's opening lines, compiled (with the torch-free header; the README shows the umbrella).
#include "megadsl/spec.hpp"
#include "megadsl/models/llama.hpp"
namespace md = megadsl;

struct my_llama : md::llama<md::shape{.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8,
                                      .ffn = 14336, .vocab = 128256, .max_positions = 8192,
                                      .rope_theta = 500000.0}> {
  static constexpr std::string_view name = "my-llama";
};
constexpr md::layout layout{.tp = 4, .sp = true, .rmpad = true};
using actor = md::causal_lm<my_llama, layout>;
using critic = md::value_model<my_llama, layout>;
static_assert(md::local_shape<actor>("layers.{layer}.qkv.weight") == md::mat(1536, 4096));
static_assert(md::violates<my_llama, md::layout{.tp = 3}>("heads_divisible_by_tp"));
