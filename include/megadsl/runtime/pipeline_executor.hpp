// The pipeline executor: runs this rank's chunks of a model over micro-batches in the layout's
// schedule (no pipelining, 1F1B or interleaved 1F1B, in Megatron's order: schedule.hpp) and moves
// activations forward and their gradients backward between neighbouring stages. It knows nothing
// of layers, heads or losses: any `pipeline_stage` runs on it.
//
//   pipeline_executor exec(*groups.pp, vpp);
//   double loss = exec.forward_backward(stage, microbatches, [&](const at::Tensor& hidden, std::int64_t mb) {
//     return my_loss(hidden, mb);   // on the last stage only
//   });
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "megadsl/parallel/comm.hpp"

namespace megadsl {

// A rank's part of a model as the executor sees it: `chunk_count()` chunks of consecutive layers
// (vpp of them; chunk c is global stage c * pp + pp_rank), each a function of the previous stage's
// activations.
class pipeline_stage {
 public:
  virtual ~pipeline_stage() = default;
  [[nodiscard]] virtual std::int64_t chunk_count() const = 0;
  [[nodiscard]] virtual bool is_first(std::int64_t chunk) const = 0;  // global stage 0: reads the tokens
  [[nodiscard]] virtual bool is_last(std::int64_t chunk) const = 0;   // the last global stage
  // The chunk on micro-batch `mb`: from the tokens on the first stage (`input` undefined), else from
  // the activations received from the previous stage. Returns the chunk's output activations.
  virtual at::Tensor forward(std::int64_t chunk, std::int64_t mb, const at::Tensor& input) = 0;
  // An uninitialised tensor of the shape, dtype and device of micro-batch `mb`'s activations
  // between stages (both sides of a transfer know it: no shapes go over the wire).
  [[nodiscard]] virtual at::Tensor activation_buffer(std::int64_t mb) const = 0;
};

class pipeline_executor {
 public:
  // The turn of the last chunk's output into a micro-batch's loss (a scalar with its graph), on
  // the last stage. It should be normalised the way the step wants the losses summed.
  using loss_of = std::function<at::Tensor(const at::Tensor& hidden, std::int64_t mb)>;

  // `pp`: this rank's pipeline group (size pp, rank = this stage); `vpp` chunks per rank.
  pipeline_executor(const comm_group& pp, std::int64_t vpp);

  // Forward and backward of micro-batches [0, microbatches) in the schedule, accumulating the
  // parameters' gradients; each micro-batch's activations are freed after its backward. Returns
  // the summed loss, the same on every rank of the pipeline.
  double forward_backward(pipeline_stage& stage, std::int64_t microbatches, const loss_of& loss);

  // Micro-batches [0, microbatches) through every stage, as inference (call under NoGradGuard);
  // `at_end(hidden, mb)` runs on the rank holding the last stage. Pipelined: each rank runs a
  // chunk for every micro-batch in turn and sends each result on at once, so the stages work
  // on different micro-batches at the same time (the bubble is that of one micro-batch per stage).
  void forward(pipeline_stage& stage, std::int64_t microbatches,
               const std::function<void(const at::Tensor&, std::int64_t mb)>& at_end);

 private:
  // Point-to-point tags: one per (micro-batch, sending global stage, direction).
  [[nodiscard]] int tag(std::int64_t global_stage, std::int64_t mb, bool forward) const;
  at::Tensor receive(const pipeline_stage& stage, std::int64_t chunk, std::int64_t mb, bool forward);
  void send(const at::Tensor& t, std::int64_t chunk, std::int64_t mb, bool forward);
  void wait_sends();
  void require_chunks(const pipeline_stage& stage) const;
  // A run that ends by an exception leaves no send behind for the next run to wait on (the job
  // is failing: comm_group has told every rank).
  struct pending_sends_dropped {
    std::vector<comm_group::pending_send>& sends;
    explicit pending_sends_dropped(std::vector<comm_group::pending_send>& s) : sends(s) {}
    ~pending_sends_dropped() { sends.clear(); }
    pending_sends_dropped(const pending_sends_dropped&) = delete;
    pending_sends_dropped& operator=(const pending_sends_dropped&) = delete;
  };

  const comm_group* pp_;
  std::int64_t pp_size_, pp_rank_, vpp_;
  std::vector<comm_group::pending_send> sends_;
};

}  // namespace megadsl
