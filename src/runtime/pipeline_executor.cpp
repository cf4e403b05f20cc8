#include "megadsl/runtime/pipeline_executor.hpp"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "megadsl/schedule.hpp"

namespace megadsl {
namespace {

// The compute steps (F/B of a micro-batch on a chunk) of this rank's schedule, in Megatron's order
// (schedule.hpp, tested against the reference tables). Transfers are issued around them:
// asynchronous sends and tagged receives, so only the compute order matters.
std::vector<pipeline_op> compute_steps(std::int64_t pp, std::int64_t rank, std::int64_t m, std::int64_t vpp) {
  std::vector<pipeline_op> out;
  for (const pipeline_op& op : schedule_ops(select_schedule(pp, vpp), pp, rank, m, vpp))
    if (op.is_compute()) out.push_back(op);
  return out;
}

}  // namespace

pipeline_executor::pipeline_executor(const comm_group& pp, std::int64_t vpp)
    : pp_(&pp), pp_size_(pp.size()), pp_rank_(pp.rank()), vpp_(vpp) {
  if (vpp < 1) throw std::invalid_argument("megadsl: pipeline_executor: vpp = " + std::to_string(vpp) + " must be >= 1");
}

void pipeline_executor::require_chunks(const pipeline_stage& stage) const {
  if (stage.chunk_count() != vpp_)
    throw std::invalid_argument("megadsl: pipeline_executor: the stage has " + std::to_string(stage.chunk_count()) +
                                " chunks but the executor runs vpp = " + std::to_string(vpp_));
}

double pipeline_executor::forward_backward(pipeline_stage& stage, std::int64_t microbatches, const loss_of& loss) {
  require_chunks(stage);
  const pending_sends_dropped on_exit(sends_);
  // Per (micro-batch, chunk): the chunk's input (a leaf when received) and its output, or on the
  // last stage the loss.
  const auto slots = static_cast<std::size_t>(microbatches * vpp_);
  std::vector<at::Tensor> chunk_in(slots), chunk_out(slots);
  at::Tensor total_loss = at::zeros({1}, at::kDouble);
  for (const pipeline_op& st : compute_steps(pp_size_, pp_rank_, microbatches, vpp_)) {
    const auto slot = static_cast<std::size_t>(st.microbatch * vpp_ + st.chunk);
    const bool first = stage.is_first(st.chunk), last = stage.is_last(st.chunk);
    if (st.kind == op_kind::forward) {
      if (!first) chunk_in[slot] = receive(stage, st.chunk, st.microbatch, true).requires_grad_(true);
      at::Tensor hidden = stage.forward(st.chunk, st.microbatch, chunk_in[slot]);
      if (last) {
        at::Tensor l = loss(hidden, st.microbatch);
        total_loss += l.detach().to(at::kCPU, at::kDouble).reshape({1});
        chunk_out[slot] = std::move(l);
      } else {
        send(hidden, st.chunk, st.microbatch, true);
        chunk_out[slot] = std::move(hidden);
      }
    } else {
      if (last) chunk_out[slot].backward();
      else chunk_out[slot].backward(receive(stage, st.chunk, st.microbatch, false));
      if (!first) send(chunk_in[slot].grad(), st.chunk, st.microbatch, false);
      chunk_in[slot] = chunk_out[slot] = at::Tensor();  // free the micro-batch's activations
    }
  }
  wait_sends();
  // The loss lives on the last stage: share it with the pipeline.
  pp_->broadcast(total_loss, static_cast<int>(pp_size_ - 1));
  return total_loss.item<double>();
}

void pipeline_executor::forward(pipeline_stage& stage, std::int64_t microbatches,
                                const std::function<void(const at::Tensor&, std::int64_t mb)>& at_end) {
  require_chunks(stage);
  const pending_sends_dropped on_exit(sends_);
  // Chunk-major: a chunk's input for micro-batch j comes from the previous global stage's same
  // chunk (or the last rank's previous chunk), which that rank ran before any later chunk, so the
  // order cannot deadlock; sends are asynchronous, so no rank waits for its successor.
  for (std::int64_t c = 0; c < stage.chunk_count(); ++c)
    for (std::int64_t mb = 0; mb < microbatches; ++mb) {
      at::Tensor input;
      if (!stage.is_first(c)) input = receive(stage, c, mb, true);
      const at::Tensor hidden = stage.forward(c, mb, input);
      if (stage.is_last(c)) at_end(hidden, mb);
      else send(hidden, c, mb, true);
    }
  wait_sends();
}

int pipeline_executor::tag(std::int64_t global_stage, std::int64_t mb, bool forward) const {
  return static_cast<int>((mb * pp_size_ * vpp_ + global_stage) * 2 + (forward ? 0 : 1));
}

// Forward: from the previous global stage; backward: from the next. The sender tagged the
// transfer with its own global stage.
at::Tensor pipeline_executor::receive(const pipeline_stage& stage, std::int64_t chunk, std::int64_t mb, bool forward) {
  at::Tensor buf = stage.activation_buffer(mb);
  const std::int64_t peer = forward ? (pp_rank_ - 1 + pp_size_) % pp_size_ : (pp_rank_ + 1) % pp_size_;
  const std::int64_t sender_chunk =
      forward ? (pp_rank_ == 0 ? chunk - 1 : chunk) : (pp_rank_ == pp_size_ - 1 ? chunk + 1 : chunk);
  pp_->recv(buf, static_cast<int>(peer), tag(sender_chunk * pp_size_ + peer, mb, forward));
  return buf;
}

void pipeline_executor::send(const at::Tensor& t, std::int64_t chunk, std::int64_t mb, bool forward) {
  const std::int64_t peer = forward ? (pp_rank_ + 1) % pp_size_ : (pp_rank_ - 1 + pp_size_) % pp_size_;
  sends_.push_back(pp_->send(t.detach(), static_cast<int>(peer), tag(chunk * pp_size_ + pp_rank_, mb, forward)));
}

void pipeline_executor::wait_sends() {
  for (auto& s : sends_) s.wait();
  sends_.clear();
}

}  // namespace megadsl
