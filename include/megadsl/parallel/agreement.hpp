// Agreement checks: before the first collective of a call, the ranks make sure they are making the
// same call on the same model with the same data, so that a mistake ends every rank at once with
// one line naming what differs and on which ranks, rather than a transport error deep in Gloo, a
// store timeout two minutes later, or (worst) a result computed from one rank's data alone.
//
// Each check is one all-gather of a few integers over the world group; the texts behind them are
// exchanged only when they differ.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megadsl {

class comm_group;
struct layout;
struct runtime_config;
struct batch;
struct forward_options;

// What every rank throws when the ranks disagree (the same message on each).
class agreement_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// (name, value) pairs, in a fixed order: what the ranks compare.
using field_list = std::vector<std::pair<std::string, std::string>>;

field_list fields_of(const layout& l);
field_list fields_of(const runtime_config& c);  // shape, layout, head, dtypes, device kind, window, options
field_list fields_of(const forward_options& o);  // temperature, entropy, logits, routing record
// A number as the agreement messages print it (17 significant digits).
std::string number_text(double v);

// Collective over `world`: returns when every rank passed the same fields; otherwise every rank
// throws agreement_error: "megadsl: the ranks <what>: tp is 2 on rank 0, 1 on rank 1; <fix>".
void agree_on(const comm_group& world, std::string_view what, const field_list& fields, std::string_view fix);

// The call a batch is passed to (ranks making different calls are named too).
enum class batch_call : std::int64_t { forward = 1, forward_backward = 2, train_step = 3 };

// A batch's fields by name, undefined tensors for absent ones (the same names, in the same order,
// on every rank).
using named_tensors = std::vector<std::pair<std::string, at::Tensor>>;

// A model's batch: input_ids, attention_mask, labels, routed_experts.
named_tensors fields_of(const batch& b);

// Collective over `world`: this rank's micro-batches must equal those of every rank with the same
// `replica` (-1: every rank of the world): as many, the same fields, shapes and dtypes, and with
// `checksum` the same values (a 64-bit hash of the bytes); and every rank of the world must make
// the call with the same `options` (its per-call settings: temperature, learning rate, loss
// settings, micro-batching). Throws agreement_error on every rank otherwise, naming the call, the
// ranks and what differs. One all-gather of a few integers when they agree.
void agree_on_batch(const comm_group& world, batch_call call, std::int64_t replica,
                    const std::vector<named_tensors>& microbatches, bool checksum, const field_list& options = {});

// 64-bit FNV-1a over a tensor's bytes (contiguous, on the CPU: copied there when not), with its
// dtype and shape mixed in.
std::uint64_t tensor_checksum(const at::Tensor& t, std::uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace megadsl
