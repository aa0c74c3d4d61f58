// torus/device/device.h — the device layer: memory, streams, events, copies,
// pinned host memory and device selection, behind one interface.
//
// A Device is the implementation for one DeviceType. Device kinds register
// themselves (Note [Device registration]): the CPU device is always there;
// the accelerator (CUDA or Neuron) is the one the build compiled in, so at
// most one accelerator implementation is present. Ask registered(type)
// rather than any build option.
// Nothing here names a CUDA type: streams and events are opaque handles whose
// native_handle() is the backend's own object (a cudaStream_t / cudaEvent_t
// for CUDA, passed around as void*).
//
// Note [Stream order]: work on a device is ordered by streams. Copies and
// kernels queued on one stream run in issue order; work on two streams is
// ordered only through events (Stream::wait(Event)). Each thread has a
// *current stream* per device (current_stream()), which defaults to the
// device's default stream and is set for a scope with StreamGuard. Layers that
// receive no explicit stream (the comm backends, kernel launchers called
// through higher layers) order their work after the calling thread's current
// stream. ProcessGroup sets it from LibTorch's current stream.
//
// The CPU device executes everything at once: its streams are always idle and
// its events always complete, so code written against this interface runs
// unchanged on host memory.
//
// Errors: allocation failure and every failed runtime call throw
// torus::Error naming the call, the runtime's error string and file:line.
// "No device present" is not an error for count() (it returns 0); it is one
// for everything that needs a device. Thread safety: all functions are thread
// safe; a Stream or Event object itself must not be moved while another
// thread uses it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "torus/core/dtype.h"

namespace torus::device {

struct DeviceProperties {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  std::string name;
  size_t total_memory = 0;            // bytes
  int compute_major = 0;              // CUDA compute capability (0 elsewhere)
  int compute_minor = 0;
  int multiprocessors = 0;
  // Theoretical peak memory bandwidth in bytes/s (from memory clock and bus
  // width); 0 when the device does not report it.
  double peak_memory_bandwidth = 0;
};

struct StreamOptions {
  bool high_priority = false;  // a higher scheduling priority (comm streams)
};

struct EventOptions {
  bool timing = false;  // record timestamps (elapsed_ms); slower to record
};

class Device;
class Event;

// Device memory as a network adapter registers it (libfabric FI_HMEM): the
// address the device's driver knows it by and the device index. A null
// address: this memory cannot be registered directly; move it through host
// memory instead.
struct NicAddress {
  void* address = nullptr;
  int device = 0;
};

// A queue of work on one device. Owning (created by Device::create_stream,
// destroyed with this object) or borrowed (wrapping a stream owned
// elsewhere, e.g. LibTorch's current stream). Movable, not copyable.
class Stream {
 public:
  Stream() = default;  // invalid: valid() is false
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Wraps a stream owned elsewhere; this object never destroys it.
  // `native_handle` may be nullptr for the default stream. Throws Unsupported
  // when `type` is not built in.
  static Stream borrow(DeviceType type, int device_index, void* native_handle);

  bool valid() const { return device_ != nullptr; }
  DeviceType type() const;
  int device_index() const { return index_; }
  void* native_handle() const { return handle_; }
  bool owned() const { return owned_; }
  // A borrowed view of the same stream.
  Stream view() const;

  // Blocks the host until everything queued so far on this stream is done.
  void synchronize() const;
  // True when everything queued so far has finished. Never blocks.
  bool query() const;
  // Makes later work on this stream wait for `event` (device side; the host
  // does not block). An event never recorded is complete.
  void wait(const Event& event) const;

 private:
  friend class Device;
  Stream(Device* device, int index, void* handle, bool owned)
      : device_(device), index_(index), handle_(handle), owned_(owned) {}
  void reset() noexcept;

  Device* device_ = nullptr;
  int index_ = 0;
  void* handle_ = nullptr;
  bool owned_ = false;
};

// A marker in a stream. Movable, not copyable.
class Event {
 public:
  Event() = default;  // invalid: valid() is false
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  bool valid() const { return device_ != nullptr; }
  DeviceType type() const;
  int device_index() const { return index_; }
  void* native_handle() const { return handle_; }

  // Captures the work queued so far on `stream` (same device). Never blocks.
  void record(const Stream& stream);
  // True once the captured work has finished (or if never recorded).
  bool query() const;
  // Blocks the host until the captured work has finished.
  void synchronize() const;
  // Milliseconds between `start` and this event; both recorded with
  // EventOptions::timing and complete. Throws Error otherwise.
  float elapsed_ms(const Event& start) const;

 private:
  friend class Device;
  Event(Device* device, int index, void* handle) : device_(device), index_(index), handle_(handle) {}
  void reset() noexcept;

  Device* device_ = nullptr;
  int index_ = 0;
  void* handle_ = nullptr;
};

// The implementation for one device type. Obtained from get_device(); lives
// for the whole process.
class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceType type() const = 0;
  // Number of devices of this type visible to the process; 0 when none (or
  // when the driver is missing). Never throws.
  virtual int count() const = 0;
  // The calling thread's current device index, and setting it.
  virtual int current() const = 0;
  virtual void set_current(int index) = 0;
  virtual DeviceProperties properties(int index) const = 0;
  // One line for logs and test skips: what is present, or why nothing is
  // ("no CUDA device: cudaGetDeviceCount: no CUDA-capable device is detected").
  virtual std::string describe() const = 0;

