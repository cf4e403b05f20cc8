// Activation offload (verl's enable_activation_offload; Megatron's cpu_offloading of activations):
// under full recompute each decoder layer keeps only its input, and with offload that input waits
// for the backward in host memory instead of on the device.
//
//   forward   store(i, x): x copied to pinned host memory on a side stream (the device block is
//             released to the allocator once the copy has run, in stream order); the forward goes on
//   backward  load(i): layer i's input back on the device for its rerun: the prefetched copy when
//             there is one (the compute stream waits for it), else a copy now; then layer i - 1's
//             input starts coming back on the side stream while layer i reruns and differentiates
//
// One object per micro-batch's pass through a stage's chunk of layers (slot = the layer's index in
// the chunk). The values are the same bits as without offload. On the CPU the "host" copy is a
// separate CPU tensor and nothing is prefetched: the same bookkeeping, no saving (one memory).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace megadsl {

class activation_offload {
 public:
  explicit activation_offload(std::int64_t slots);
  activation_offload(const activation_offload&) = delete;
  activation_offload& operator=(const activation_offload&) = delete;

  // The forward: x's values to the host, for slot's layer.
  void store(std::int64_t slot, const at::Tensor& x);
  // The backward: slot's values on their device again (a new tensor, no autograd history); starts
  // bringing back slot - 1. Each slot is loaded once.
  at::Tensor load(std::int64_t slot);

 private:
  struct entry {
    at::Tensor host;                 // the layer input, on the host
    at::Tensor back;                 // prefetched onto the device (side stream), or undefined
    std::optional<c10::Event> on_host;  // the copy to the host has run (CUDA)
    std::optional<c10::Event> on_device;  // the prefetch has run (CUDA)
  };
  void prefetch(std::int64_t slot);

  std::vector<entry> entries_;
  c10::Device device_ = c10::kCPU;
  std::optional<c10::Stream> side_;  // the copies' stream (CUDA)
};

// Bytes that activation_offload has put in host memory in this process so far: what a test reads
// to know that offload is not silently skipped.
std::int64_t activation_offload_bytes();

}  // namespace megadsl
