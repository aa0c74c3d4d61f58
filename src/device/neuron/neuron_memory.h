// Private: Neuron device memory — addresses for runtime tensors, and the
// caching allocator.
//
// Note [Neuron addresses]: the runtime hands out tensor handles
// (nrt_tensor_t*), not pointers, while Torus's device layer and comm backends
// speak pointers. Every runtime tensor Torus allocates is therefore given an
// address range inside a region of virtual address space reserved at start
// (PROT_NONE: never readable or writable from the host, so a host access to
// "device memory" faults instead of silently reading garbage, as it would on
// the device). A pointer anywhere inside an allocation resolves to (tensor,
// offset) through an ordered map, so views at an offset (ptr + k) work like
// CUDA pointers. The reserved region holds 1 TiB of addresses per process;
// its pages are never committed.
//
// The caching allocator keeps freed tensors for reuse (runtime allocation is
// slow): requests round up to 512 bytes below 1 MiB and to 2 MiB multiples
// above; a freed block is reused for a request of its rounded size (small)
// or of up to 5/4 of the request (large). When the runtime reports it is out
// of memory, the cache is released and the allocation retried once; a second
// failure throws Error with the allocator's statistics.
//
// Thread safety: all members are thread safe (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "device/neuron/nrt_api.h"
#include "torus/device/neuron.h"

namespace torus::device::neuron {

class NeuronMemory {
 public:
  // The process's allocator; requires the runtime (throws Error naming why
  // it is unavailable). Constructed after the library, destroyed before it.
  static NeuronMemory& get();

  // `bytes` on NeuronCore `core` (logical id). allocate(0) returns nullptr.
  void* allocate(int core, size_t bytes);
  // Returns the block to the cache. Null is ignored; an address that is not
  // the start of a live allocation is logged and ignored (noexcept).
  void deallocate(void* ptr) noexcept;

  // Whether `p` lies in the reserved device address region (device memory,
  // live or not). Cheap; never throws.
  bool is_device_address(const void* p) const noexcept;

  struct Resolved {
    nrt_tensor* tensor = nullptr;
    size_t offset = 0;     // of `p` within the tensor
    size_t available = 0;  // bytes from `p` to the end of the allocation
    int core = 0;
  };
  // (tensor, offset) of a pointer inside a live allocation; InvalidArgument
  // when `p` is device memory that is not allocated, or when fewer than
  // `bytes` bytes follow it inside its allocation.
  Resolved resolve(const void* p, size_t bytes, const char* what) const;

  AllocatorStats stats() const;
  void reset_peak_stats();
  // Frees every cached (unused) block back to the runtime.
  void empty_cache();

  ~NeuronMemory();
  NeuronMemory(const NeuronMemory&) = delete;
  NeuronMemory& operator=(const NeuronMemory&) = delete;

 private:
  explicit NeuronMemory(const NrtLibrary& lib);

  struct Block {
    nrt_tensor* tensor = nullptr;
    size_t size = 0;       // rounded, = the tensor's size
    size_t requested = 0;  // while in use
    int core = 0;
    bool in_use = false;
  };

  static size_t round_size(size_t bytes);
  uintptr_t reserve_addresses(size_t bytes);  // mu_ held
  void release_addresses(uintptr_t base, size_t bytes);  // mu_ held
  void free_block(uintptr_t base);  // mu_ held; back to the runtime
  void empty_cache_locked();

  const NrtLibrary& lib_;
  mutable std::mutex mu_;
  uintptr_t region_ = 0;
  size_t region_bytes_ = 0;
  std::map<uintptr_t, size_t> free_ranges_;      // address ranges not given to any block
  std::map<uintptr_t, Block> blocks_;            // every block the runtime gave us, by address
  std::multimap<std::pair<int, size_t>, uintptr_t> cached_;  // (core, size) -> address of an unused block
  AllocatorStats stats_;
};

}  // namespace torus::device::neuron
