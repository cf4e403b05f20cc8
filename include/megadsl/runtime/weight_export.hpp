// Weights streamed to a rollout engine without a disk (verl's weight sync to vLLM / SGLang every
// step): (HF name, full HF tensor) in buckets, gathered over tp, pp and ep, in HF's layout and the
// dtype the engine loads: the tensors save_hf writes, bit for bit.
//
//   megadsl::weight_stream s(model.parameters(), model.config(), groups, {.dtype = at::kBFloat16});
//   for (auto bucket = s.next(); !bucket.empty(); bucket = s.next())
//     for (auto& [name, tensor] : bucket) engine.load_weight(name, tensor);   // every rank gets them
//
// Every rank of the model calls next() in step (a collective); each gets the whole bucket. The
// stages take turns: the stage that holds the next parameters gathers them over its tp group (and
// an expert's over its ep group) and broadcasts them over the pipeline. Beyond the model a rank
// holds one bucket (a parameter larger than a bucket makes its own) and, while one parameter is
// gathered, that parameter's shards and HF tensors. With `shard_tp` > 1 each rank gets,
// instead of the full tensor, the slice a rollout engine's tp rank `shard_rank` loads (vLLM's
// column / row split; kv heads replicated when fewer than shard_tp; a tensor of slots, Qwen3.5's
// in_proj_qkv and the DeltaNet's conv, each slot's chunk side by side as a merged column-parallel
// layer holds it; refused for an HF tensor that interleaves or concatenates several projections
// whose split vLLM derives itself, as Phi-3's qkv_proj and gate_up_proj and GPT-NeoX's
// query_key_value).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "megadsl/io/hf_name_map.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {

struct export_options {
  at::ScalarType dtype = at::kBFloat16;           // what the rollout engine loads
  std::int64_t bucket_bytes = std::int64_t{512} << 20;
  std::int64_t shard_tp = 1;                      // > 1: the slice of a rollout tp rank
  std::int64_t shard_rank = 0;                    // which rollout tp rank's slice
  // The names the engine loads: the checkpoint's the model came from (hf_load_report::names: a
  // multimodal checkpoint keeps its text model under a prefix of its own); identity by default.
  hf_name_map names;
  // LoRA adapters merged into their bases' tensors (W + s B A in fp32, then the cast), what a
  // rollout engine without LoRA loads; null: the bases as they are.
  const lora_set* merge = nullptr;
};

using hf_tensor_list = std::vector<std::pair<std::string, at::Tensor>>;

// The HF tensors of one of this rank's parameters, gathered over its tp group (an expert's also
// over the ep group: every expert of the layer that this rank's slot holds on the ep ranks), on
// the CPU in `dtype`; empty for a tied lm_head (the embedding's copy). Collective over tp (and ep).
hf_tensor_list gather_parameter(const named_parameter& p, const runtime_config& c, const parallel_groups& g,
                                at::ScalarType dtype);

class weight_stream {
 public:
  weight_stream(std::vector<named_parameter>& params, const runtime_config& c, const parallel_groups& g,
                export_options o = {});
  ~weight_stream();
  weight_stream(weight_stream&&) noexcept;
  weight_stream& operator=(weight_stream&&) noexcept;

  // The next bucket, the same on every rank; empty once every parameter has been sent.
  hf_tensor_list next();
  [[nodiscard]] bool done() const;
  [[nodiscard]] std::int64_t bytes_sent() const;  // of the full tensors (before any slicing)

 private:
  struct state;
  std::unique_ptr<state> s_;
};

}  // namespace megadsl
