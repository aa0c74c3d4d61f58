// The backend-independent part of the device layer: Stream/Event handles,
// RAII buffers, the registry of device kinds (Note [Device registration]),
// device selection and the thread-local current stream (Note [Stream order]
// in device.h).
#include "torus/device/device.h"

#include <algorithm>
#include <array>
#include <utility>

#include "core/log.h"
#include "device/registry.h"

namespace torus::device {

// --- Stream -------------------------------------------------------------------

Stream::~Stream() { reset(); }

Stream::Stream(Stream&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      index_(other.index_),
      handle_(std::exchange(other.handle_, nullptr)),
      owned_(std::exchange(other.owned_, false)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    index_ = other.index_;
    handle_ = std::exchange(other.handle_, nullptr);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void Stream::reset() noexcept {
  if (device_ != nullptr && owned_) device_->stream_destroy(handle_);
  device_ = nullptr;
  handle_ = nullptr;
  owned_ = false;
}

Stream Stream::borrow(DeviceType type, int device_index, void* native_handle) {
  return Stream(&get_device(type), device_index, native_handle, false);
}

Stream Stream::view() const { return Stream(device_, index_, handle_, false); }

DeviceType Stream::type() const {
  TORUS_CHECK(valid(), InvalidArgument, "type() of an invalid stream");
  return device_->type();
}

void Stream::synchronize() const {
  TORUS_CHECK(valid(), InvalidArgument, "synchronize() on an invalid stream");
  device_->stream_synchronize(handle_);
}

bool Stream::query() const {
  TORUS_CHECK(valid(), InvalidArgument, "query() on an invalid stream");
  return device_->stream_query(handle_);
}

void Stream::wait(const Event& event) const {
  TORUS_CHECK(valid() && event.valid(), InvalidArgument, "wait() needs a valid stream and event");
  TORUS_CHECK(event.type() == type(), InvalidArgument, "a {} stream cannot wait on a {} event",
              device_type_name(type()), device_type_name(event.type()));
  device_->stream_wait_event(handle_, event.native_handle());
}

// --- Event --------------------------------------------------------------------

Event::~Event() { reset(); }

Event::Event(Event&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)), index_(other.index_), handle_(std::exchange(other.handle_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    index_ = other.index_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Event::reset() noexcept {
  if (device_ != nullptr) device_->event_destroy(handle_);
  device_ = nullptr;
  handle_ = nullptr;
}

DeviceType Event::type() const {
  TORUS_CHECK(valid(), InvalidArgument, "type() of an invalid event");
  return device_->type();
}

void Event::record(const Stream& stream) {
  TORUS_CHECK(valid() && stream.valid(), InvalidArgument, "record() needs a valid event and stream");
  TORUS_CHECK(stream.type() == type() && stream.device_index() == index_, InvalidArgument,
              "an event of {} device {} cannot record a stream of {} device {}", device_type_name(type()), index_,
              device_type_name(stream.type()), stream.device_index());
  device_->event_record(handle_, stream.native_handle());
}

bool Event::query() const {
  TORUS_CHECK(valid(), InvalidArgument, "query() on an invalid event");
  return device_->event_query(handle_);
}

void Event::synchronize() const {
  TORUS_CHECK(valid(), InvalidArgument, "synchronize() on an invalid event");
  device_->event_synchronize(handle_);
}

float Event::elapsed_ms(const Event& start) const {
  TORUS_CHECK(valid() && start.valid() && start.type() == type(), InvalidArgument,
              "elapsed_ms() needs two valid events of one device type");
  return device_->event_elapsed_ms(start.handle_, handle_);
}

// --- Device -------------------------------------------------------------------

Stream Device::create_stream(const StreamOptions& options) {
  int index = current();
  return Stream(this, index, stream_create(options), true);
}

NicAddress Device::nic_address(const void* ptr, size_t) { return {const_cast<void*>(ptr), current()}; }

Stream Device::default_stream(int index) { return Stream(this, index, nullptr, false); }

Event Device::create_event(const EventOptions& options) {
  int index = current();
  return Event(this, index, event_create(options));
}

// --- registry -----------------------------------------------------------------

void DeviceRegistry::add(Device& device) {
  const DeviceType type = device.type();
  for (const Device* d : devices_) {
    TORUS_CHECK(d->type() != type, InvalidArgument, "device kind '{}' is registered twice", device_type_name(type));
    TORUS_CHECK(type == DeviceType::kCPU || d->type() == DeviceType::kCPU, InvalidArgument,
                "device kinds '{}' and '{}' are both registered: a build has at most one accelerator",
                device_type_name(d->type()), device_type_name(type));
  }
  devices_.push_back(&device);
}

namespace {

const DeviceRegistry& registry() {
  static const DeviceRegistry r = [] {
    DeviceRegistry built;
    register_built_devices(built);
    return built;
  }();
  return r;
}

Device* find_device(DeviceType type) noexcept {
  for (Device* d : registry().devices()) {
    if (d->type() == type) return d;
  }
  return nullptr;
}

}  // namespace

bool registered(DeviceType type) noexcept { return find_device(type) != nullptr; }

std::vector<DeviceType> registered_kinds() {
  std::vector<DeviceType> kinds;
  for (const Device* d : registry().devices()) kinds.push_back(d->type());
  std::stable_partition(kinds.begin(), kinds.end(), [](DeviceType t) { return t == DeviceType::kCPU; });
  return kinds;
}

Device* accelerator() {
  for (Device* d : registry().devices()) {
    if (d->type() != DeviceType::kCPU) return d;
  }
  return nullptr;
}

DeviceType accelerator_type() {
  Device* a = accelerator();
  return a != nullptr ? a->type() : DeviceType::kCPU;
}

Device& get_device(DeviceType type) {
  if (Device* d = find_device(type)) return *d;
  Device* a = accelerator();
  throw Unsupported(fmt::format("device type '{}' is not built into this Torus (accelerator: {})",
                                device_type_name(type), a != nullptr ? device_type_name(a->type()) : "none"));
}

int select_device_for_local_rank(int local_rank, int local_size) {
  Device* a = accelerator();
  TORUS_CHECK(a != nullptr, Unsupported,
              "no accelerator is built into this Torus (configure with TORUS_WITH_CUDA=ON or TORUS_WITH_NEURON=ON)");
  TORUS_CHECK(local_rank >= 0 && local_size > local_rank, InvalidArgument,
              "select_device_for_local_rank: local rank {} of {} is out of range", local_rank, local_size);
  int n = a->count();
  TORUS_CHECK(n > 0, Error, "no {} device is visible to local rank {}: {}", device_type_name(a->type()), local_rank,
              a->describe());
  if (n > 1 && n < local_size) {
    TORUS_LOG_WARN("{} local ranks share {} visible {} devices: ranks {} apart use the same device, which NCCL rejects",
                   local_size, n, device_type_name(a->type()), n);
  }
  int index = local_rank % n;
  a->set_current(index);
  TORUS_LOG_DEBUG("local rank {} of {} uses {} device {} of {}", local_rank, local_size, device_type_name(a->type()),
                  index, n);
  return index;
}

// --- current stream -------------------------------------------------------------

namespace {

constexpr int kMaxDevices = 64;

// Per thread, per accelerator device: the current stream handle, if set.
struct CurrentStreams {
  std::array<void*, kMaxDevices> handle{};
  std::array<bool, kMaxDevices> set{};
};
thread_local CurrentStreams t_current;

int checked_index(int index) {
  TORUS_CHECK(index >= 0 && index < kMaxDevices, InvalidArgument, "device index {} is out of range [0, {})", index,
              kMaxDevices);
  return index;
}

}  // namespace

Stream current_stream(DeviceType type, int index) {
  Device& d = get_device(type);
  if (index < 0) index = d.current();
  if (type == DeviceType::kCPU) return d.default_stream(index);
  checked_index(index);
  void* h = t_current.set[index] ? t_current.handle[index] : nullptr;
  return Stream::borrow(type, index, h);
}

StreamGuard::StreamGuard(const Stream& stream)
    : type_(stream.type()), index_(stream.device_index()), previous_(nullptr), had_previous_(false) {
  if (type_ == DeviceType::kCPU) return;
  checked_index(index_);
  previous_ = t_current.handle[index_];
  had_previous_ = t_current.set[index_];
  t_current.handle[index_] = stream.native_handle();
  t_current.set[index_] = true;
}

StreamGuard::~StreamGuard() {
  if (type_ == DeviceType::kCPU) return;
  t_current.handle[index_] = previous_;
  t_current.set[index_] = had_previous_;
}

// --- buffers --------------------------------------------------------------------

template <BufferMemory M>
Buffer<M>::Buffer(DeviceType type, size_t bytes) : device_(&get_device(type)), bytes_(bytes) {
  ptr_ = M == BufferMemory::kDevice ? device_->allocate(bytes) : device_->allocate_pinned(bytes);
}

template <BufferMemory M>
Buffer<M>::Buffer(Buffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

template <BufferMemory M>
Buffer<M>& Buffer<M>::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::exchange(other.device_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

template <BufferMemory M>
void Buffer<M>::reset() noexcept {
  if (device_ != nullptr && ptr_ != nullptr) {
    if (M == BufferMemory::kDevice) {
      device_->deallocate(ptr_);
    } else {
      device_->deallocate_pinned(ptr_);
    }
  }
  device_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

template class Buffer<BufferMemory::kDevice>;
template class Buffer<BufferMemory::kPinned>;

}  // namespace torus::device
