// `megadsl plan`: the figures of formulas.hpp for one model and layout, as a readable table.
//
//   megadsl::print_plan(std::cout, "llama3-8b", megadsl::llama3_8b::shape,
//                       megadsl::layout{.tp = 8, .pp = 4, .sp = true}, {.seq = 8192});
//
// Parameter count, padded vocab; per pipeline rank the parameters held and the model-state memory
// under fp32 and bf16 with fp32 master weights; activation memory per layer and on the first stage
// with and without SP; FLOPs per token under each published convention. The shape and layout must
// be resolved (no dynamic field left) and valid; otherwise it throws what `require_valid` throws,
// before printing anything.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>

#include "megadsl/layout.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

struct plan_options {
  std::int64_t seq = 4096;       // tokens per sequence (activations, attention FLOPs)
  std::int64_t micro_batch = 1;  // sequences per micro-batch
  std::int64_t microbatches = 0;  // micro-batches per step and dp rank; 0: at least pp (1F1B peak)
  std::int64_t world = 0;        // 0: tp * pp (dp 1); else checked against the layout
  bool actor = true;             // false: critic (value head instead of lm_head)
  bool value_bias = true;        // the critic's value head has a bias
};

void print_plan(std::ostream& os, std::string_view model_name, const shape& s, const layout& l,
                const plan_options& options = {});

}  // namespace megadsl
