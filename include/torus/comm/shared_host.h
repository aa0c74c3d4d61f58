// torus/comm/shared_host.h — host memory that same-host peers can map.
//
// Note [Shared host buffers]: ranks on one host normally exchange data
// through the host segment's staging stripes (two copies: into a stripe,
// out of it). When every rank's buffers of a collective come from
// shared_host_alloc, a peer can map them, and the ofi backend's host path
// reads the peers' inputs and writes their outputs directly: one pass over
// memory per rank (docs/ofi.md, "Zero-copy"). The decision is made per op
// and collectively; an op where any rank's buffer is ordinary memory takes
// the staging path, with the same results.
//
// The memory is an anonymous shared file (memfd) of this process. A peer of
// the same user opens it through /proc/<pid>/fd, so nothing is left behind
// when the process dies. A peer keeps its mapping of a region cached after
// the op (up to a bounded number of regions per group), so the pages of a
// freed region return to the system once the peers evict it or close the
// group. Memory from here is zeroed and page aligned. Each allocation holds
// one file descriptor until it is freed. Thread safe.
//
//   void* p = torus::comm::shared_host_alloc(64 << 20);
//   ... use p as the input and output of a collective ...
//   torus::comm::shared_host_free(p);
//
// Tensors over this memory: torus::comm::shared_host_zeros (process_group.h)
// or torus.shared_host_zeros in Python. Data-parallel gradient buckets on
// the CPU use it (DDPOptions::shared_host_buckets).
//
// fork(): the memory becomes private in the child (its writes never reach
// the parent) and the child never offers it to peers. By default the child
// maps it copy-on-write from the files, which costs nothing but lets a page
// the child has not written show the parent's later writes: a child that
// must see the memory exactly as it was at the fork (a snapshot it writes
// out while the parent trains on) needs TORUS_SHARED_HOST_FORK=copy, which
// copies the live bytes in the child (docs/comm.md, "Shared host buffers").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "torus/core/params.h"

