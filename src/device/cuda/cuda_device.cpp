// The CUDA implementation of torus::device::Device over the CUDA runtime API.
//
// Streams are created non-blocking (they never synchronise implicitly with
// the legacy default stream); the default stream is the null handle, as in
// LibTorch. Pinned memory is portable (usable from every device). Every call
// is checked with TORUS_CHECK_CUDA; destroy paths are noexcept and only log.
#include "device/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/log.h"
#include "device/registry.h"

namespace torus::device::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

// Destroy paths run from destructors, possibly during process teardown, when
// the runtime may already be unloading: that case is silent.
void log_destroy_failure(cudaError_t err, const char* what) {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  (void)cudaGetLastError();
  TORUS_LOG_WARN("CUDA: {} failed: {}", what, cuda_error_string(err));
}

class CudaDevice final : public Device {
 public:
  DeviceType type() const override { return DeviceType::kCUDA; }

  int count() const override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }

  std::string describe() const override {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return fmt::format("no CUDA device: cudaGetDeviceCount: {}", cuda_error_string(err));
    }
    if (n == 0) return "no CUDA device: cudaGetDeviceCount reported 0 devices";
    int driver = 0;
    int runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    return fmt::format("{} CUDA device(s), first: {} (driver {}.{}, runtime {}.{})", n, properties(0).name,
                       driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  }

  int current() const override {
    int d = 0;
    TORUS_CHECK_CUDA(cudaGetDevice(&d));
    return d;
  }

  void set_current(int index) override { TORUS_CHECK_CUDA(cudaSetDevice(index)); }

  DeviceProperties properties(int index) const override {
    cudaDeviceProp prop{};
    TORUS_CHECK_CUDA(cudaGetDeviceProperties(&prop, index));
    DeviceProperties p;
    p.type = DeviceType::kCUDA;
    p.index = index;
    p.name = prop.name;
    p.total_memory = prop.totalGlobalMem;
    p.compute_major = prop.major;
    p.compute_minor = prop.minor;
    p.multiprocessors = prop.multiProcessorCount;
    int clock_khz = 0;
    int bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, index) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index) == cudaSuccess) {
      // Double data rate: two transfers per memory clock.
      p.peak_memory_bandwidth = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);
    } else {
      (void)cudaGetLastError();
    }
    return p;
  }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    TORUS_CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
  }
  void deallocate(void* ptr) noexcept override {
    if (ptr != nullptr) log_destroy_failure(cudaFree(ptr), "cudaFree");
  }
  void* allocate_pinned(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    TORUS_CHECK_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    return p;
  }
  void deallocate_pinned(void* ptr) noexcept override {
    if (ptr != nullptr) log_destroy_failure(cudaFreeHost(ptr), "cudaFreeHost");
  }

  void copy_async(void* dst, const void* src, size_t bytes, const Stream& stream) override {
    if (bytes == 0) return;
    TORUS_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream.native_handle())));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    TORUS_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  }
  void fill_async(void* dst, int value, size_t bytes, const Stream& stream) override {
    if (bytes == 0) return;
    TORUS_CHECK_CUDA(cudaMemsetAsync(dst, value, bytes, as_stream(stream.native_handle())));
  }
  void synchronize() override { TORUS_CHECK_CUDA(cudaDeviceSynchronize()); }

 protected:
  void* stream_create(const StreamOptions& options) override {
    int least = 0;
    int greatest = 0;
    TORUS_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    TORUS_CHECK_CUDA(
        cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, options.high_priority ? greatest : least));
    return s;
  }
  void stream_destroy(void* stream) noexcept override {
    if (stream != nullptr) log_destroy_failure(cudaStreamDestroy(as_stream(stream)), "cudaStreamDestroy");
  }
  void stream_synchronize(void* stream) override { TORUS_CHECK_CUDA(cudaStreamSynchronize(as_stream(stream))); }
  bool stream_query(void* stream) override {
    cudaError_t err = cudaStreamQuery(as_stream(stream));
    if (err == cudaErrorNotReady) return false;
    TORUS_CHECK_CUDA(err);
    return true;
  }
  void stream_wait_event(void* stream, void* event) override {
    TORUS_CHECK_CUDA(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
  }

  void* event_create(const EventOptions& options) override {
    cudaEvent_t e = nullptr;
    TORUS_CHECK_CUDA(cudaEventCreateWithFlags(&e, options.timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void event_destroy(void* event) noexcept override {
    if (event != nullptr) log_destroy_failure(cudaEventDestroy(as_event(event)), "cudaEventDestroy");
  }
  void event_record(void* event, void* stream) override {
    TORUS_CHECK_CUDA(cudaEventRecord(as_event(event), as_stream(stream)));
  }
  bool event_query(void* event) override {
    cudaError_t err = cudaEventQuery(as_event(event));
    if (err == cudaErrorNotReady) return false;
    TORUS_CHECK_CUDA(err);
    return true;
  }
  void event_synchronize(void* event) override { TORUS_CHECK_CUDA(cudaEventSynchronize(as_event(event))); }
  float event_elapsed_ms(void* start, void* end) override {
    float ms = 0;
    TORUS_CHECK_CUDA(cudaEventElapsedTime(&ms, as_event(start), as_event(end)));
    return ms;
  }
};

}  // namespace

Device& cuda_device() {
  static CudaDevice device;
  return device;
}

DeviceGuard::DeviceGuard(int index) : previous_(0), changed_(false) {
  TORUS_CHECK_CUDA(cudaGetDevice(&previous_));
  if (previous_ != index) {
    TORUS_CHECK_CUDA(cudaSetDevice(index));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) log_destroy_failure(cudaSetDevice(previous_), "cudaSetDevice (restoring the previous device)");
}

}  // namespace torus::device::cuda

namespace torus::device {

// Note [Device registration].
void register_cuda_device(DeviceRegistry& registry) { registry.add(cuda::cuda_device()); }

}  // namespace torus::device
