// The CPU device: host memory and immediate execution. Streams are idle at
// all times and events complete when recorded, so stream-ordered code written
// for an accelerator runs unchanged on host buffers. Timing events record the
// host clock.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/log.h"
#include "device/registry.h"
#include "torus/device/device.h"

namespace torus::device {
namespace {

constexpr size_t kAlignment = 64;  // a cache line; enough for any SIMD load

// The handle of a CPU stream: any non-null address (never dereferenced).
char g_cpu_stream_tag;

struct CpuEvent {
  bool timing = false;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

class CpuDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::kCPU; }
  int count() const override { return 1; }
  int current() const override { return 0; }
  void set_current(int index) override {
    TORUS_CHECK(index == 0, InvalidArgument, "the CPU device has index 0, got {}", index);
  }
  DeviceProperties properties(int index) const override {
    TORUS_CHECK(index == 0, InvalidArgument, "the CPU device has index 0, got {}", index);
    DeviceProperties p;
    p.type = DeviceType::kCPU;
    p.name = "cpu";
    return p;
  }
  std::string describe() const override { return "cpu (host memory)"; }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    TORUS_CHECK(p != nullptr, Error, "host allocation of {} bytes failed", bytes);
    return p;
  }
  void deallocate(void* ptr) noexcept override { std::free(ptr); }
  void* allocate_pinned(size_t bytes) override { return allocate(bytes); }
  void deallocate_pinned(void* ptr) noexcept override { std::free(ptr); }

  void copy_async(void* dst, const void* src, size_t bytes, const Stream&) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memmove(dst, src, bytes);
  }
  void fill_async(void* dst, int value, size_t bytes, const Stream&) override {
    if (bytes != 0) std::memset(dst, value, bytes);
  }
  void synchronize() override {}

 protected:
  void* stream_create(const StreamOptions&) override { return &g_cpu_stream_tag; }
  void stream_destroy(void*) noexcept override {}
  void stream_synchronize(void*) override {}
  bool stream_query(void*) override { return true; }
  void stream_wait_event(void*, void*) override {}

  void* event_create(const EventOptions& options) override {
    auto* e = new CpuEvent;
    e->timing = options.timing;
    return e;
  }
  void event_destroy(void* event) noexcept override { delete static_cast<CpuEvent*>(event); }
  void event_record(void* event, void*) override {
    auto* e = static_cast<CpuEvent*>(event);
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
  }
  bool event_query(void*) override { return true; }
  void event_synchronize(void*) override {}
  float event_elapsed_ms(void* start, void* end) override {
    auto* a = static_cast<CpuEvent*>(start);
    auto* b = static_cast<CpuEvent*>(end);
    TORUS_CHECK(a->timing && b->timing, Error, "elapsed_ms() needs events created with EventOptions::timing");
    TORUS_CHECK(a->recorded && b->recorded, Error, "elapsed_ms() needs two recorded events");
    return std::chrono::duration<float, std::milli>(b->when - a->when).count();
  }
};

}  // namespace

Device& cpu_device() {
  static CpuDevice device;
  return device;
}

void register_cpu_device(DeviceRegistry& registry) { registry.add(cpu_device()); }

}  // namespace torus::device
