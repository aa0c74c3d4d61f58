// bench/common/live_bytes.h — live tensor bytes, counted, not sampled.
//
//   auto& live = torus::bench::install_live_bytes_allocator();   // once, before any tensor
//   const int64_t before = live.live();
//   live.reset_peak();
//   ... run ...
//   const int64_t peak_delta = live.peak() - before;
//
// A wrapper around LibTorch's CPU allocator adds every allocation's size
// and subtracts it when the block is freed, so live() is the bytes of CPU
// tensors alive at that moment and peak() the most since reset_peak() — not
// the RSS, which glibc's free lists and page reuse blur. Thread safe.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace torus::bench {

class LiveBytesAllocator final : public c10::Allocator {
 public:
  explicit LiveBytesAllocator(c10::Allocator* base) : base_(base) { self() = this; }

  // The returned DataPtr's context is its data pointer (raw_allocate, used
  // by oneDNN's scratch buffers, requires it); the wrapped block and its
  // size are kept in a table until the deleter runs.
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_.emplace(data, Block{std::move(inner), n});
    }
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &LiveBytesAllocator::release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &LiveBytesAllocator::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 private:
  struct Block {
    c10::DataPtr inner;
    size_t bytes;
  };
  static LiveBytesAllocator*& self() {
    static LiveBytesAllocator* instance = nullptr;
    return instance;
  }
  static void release(void* p) {
    LiveBytesAllocator* a = self();
    c10::DataPtr inner;  // freed through the wrapped allocator's deleter when it leaves scope
    {
      std::lock_guard<std::mutex> lock(a->mu_);
      auto it = a->blocks_.find(p);
      if (it == a->blocks_.end()) return;
      a->live_.fetch_sub(static_cast<int64_t>(it->second.bytes));
      inner = std::move(it->second.inner);
      a->blocks_.erase(it);
    }
  }

  c10::Allocator* base_;
  std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

// Installs the counting allocator as LibTorch's CPU allocator (once; later
// calls return the same one).
inline LiveBytesAllocator& install_live_bytes_allocator() {
  static LiveBytesAllocator counter(c10::GetCPUAllocator());
  static const bool installed = [] {
    c10::SetCPUAllocator(&counter, /*priority=*/100);
    return true;
  }();
  (void)installed;
  return counter;
}

}  // namespace torus::bench
