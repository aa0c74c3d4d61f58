// The Neuron caching allocator and the address map (Note [Neuron addresses]
// in neuron_memory.h).
#include "device/neuron/neuron_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace torus::device::neuron {
namespace {

constexpr size_t kRegionBytes = size_t{1} << 40;  // 1 TiB of addresses, never committed
constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

NeuronMemory& NeuronMemory::get() {
  // NrtLibrary::require runs first, so the library's statics are constructed
  // before this one and destroyed after it: the cache is freed before
  // nrt_close.
  static NeuronMemory memory(NrtLibrary::require("Neuron device memory"));
  return memory;
}

NeuronMemory::NeuronMemory(const NrtLibrary& lib) : lib_(lib) {
  void* p = mmap(nullptr, kRegionBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TORUS_CHECK(p != MAP_FAILED, Error, "Neuron device memory: reserving {} GiB of address space failed: {}",
              kRegionBytes >> 30, std::strerror(errno));
  region_ = reinterpret_cast<uintptr_t>(p);
  region_bytes_ = kRegionBytes;
  free_ranges_.emplace(region_, region_bytes_);
}

NeuronMemory::~NeuronMemory() {
  size_t live = 0;
  for (const auto& [base, b] : blocks_) live += b.in_use ? 1 : 0;
  if (live != 0) TORUS_LOG_WARN("Neuron device memory: {} allocation(s) still live at exit; freeing them", live);
  for (auto& [base, b] : blocks_) lib_.api().nrt_tensor_free(&b.tensor);
  blocks_.clear();
  cached_.clear();
  munmap(reinterpret_cast<void*>(region_), region_bytes_);
}

size_t NeuronMemory::round_size(size_t bytes) {
  return bytes < kSmallLimit ? round_up(bytes, kSmallRound) : round_up(bytes, kLargeRound);
}

uintptr_t NeuronMemory::reserve_addresses(size_t bytes) {
  for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
    if (it->second < bytes) continue;
    uintptr_t base = it->first;
    size_t left = it->second - bytes;
    free_ranges_.erase(it);
    if (left != 0) free_ranges_.emplace(base + bytes, left);
    return base;
  }
  throw Error(fmt::format("Neuron device memory: the {} GiB address region is exhausted", region_bytes_ >> 30));
}

void NeuronMemory::release_addresses(uintptr_t base, size_t bytes) {
  auto [it, inserted] = free_ranges_.emplace(base, bytes);
  // Coalesce with the next and the previous free range.
  auto next = std::next(it);
  if (next != free_ranges_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_ranges_.erase(next);
  }
  if (it != free_ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_ranges_.erase(it);
    }
  }
}

void* NeuronMemory::allocate(int core, size_t bytes) {
  if (bytes == 0) return nullptr;
  TORUS_CHECK(core >= 0 && core < std::max(lib_.visible_cores(), 1), InvalidArgument,
              "Neuron device memory: NeuronCore {} is not visible (visible: {})", core, lib_.visible_cores());
  const size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  // From the cache: the smallest block of this core that fits and wastes
  // little (exact size below 1 MiB, at most 1/4 more above).
  const size_t limit = size < kSmallLimit ? size : size + size / 4;
  auto it = cached_.lower_bound({core, size});
  uintptr_t base = 0;
  if (it != cached_.end() && it->first.first == core && it->first.second <= limit) {
    base = it->second;
    cached_.erase(it);
    ++stats_.cache_hits;
  } else {
    nrt_tensor* t = nullptr;
    NRT_STATUS s = lib_.api().nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, core, size, "torus", &t);
    if (s != NRT_SUCCESS && !cached_.empty()) {
      empty_cache_locked();
      s = lib_.api().nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, core, size, "torus", &t);
    }
    if (s != NRT_SUCCESS || t == nullptr) {
      ++stats_.failed_allocations;
      throw Error(fmt::format(
          "Neuron device memory: nrt_tensor_allocate of {} bytes on NeuronCore {} failed: {} (allocated {} bytes in "
          "{} blocks, reserved {} bytes; the cache was released before retrying)",
          size, core, status_name(s), stats_.allocated_bytes, stats_.allocations - stats_.frees,
          stats_.reserved_bytes));
    }
    base = reserve_addresses(size);
    blocks_.emplace(base, Block{t, size, 0, core, false});
    ++stats_.runtime_allocations;
    stats_.reserved_bytes += size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  }
  Block& b = blocks_.at(base);
  b.in_use = true;
  b.requested = bytes;
  ++stats_.allocations;
  stats_.allocated_bytes += b.size;
  stats_.requested_bytes += bytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return reinterpret_cast<void*>(base);
}

void NeuronMemory::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end() || !it->second.in_use) {
    TORUS_LOG_ERROR("Neuron device memory: deallocate({}) is not the start of a live allocation; ignored", ptr);
    return;
  }
  Block& b = it->second;
  b.in_use = false;
  ++stats_.frees;
  stats_.allocated_bytes -= b.size;
  stats_.requested_bytes -= b.requested;
  b.requested = 0;
  cached_.emplace(std::make_pair(b.core, b.size), it->first);
}

bool NeuronMemory::is_device_address(const void* p) const noexcept {
  auto a = reinterpret_cast<uintptr_t>(p);
  return a >= region_ && a < region_ + region_bytes_;
}

NeuronMemory::Resolved NeuronMemory::resolve(const void* p, size_t bytes, const char* what) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.upper_bound(a);
  TORUS_CHECK(it != blocks_.begin(), InvalidArgument, "{}: {} is Neuron device memory that is not allocated", what,
              p);
  --it;
  const Block& b = it->second;
  TORUS_CHECK(b.in_use && a < it->first + b.size, InvalidArgument,
              "{}: {} is Neuron device memory that is not allocated (freed, or past the end of an allocation)", what,
              p);
  size_t offset = a - it->first;
  // Bounds are those of the request, not of the rounded block.
  size_t available = offset < b.requested ? b.requested - offset : 0;
  TORUS_CHECK(bytes <= available, InvalidArgument,
              "{}: {} bytes at {} run past the end of its Neuron allocation (offset {} of {} bytes)", what, bytes, p,
              offset, b.requested);
  return Resolved{b.tensor, offset, available, b.core};
}

AllocatorStats NeuronMemory::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void NeuronMemory::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void NeuronMemory::free_block(uintptr_t base) {
  auto it = blocks_.find(base);
  lib_.api().nrt_tensor_free(&it->second.tensor);
  ++stats_.runtime_frees;
  stats_.reserved_bytes -= it->second.size;
  release_addresses(base, it->second.size);
  blocks_.erase(it);
}

void NeuronMemory::empty_cache_locked() {
  for (const auto& [key, base] : cached_) free_block(base);
  cached_.clear();
}

void NeuronMemory::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

}  // namespace torus::device::neuron
