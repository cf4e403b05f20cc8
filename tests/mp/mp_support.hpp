// Shared pieces of the multi-process tests: the rank's job, batches, and comparisons of a
// distributed model with the single-process reference.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "megadsl/models/tiny.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/runtime/llama_model.hpp"
#include "megadsl/runtime/shard_io.hpp"

namespace megadsl::test {

distributed& dist();

// Left- and right-padded rows, including a row with a single token.
struct padded_batch {
  at::Tensor ids, mask;
};
padded_batch make_batch(std::int64_t vocab, bool left_padding, std::uint64_t seed = 7);

// Every parameter of a model gathered to its HF tensors (values or gradients), keyed by HF name.
std::map<std::string, at::Tensor> gather_hf_tensors(std::vector<named_parameter>& params,
                                                    const runtime_config& c, const comm_group* tp,
                                                    bool gradients);

// A scalar that touches every output (so every gradient is exercised), with fixed weights.
at::Tensor probe_loss(const model_output& out, bool actor);

double max_abs_diff(const at::Tensor& a, const at::Tensor& b);

}  // namespace megadsl::test
