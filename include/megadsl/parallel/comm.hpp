// A communication group (c10d backends over a subset of ranks: Gloo for CPU tensors, NCCL for
// CUDA tensors) with counting, timeouts and
// errors that name the group, the ranks and the operation.
//
// Every collective megadsl issues goes through here, so a test can count them (a static tp = 1
// model must issue none) and a benchmark can print the bytes moved next to the analytical count.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
class Backend;
}

namespace megadsl {

// Process-wide counters of collectives. `bytes` is what this rank sends on the wire under ring
// algorithms (formulas.hpp: all-reduce 2 (n-1)/n B, reduce-scatter (n-1)/n B_in, all-gather
// (n-1) B_shard; broadcast and send the tensor's bytes), so it can be set beside the analytical count.
struct comm_stats {
  std::atomic<std::int64_t> calls{0};
  std::atomic<std::int64_t> bytes{0};
  std::atomic<std::int64_t> recv_wait_ns{0};  // time blocked in point-to-point receives (pipeline idle)
  std::atomic<std::int64_t> all_to_all_bytes{0};  // of `bytes`: rows sent to other ranks by all_to_all
  std::atomic<std::int64_t> cp_bytes{0};          // of `bytes`: sent over the context-parallel groups ("cp", and a2a+ring's "cp_a2a" and "cp_ring")
  // The ranks' agreement checks (parallel/agreement.hpp), counted apart: not the model's traffic.
  std::atomic<std::int64_t> check_calls{0};
  std::atomic<std::int64_t> check_bytes{0};
  void reset() {
    calls = 0;
    bytes = 0;
    recv_wait_ns = 0;
    all_to_all_bytes = 0;
    cp_bytes = 0;
    check_calls = 0;
    check_bytes = 0;
  }
};
comm_stats& global_comm_stats();

// While one is alive on this thread, its collectives count as checks (comm_stats::check_*).
class counted_as_checks {
 public:
  counted_as_checks();
  ~counted_as_checks();
  counted_as_checks(const counted_as_checks&) = delete;
  counted_as_checks& operator=(const counted_as_checks&) = delete;

 private:
  bool previous_;
};

enum class reduce_op { sum, max };

class comm_group {
 public:
  // `ranks` are global ranks in group order; `me` is this process's global rank (must be listed).
  comm_group(std::string name, std::vector<std::int64_t> ranks, std::int64_t me,
             const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout,
             std::int64_t generation = 0);
  ~comm_group();
  comm_group(const comm_group&) = delete;
  comm_group& operator=(const comm_group&) = delete;

  [[nodiscard]] int size() const { return static_cast<int>(ranks_.size()); }
  [[nodiscard]] int rank() const { return index_; }  // index inside the group
  [[nodiscard]] const std::vector<std::int64_t>& ranks() const { return ranks_; }
  [[nodiscard]] const std::string& name() const { return name_; }

  // In place on `t` (contiguous).
  void all_reduce(at::Tensor& t, reduce_op op = reduce_op::sum) const;
  // Concatenates every rank's `t` along `dim` (same shape on every rank).
  [[nodiscard]] at::Tensor all_gather(const at::Tensor& t, int64_t dim) const;
  // Sums over ranks and keeps this rank's `dim` chunk (size divisible by the group size).
  [[nodiscard]] at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim) const;
  void broadcast(at::Tensor& t, int root_index) const;
  // Rows of `t` (dim 0) to every rank: the first send_rows[0] to group rank 0, the next
  // send_rows[1] to rank 1, ...; returns what the others sent here, recv_rows[i] rows from rank i
  // in rank order (uneven splits; both sides must agree on the counts).
  [[nodiscard]] at::Tensor all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_rows,
                                      const std::vector<std::int64_t>& recv_rows) const;
  void barrier() const;

  // Point to point inside the group (pipeline stages). `send` returns at once; the returned
  // handle keeps the tensor alive until `wait`. `recv` blocks (with the group's timeout) and
  // fills `into`, whose shape both sides know.
  class pending_send {
   public:
    pending_send() = default;
    void wait();
    [[nodiscard]] bool empty() const { return work_ == nullptr; }

   private:
    friend class comm_group;
    const comm_group* group_ = nullptr;
    at::Tensor tensor_;
    std::shared_ptr<void> work_;
  };
  [[nodiscard]] pending_send send(const at::Tensor& t, int dst_index, int tag) const;
  void recv(at::Tensor& into, int src_index, int tag) const;

 private:
  // Gloo for CPU tensors, NCCL for CUDA tensors.
  c10d::Backend& backend_for(const at::Tensor& t) const;
  template <class Op>
  void run(const char* op, const at::Tensor& on, std::int64_t bytes, Op&& issue) const;
  [[noreturn]] void fail(const char* op, const std::exception& e) const;

  std::string name_;
  std::vector<std::int64_t> ranks_;
  int index_ = 0;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace megadsl
