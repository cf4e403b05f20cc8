#include "megadsl/layers/activation_offload.hpp"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <stdexcept>
#include <string>

namespace megadsl {
namespace {

std::atomic<std::int64_t> offloaded_bytes{0};

// The allocator must not hand t's block to another stream's work before `stream`'s use of it ran.
void used_on(const at::Tensor& t, const c10::Stream& stream) {
  c10::impl::VirtualGuardImpl(stream.device_type()).recordDataPtrOnStream(t.storage().data_ptr(), stream);
}

}  // namespace

std::int64_t activation_offload_bytes() { return offloaded_bytes.load(); }

activation_offload::activation_offload(std::int64_t slots) : entries_(static_cast<std::size_t>(slots)) {}

void activation_offload::store(std::int64_t slot, const at::Tensor& x) {
  entry& e = entries_.at(static_cast<std::size_t>(slot));
  if (e.host.defined()) throw std::logic_error("megadsl: activation offload: slot " + std::to_string(slot) + " stored twice");
  device_ = x.device();
  offloaded_bytes += static_cast<std::int64_t>(x.numel() * x.element_size());
  if (!device_.is_cuda()) {
    e.host = x.clone(at::MemoryFormat::Contiguous);
    return;
  }
  const c10::impl::VirtualGuardImpl impl(device_.type());
  if (!side_) side_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
  const c10::Stream compute = impl.getStream(device_);
  c10::Event produced(device_.type());
  produced.record(compute);
  produced.block(*side_);  // x is written before the side stream reads it
  e.host = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
  {
    const c10::StreamGuard on_side(*side_);
    e.host.copy_(x, /*non_blocking=*/true);
  }
  used_on(x, *side_);
  e.on_host.emplace(device_.type());
  e.on_host->record(*side_);
}

at::Tensor activation_offload::load(std::int64_t slot) {
  entry& e = entries_.at(static_cast<std::size_t>(slot));
  if (!e.host.defined()) throw std::logic_error("megadsl: activation offload: slot " + std::to_string(slot) + " was not stored or is loaded already");
  at::Tensor x;
  if (!device_.is_cuda()) {
    x = std::move(e.host);
  } else {
    const c10::impl::VirtualGuardImpl impl(device_.type());
    const c10::Stream compute = impl.getStream(device_);
    if (e.back.defined()) {
      e.on_device->block(compute);
      x = std::move(e.back);
      used_on(x, compute);  // allocated on the side stream, used on this one
    } else {
      e.on_host->block(compute);
      x = at::empty(e.host.sizes(), e.host.options().device(device_).pinned_memory(false));
      x.copy_(e.host, /*non_blocking=*/true);
    }
  }
  e = entry{};
  if (slot > 0) prefetch(slot - 1);
  return x;
}

void activation_offload::prefetch(std::int64_t slot) {
  entry& e = entries_.at(static_cast<std::size_t>(slot));
  if (!device_.is_cuda() || !e.host.defined() || e.back.defined()) return;
  const c10::StreamGuard on_side(*side_);  // after this slot's copy to the host, in the side stream's order
  e.back = at::empty(e.host.sizes(), e.host.options().device(device_).pinned_memory(false));
  e.back.copy_(e.host, /*non_blocking=*/true);
  e.on_device.emplace(device_.type());
  e.on_device->record(*side_);
}

}  // namespace megadsl
