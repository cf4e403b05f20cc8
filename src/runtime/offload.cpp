#include "megadsl/runtime/offload.hpp"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <set>
#include <stdexcept>

namespace megadsl {
namespace {

// The storage's bytes as a flat uint8 tensor on its device (a view: no copy).
at::Tensor bytes_of(const c10::Storage& s, std::size_t nbytes) {
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(s.device()))
      .set_(s, 0, {static_cast<std::int64_t>(nbytes)}, {1});
}

at::Allocator* allocator_of(const c10::Storage& s) {
  at::Allocator* a = s.allocator();
  return a != nullptr ? a : c10::GetAllocator(s.device().type());
}

}  // namespace

void offload_set::offload(const std::vector<at::Tensor>& tensors) {
  if (offloaded()) throw std::logic_error("megadsl: offload: these tensors are offloaded already; reload them first");
  std::set<const c10::StorageImpl*> seen;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::Storage& s = t.storage();
    const std::size_t nbytes = s.nbytes();
    if (nbytes == 0 || !seen.insert(s.unsafeGetStorageImpl()).second) continue;
    const bool cuda = s.device().is_cuda();
    at::Tensor host = at::empty({static_cast<std::int64_t>(nbytes)},
                                at::TensorOptions().dtype(at::kByte).device(at::kCPU).pinned_memory(cuda));
    host.copy_(bytes_of(s, nbytes), /*non_blocking=*/cuda);
    // Freed on the device: the caching allocator reuses the block only after the copy in stream order.
    c10::Storage emptied = s;
    emptied.set_data_ptr_noswap(allocator_of(s)->allocate(0));
    emptied.set_nbytes(0);
    entries_.push_back({std::move(emptied), std::move(host)});
  }
}

void offload_set::reload() {
  for (entry& e : entries_) {
    const auto nbytes = static_cast<std::size_t>(e.host.numel());
    e.storage.set_data_ptr_noswap(allocator_of(e.storage)->allocate(nbytes));
    e.storage.set_nbytes(nbytes);
    bytes_of(e.storage, nbytes).copy_(e.host);
  }
  entries_.clear();
}

std::int64_t offload_set::host_bytes() const {
  std::int64_t n = 0;
  for (const entry& e : entries_) n += e.host.numel();
  return n;
}

std::int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const c10::StorageImpl*> seen;
  std::int64_t n = 0;
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.has_storage() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
      n += static_cast<std::int64_t>(t.storage().nbytes());
  return n;
}

}  // namespace megadsl
