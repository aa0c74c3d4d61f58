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
// A child created by fork() shares this memory with its parent instead of
// getting a copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

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

}  // namespace torus::comm
