// The Neuron implementation of torus::device::Device over the Neuron runtime
// (libnrt), opened at run time (nrt_api.h).
//
// Note [Neuron streams]: the runtime's tensor calls (nrt_tensor_read, _write,
// _copy, _memset) are synchronous: each returns once the data has moved. So
// copy_async and fill_async complete before they return, every stream is
// idle at all times, an event is complete as soon as it is recorded, and
// synchronize() has nothing to wait for. Timing events record the host clock
// at record time, which — since the work before them has finished — measures
// the work between two events. This is the honest emulation of stream
// semantics on a synchronous runtime; nothing is reordered or deferred.
//
// Device indices are logical NeuronCore ids: 0..count()-1 are the cores the
// runtime makes visible (NEURON_RT_VISIBLE_CORES, read by the runtime
// itself). Pinned memory is ordinary aligned host memory: the runtime's
// copies take any host buffer.
#include "device/neuron/neuron_device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/log.h"
#include "device/neuron/neuron_memory.h"
#include "device/neuron/nrt_api.h"
#include "device/registry.h"

namespace torus::device::neuron {
namespace {

constexpr size_t kHostAlignment = 64;
constexpr size_t kFillChunk = size_t{1} << 20;  // host buffer for fills without nrt_tensor_memset

char g_stream_tag;  // the handle of every Neuron stream (never dereferenced)

struct NeuronEvent {
  bool timing = false;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

thread_local int t_current_core = 0;

class NeuronDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::kNeuron; }

