// LibTorch's CPU allocator wrapped to count the bytes its live allocations hold and their peak:
// a benchmark's tensor memory on the CPU, as CUDA's max_memory_allocated counts it on a GPU.
//
//   static megadsl::bench::counting_allocator counting(c10::GetDefaultCPUAllocator());
//   c10::SetCPUAllocator(&counting, /*priority=*/100);
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace megadsl::bench {

class counting_allocator final : public c10::Allocator {
 public:
  explicit counting_allocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* held = new held_block{std::move(inner), n, this};
    const std::int64_t now = current_ += static_cast<std::int64_t>(n);
    for (std::int64_t p = peak_; now > p && !peak_.compare_exchange_weak(p, now);) {
    }
    return {data, held, &release, device};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  std::int64_t current() const { return current_; }
  std::int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = current_.load(); }

 private:
  struct held_block {
    c10::DataPtr inner;
    size_t bytes;
    counting_allocator* owner;
  };
  static void release(void* ctx) {
    auto* held = static_cast<held_block*>(ctx);
    held->owner->current_ -= static_cast<std::int64_t>(held->bytes);
    delete held;  // frees the block through the base allocator's deleter
  }
  c10::Allocator* base_;
  std::atomic<std::int64_t> current_{0}, peak_{0};
};

}  // namespace megadsl::bench
