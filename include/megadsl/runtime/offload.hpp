// Moving training state off the device between phases (verl's param / grad / optimizer offload,
// so that a colocated rollout engine gets the device memory), and back.
//
//   offload_set params;
//   params.offload(tensors_of(model.parameters()));   // device storage freed, bytes on the host
//   ...rollout...
//   params.reload();                                   // the same tensors, the same values
//
// The tensors stay the same objects: their storages are emptied on the device and refilled on
// reload, so whatever holds them (the blocks' modules, the distributed optimizer's slices, AdamW's
// state, views) needs no rebinding. On CUDA the host copies are pinned and the copy off the device
// asynchronous; on the CPU the same calls make a real copy into a separate host buffer and free the
// original (the accounting is the same; the total memory is not lower, there being one memory).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <vector>

#include "megadsl/parallel/comm.hpp"

namespace megadsl {

class offload_set {
 public:
  // Copies each tensor's storage to host memory and frees it on the device (tensors sharing a
  // storage: once; undefined or empty ones: skipped). Throws if this set already holds an offload.
  void offload(const std::vector<at::Tensor>& tensors);
  // Back onto the device into the same storages; the host copies are dropped. A no-op when
  // nothing is offloaded.
  void reload();
  [[nodiscard]] bool offloaded() const { return !entries_.empty(); }
  // Bytes held on the host by this set.
  [[nodiscard]] std::int64_t host_bytes() const;

 private:
  struct entry {
    c10::Storage storage;  // emptied on the device while offloaded
    at::Tensor host;       // (nbytes,) uint8 on the CPU
  };
  std::vector<entry> entries_;
};

// The bytes of device storage these tensors hold now, each storage counted once (0 for an
// offloaded one): what offload frees.
std::int64_t storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace megadsl