namespace torus::comm {

// `bytes` (> 0) of zeroed shared host memory. Throws InvalidArgument for 0
// and CommError when the kernel refuses (the message says why).
void* shared_host_alloc(size_t bytes);

// Frees memory from shared_host_alloc. nullptr does nothing; a pointer that
// is not the start of a live allocation throws InvalidArgument.
void shared_host_free(void* p);

// Where [p, p + bytes) lies, when all of it is inside one live allocation.
struct SharedHostSpan {
  uint32_t id = 0;          // per allocation within this process, from 1 (wraps after 2^32 - 1)
  int fd = -1;              // the allocation's file, for peers: /proc/<pid>/fd/<fd>
  uint64_t inode = 0;       // of that file: a peer checks it is the file it opened
  size_t offset = 0;        // of p from the allocation's start
  size_t region_bytes = 0;  // size of the allocation
};
std::optional<SharedHostSpan> find_shared_host(const void* p, size_t bytes);

// True when find_shared_host(p, bytes) finds a span.
inline bool is_shared_host(const void* p, size_t bytes) { return find_shared_host(p, bytes).has_value(); }

// Note [Shared host pool]: many blocks carved out of a few large shared
// files ("slabs"), for allocators that serve every large tensor: one file
// descriptor per slab instead of per allocation, and a peer maps a slab
// once for all the blocks in it. Blocks are page aligned and page rounded,
// best fit, coalesced when freed. Freed blocks keep their pages, and wholly
// free slabs stay mapped, so that the next training step's tensors reuse
// them without page faults, until more than `cache_bytes` of freed memory is
// kept; then wholly free slabs are returned to the system and the pages of
// other free blocks given back (hole punched) until half that is left. The
// memory is not zeroed. Thread safe.
struct SharedHostPoolOptions {
  size_t slab_bytes = size_t{64} << 20;    // TORUS_SHARED_HOST_SLAB_BYTES: a new slab's size (at least the request)
  size_t cache_bytes = size_t{256} << 20;  // TORUS_SHARED_HOST_CACHE_BYTES: freed bytes kept resident
  // TORUS_SHARED_HOST_FORK=copy: a fork() child gets an exact copy of the
  // live memory; view (false, the default): a copy-on-write view of the
  // files (Note [Shared host memory across fork] in shared_host.cpp, and
  // the fork paragraph at the top). Applies to single allocations too.
  bool fork_copy = false;
  // The defaults above, overridden by the variables `params` holds
  // (EnvParams::shared_host, parsed and checked in src/core/params.cpp).
  static SharedHostPoolOptions from_params(const EnvParams& params);
  static SharedHostPoolOptions from_env();  // from_params(env_params()); bad values throw InvalidArgument
};
// Replaces the pool's options (existing slabs keep their size).
void set_shared_host_pool_options(const SharedHostPoolOptions& options);

// A block of at least `bytes` (> 0) from the pool. Throws like shared_host_alloc.
void* shared_host_pool_alloc(size_t bytes);
// Frees a block from shared_host_pool_alloc and returns true; returns false
// (and does nothing) for any other pointer, so a caller can fall through to
// another allocator. Never throws.
bool shared_host_pool_free(void* p) noexcept;

struct SharedHostPoolStats {
  size_t slabs = 0;          // live slabs
  size_t slab_bytes = 0;     // their total size
  size_t live_blocks = 0;
  size_t live_bytes = 0;     // page-rounded
  size_t free_bytes = 0;     // in live slabs, not allocated
  size_t free_blocks = 0;    // the free ranges they form (neighbours are merged)
  size_t cached_bytes = 0;   // of free_bytes, freed but not given back (an upper bound)
  uint64_t allocs = 0;       // blocks handed out since the process started
  uint64_t slabs_made = 0;   // slabs created since the process started
  uint64_t punches = 0;      // free blocks whose pages were given back
};
SharedHostPoolStats shared_host_pool_stats();

// Note [Shared host allocator]: LibTorch's CPU allocator replaced by one that
// serves allocations of at least `min_bytes` from the shared host pool and
// hands smaller ones to the allocator it replaced. Every large CPU tensor
// created afterwards is shared host memory, so same-host collectives on it
// take the zero-copy path with no change to the program. torus::init
// installs it when the job's host backend is ofi and this host runs two or
// more ranks, unless TORUS_SHARED_HOST_ALLOC=off (on: also for other
// layouts; auto: the default). Tensors that exist before the install keep
// their memory. Never uninstalled. Defined in the tensor layer (libtorus).
struct SharedHostAllocatorOptions {
  size_t min_bytes = size_t{64} << 10;  // TORUS_SHARED_HOST_ALLOC_MIN_BYTES
  SharedHostPoolOptions pool;
  static SharedHostAllocatorOptions from_params(const EnvParams& params);
  static SharedHostAllocatorOptions from_env();  // from_params(env_params())
};
// TORUS_SHARED_HOST_ALLOC: "auto" (default), "on" or "off", parsed into
// EnvParams::shared_host.alloc.
using SharedHostAllocPolicy = ::torus::SharedHostAllocPolicy;
// Installs the allocator (options apply on the first call; later calls
// change nothing) and returns whether it is now LibTorch's CPU allocator
// (false when another allocator of higher priority holds the place).
bool install_shared_host_allocator(const SharedHostAllocatorOptions& options = SharedHostAllocatorOptions::from_env());
bool shared_host_allocator_installed();

class Context;
// Installs the allocator when TORUS_SHARED_HOST_ALLOC asks for it: "on", or
// "auto" (the default) with the ofi host backend and two or more ranks on
// this host. Returns whether it is installed. torus::init calls it; programs
// that build a Context themselves may too.
bool maybe_install_shared_host_allocator(const Context& ctx);

}  // namespace torus::comm
