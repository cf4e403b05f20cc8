#include <megadsl/spec.hpp>
#include <megadsl/models/llama.hpp>
#include <cstdio>
using actor = megadsl::causal_lm<megadsl::llama3_8b, megadsl::layout{.tp = 4}>;
int main() { std::printf("%lld\n", (long long)megadsl::local_shape<actor>("layers.{layer}.qkv.weight").rows); }
