// LibTorch's CPU allocator over the shared host pool (Note [Shared host
// allocator] in torus/comm/shared_host.h).
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "core/log.h"
#include "torus/comm/shared_host.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

// What the allocator needs in its static deleter.
c10::DeleterFnPtr g_prev_deleter = nullptr;

void delete_block(void* p) {
  if (shared_host_pool_free(p)) return;
  if (p != nullptr) g_prev_deleter(p);
}

// Every DataPtr it returns carries delete_block, as raw_deleter() promises:
// small allocations come from the replaced allocator's raw interface and go
// back to it.
class SharedHostAllocator final : public c10::Allocator {
 public:
  SharedHostAllocator(c10::Allocator* prev, size_t min_bytes) : prev_(prev), min_bytes_(min_bytes) {}

  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n >= min_bytes_) {
      try {
        p = shared_host_pool_alloc(n);
      } catch (const std::exception& e) {
        // No new slab (out of file descriptors, address space or memory):
        // this tensor gets ordinary memory (its ops take the staging path);
        // the next allocation tries the pool again. Warned once.
        if (!warned_.exchange(true)) {
          TORUS_LOG_WARN("shared host allocator: {}; such tensors get ordinary memory", e.what());
        }
      }
    }
    if (p == nullptr) p = prev_->raw_allocate(n);
    return {p, p, &delete_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  c10::Allocator* prev_;
  size_t min_bytes_;
  std::atomic<bool> warned_{false};
};

std::mutex g_install_mu;
SharedHostAllocator* g_allocator = nullptr;

}  // namespace

bool install_shared_host_allocator(const SharedHostAllocatorOptions& options) {
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (g_allocator == nullptr) {
    TORUS_CHECK(options.min_bytes >= 1, InvalidArgument, "shared host allocator: min_bytes must be >= 1");
    c10::Allocator* prev = c10::GetCPUAllocator();
    if (prev->raw_deleter() == nullptr) {
      TORUS_LOG_WARN("shared host allocator: the CPU allocator in place has no raw interface; not installed");
      return false;
    }
    set_shared_host_pool_options(options.pool);
    g_prev_deleter = prev->raw_deleter();
    g_allocator = new SharedHostAllocator(prev, options.min_bytes);  // never destroyed: tensors outlive everything
    c10::SetCPUAllocator(g_allocator, /*priority=*/0);
    TORUS_LOG_DEBUG("shared host allocator: CPU tensors of >= {} bytes from the shared host pool (slabs of {} bytes)",
                    options.min_bytes, options.pool.slab_bytes);
  }
  return c10::GetCPUAllocator() == g_allocator;
}

bool shared_host_allocator_installed() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  return g_allocator != nullptr && c10::GetCPUAllocator() == g_allocator;
}

}  // namespace torus::comm