  int count() const override {
    const NrtLibrary* lib = NrtLibrary::get();
    return lib != nullptr ? lib->visible_cores() : 0;
  }
  int current() const override { return t_current_core; }
  void set_current(int index) override {
    int n = count();
    TORUS_CHECK(index >= 0 && index < n, InvalidArgument, "Neuron: NeuronCore {} is not visible ({} visible{})",
                index, n, n == 0 ? fmt::format(": {}", NrtLibrary::unavailable_reason()) : "");
    t_current_core = index;
  }
  DeviceProperties properties(int index) const override {
    const NrtLibrary& lib = NrtLibrary::require("Neuron device properties");
    TORUS_CHECK(index >= 0 && index < lib.visible_cores(), InvalidArgument, "Neuron: NeuronCore {} is not visible",
                index);
    DeviceProperties p;
    p.type = DeviceType::kNeuron;
    p.index = index;
    p.name = fmt::format("NeuronCore {} (Neuron runtime {})", index, lib.version_string());
    // The runtime API does not report per-core memory or bandwidth: 0 = unknown.
    return p;
  }
  std::string describe() const override {
    const NrtLibrary* lib = NrtLibrary::get();
    if (lib == nullptr) return fmt::format("no Neuron device: {}", NrtLibrary::unavailable_reason());
    return fmt::format("{} of {} NeuronCore(s) visible (Neuron runtime {} from '{}')", lib->visible_cores(),
                       lib->total_cores(), lib->version_string(), lib->path());
  }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    return NeuronMemory::get().allocate(t_current_core, bytes);
  }
  void deallocate(void* ptr) noexcept override {
    if (ptr != nullptr) NeuronMemory::get().deallocate(ptr);
  }
  void* allocate_pinned(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(kHostAlignment, (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
    TORUS_CHECK(p != nullptr, Error, "Neuron: host allocation of {} bytes failed", bytes);
    return p;
  }
  void deallocate_pinned(void* ptr) noexcept override { std::free(ptr); }

  void copy_async(void* dst, const void* src, size_t bytes, const Stream&) override { copy(dst, src, bytes); }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const NrtApi& api = NrtLibrary::require("a Neuron copy").api();
    NeuronMemory& mem = NeuronMemory::get();
    bool dev_dst = mem.is_device_address(dst);
    bool dev_src = mem.is_device_address(src);
    if (!dev_dst && !dev_src) {
      std::memmove(dst, src, bytes);
      return;
    }
    if (dev_dst && dev_src) {
      auto s = mem.resolve(src, bytes, "Neuron copy (source)");
      auto d = mem.resolve(dst, bytes, "Neuron copy (destination)");
      TORUS_CHECK_NRT(api.nrt_tensor_copy(s.tensor, s.offset, d.tensor, d.offset, bytes));
    } else if (dev_dst) {
      auto d = mem.resolve(dst, bytes, "Neuron copy (destination)");
      TORUS_CHECK_NRT(api.nrt_tensor_write(d.tensor, src, d.offset, bytes));
    } else {
      auto s = mem.resolve(src, bytes, "Neuron copy (source)");
      TORUS_CHECK_NRT(api.nrt_tensor_read(s.tensor, dst, s.offset, bytes));
    }
  }

  void fill_async(void* dst, int value, size_t bytes, const Stream&) override {
    if (bytes == 0) return;
    NeuronMemory& mem = NeuronMemory::get();
    if (!mem.is_device_address(dst)) {
      std::memset(dst, value, bytes);
      return;
    }
    const NrtApi& api = NrtLibrary::require("a Neuron fill").api();
    auto d = mem.resolve(dst, bytes, "Neuron fill");
    if (api.nrt_tensor_memset != nullptr) {
      TORUS_CHECK_NRT(api.nrt_tensor_memset(d.tensor, d.offset, value, bytes));
      return;
    }
    std::vector<unsigned char> chunk(std::min(bytes, kFillChunk), static_cast<unsigned char>(value));
    for (size_t done = 0; done < bytes; done += chunk.size()) {
      size_t n = std::min(chunk.size(), bytes - done);
      TORUS_CHECK_NRT(api.nrt_tensor_write(d.tensor, chunk.data(), d.offset + done, n));
    }
  }

  void synchronize() override {}  // Note [Neuron streams]

  // The runtime's own address of the allocation (nrt_tensor_get_va, which
  // libfabric's FI_HMEM_NEURON registration takes), plus the offset. Null
  // when the runtime lacks the call or gives no address for the tensor.
  NicAddress nic_address(const void* ptr, size_t bytes) override {
    const NrtApi& api = NrtLibrary::require("a Neuron device address").api();
    NeuronMemory& mem = NeuronMemory::get();
    TORUS_CHECK(mem.is_device_address(ptr), InvalidArgument, "Neuron: {} is not Neuron device memory", ptr);
    auto r = mem.resolve(ptr, bytes, "Neuron device address");
    NicAddress a;
    a.device = r.core;
    if (api.nrt_tensor_get_va != nullptr) {
      if (void* va = api.nrt_tensor_get_va(r.tensor)) a.address = static_cast<char*>(va) + r.offset;
    }
    return a;
  }

 protected:
  void* stream_create(const StreamOptions&) override { return &g_stream_tag; }
  void stream_destroy(void*) noexcept override {}
  void stream_synchronize(void*) override {}
  bool stream_query(void*) override { return true; }
  void stream_wait_event(void*, void*) override {}

  void* event_create(const EventOptions& options) override {
    auto* e = new NeuronEvent;
    e->timing = options.timing;
    return e;
  }
  void event_destroy(void* event) noexcept override { delete static_cast<NeuronEvent*>(event); }
  void event_record(void* event, void*) override {
    auto* e = static_cast<NeuronEvent*>(event);
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
  }
  bool event_query(void*) override { return true; }
  void event_synchronize(void*) override {}
  float event_elapsed_ms(void* start, void* end) override {
    auto* a = static_cast<NeuronEvent*>(start);
    auto* b = static_cast<NeuronEvent*>(end);
    TORUS_CHECK(a->timing && b->timing, Error, "elapsed_ms() needs events created with EventOptions::timing");
    TORUS_CHECK(a->recorded && b->recorded, Error, "elapsed_ms() needs two recorded events");
    return std::chrono::duration<float, std::milli>(b->when - a->when).count();
  }
};

}  // namespace

Device& neuron_device() {
  static NeuronDevice device;
  return device;
}

bool is_device_pointer(const void* p) noexcept {
  if (NrtLibrary::get() == nullptr) return false;
  try {
    return NeuronMemory::get().is_device_address(p);
  } catch (...) {
    return false;
  }
}

}  // namespace torus::device::neuron

namespace torus::device::neuron {

RuntimeInfo runtime_info() noexcept {
  RuntimeInfo info;
  info.built = true;
  const NrtLibrary* lib = NrtLibrary::get();
  if (lib == nullptr) {
    info.reason = NrtLibrary::unavailable_reason();
    return info;
  }
  info.available = true;
  info.library = lib->path();
  info.version = lib->version_string();
  info.major = lib->version().rt_major;
  info.minor = lib->version().rt_minor;
  info.patch = lib->version().rt_patch;
  info.visible_cores = lib->visible_cores();
  info.total_cores = lib->total_cores();
  info.programs = lib->api().has_programs();
  return info;
}

AllocatorStats allocator_stats() { return NeuronMemory::get().stats(); }
void empty_cache() { NeuronMemory::get().empty_cache(); }
void reset_peak_stats() { NeuronMemory::get().reset_peak_stats(); }

}  // namespace torus::device::neuron

namespace torus::device {

// Note [Device registration].
void register_neuron_device(DeviceRegistry& registry) { registry.add(neuron::neuron_device()); }

}  // namespace torus::device