  // Device memory on the current device. allocate(0) returns nullptr.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) noexcept = 0;
  // Page-locked host memory, usable for asynchronous copies.
  virtual void* allocate_pinned(size_t bytes) = 0;
  virtual void deallocate_pinned(void* ptr) noexcept = 0;

  // Copies between any two of: this device's memory, pinned host memory and
  // pageable host memory (the direction is inferred from the pointers).
  // copy_async is ordered on `stream` and returns once queued (a copy from or
  // to pageable host memory may return only after it completed); copy is
  // synchronous with respect to the host.
  virtual void copy_async(void* dst, const void* src, size_t bytes, const Stream& stream) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Sets `bytes` bytes at dst to `value`, ordered on `stream`.
  virtual void fill_async(void* dst, int value, size_t bytes, const Stream& stream) = 0;
  // Blocks until all work on the current device has finished.
  virtual void synchronize() = 0;

  // [ptr, ptr + bytes) of this device's memory as a network adapter would
  // register it (the ofi backend's device buffers, Note [Device buffers] in
  // src/comm/ofi/ofi_backend.cpp). The default, for devices whose pointers
  // are the addresses (CPU, CUDA): ptr itself on the current device,
  // unchecked. Neuron checks that the range lies inside one live allocation
  // (InvalidArgument otherwise) and answers the runtime's device address.
  virtual NicAddress nic_address(const void* ptr, size_t bytes);

  // A new stream on the current device.
  Stream create_stream(const StreamOptions& options = {});
  // The default stream of device `index` (borrowed).
  Stream default_stream(int index);
  // A new event on the current device.
  Event create_event(const EventOptions& options = {});

 protected:
  // Handle operations behind Stream and Event; implementations throw Error on
  // runtime failure, except the noexcept destroys, which log instead.
  friend class Stream;
  friend class Event;
  virtual void* stream_create(const StreamOptions& options) = 0;
  virtual void stream_destroy(void* stream) noexcept = 0;
  virtual void stream_synchronize(void* stream) = 0;
  virtual bool stream_query(void* stream) = 0;
  virtual void stream_wait_event(void* stream, void* event) = 0;
  virtual void* event_create(const EventOptions& options) = 0;
  virtual void event_destroy(void* event) noexcept = 0;
  virtual void event_record(void* event, void* stream) = 0;
  virtual bool event_query(void* event) = 0;
  virtual void event_synchronize(void* event) = 0;
  virtual float event_elapsed_ms(void* start, void* end) = 0;
};

// Note [Device registration]: each device kind's own file defines
//   void register_<kind>_device(DeviceRegistry&);   (src/device/registry.h)
// and the build calls those of the kinds it compiled, once, on the first
// lookup below (the list is generated by src/CMakeLists.txt, not left to
// static initialisers that a linker may drop). Nothing else names a build
// option: code and tests ask registered() what is there.

// The CPU device: always present.
Device& cpu_device();
// The accelerator built into this library (the registered device kind other
// than the CPU), or nullptr in a CPU-only build. Present even when no device
// is visible: check count().
Device* accelerator();
// The device implementation for `type`; throws Unsupported when not built.
Device& get_device(DeviceType type);
// The accelerator's type, or kCPU in a CPU-only build.
DeviceType accelerator_type();
// Whether device kind `type` is built into this library (get_device(type)
// succeeds). Never throws.
bool registered(DeviceType type) noexcept;
// The registered kinds, the CPU first.
std::vector<DeviceType> registered_kinds();

// Chooses this rank's accelerator from its rank on the host —
// local_rank % count() — makes it current on the calling thread and returns
// its index. Throws Unsupported in a CPU-only build and Error when no device
// is visible. With fewer devices than local ranks (and more than one device)
// it logs a warning: NCCL needs one device per rank.
int select_device_for_local_rank(int local_rank, int local_size);

// The calling thread's current stream on device `index` of `type` (the
// current device when index < 0), borrowed. Defaults to the default stream.
Stream current_stream(DeviceType type, int index = -1);

// Makes `stream` the calling thread's current stream of its device for the
// guard's lifetime, restoring the previous one on destruction. The stream
// must outlive the guard. Guards nest (destroy them in reverse order).
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  DeviceType type_;
  int index_;
  void* previous_;
  bool had_previous_;
};

// Which memory a Buffer owns: the device's own, or page-locked host memory
// that the device copies to and from asynchronously.
enum class BufferMemory : uint8_t { kDevice, kPinned };

// Owning memory of one kind (RAII): `bytes` from Device::allocate (kDevice,
// on the current device of `type`) or Device::allocate_pinned (kPinned),
// returned to the same device by reset() or destruction. A zero-byte buffer
// holds nullptr. Movable, not copyable. Throws like the allocation.
template <BufferMemory M>
class Buffer {
 public:
  Buffer() = default;
  Buffer(DeviceType type, size_t bytes);
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }
  void reset() noexcept;

 private:
  Device* device_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owning device memory.
using DeviceBuffer = Buffer<BufferMemory::kDevice>;
// Owning page-locked host memory.
using PinnedBuffer = Buffer<BufferMemory::kPinned>;

extern template class Buffer<BufferMemory::kDevice>;
extern template class Buffer<BufferMemory::kPinned>;

}  // namespace torus::device
