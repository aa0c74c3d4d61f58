// Private: a group's mappings of its same-host peers' shared host regions
// (Note [Shared host buffers] in torus/comm/shared_host.h).
//
// A region is found again by its owner's pid, the owner's region id and the
// file's inode (an id comes back only after 2^32 allocations, and then with
// another inode unless the file is the same), so a cached mapping never
// stands for a newer region. Opening checks the inode too: a pid that
// names another process here (another pid namespace) fails the check
// instead of mapping a stranger's file. At most `max_regions` are kept; the least recently
// used is unmapped first, never one the current op (since begin_op) uses.
// Not thread safe: one op of the group at a time (the group's ops are
// serialised, whether the engine runs them or the caller's thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

namespace torus::comm::ofi {

class PeerMappings {
 public:
  explicit PeerMappings(size_t max_regions = 256) : max_(max_regions) {}
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  // Start of process `pid`'s region `id` (its file descriptor `fd` there,
  // whose inode is `inode`), mapped on first use; nullptr when it cannot be
  // opened or mapped, is another file, or is smaller than `need_bytes` (the first such failure is logged as a
  // warning, later ones at debug level). A new mapping has its bytes
  // [populate_from, need_bytes) mapped in up front, the op's range; the rest
  // of the region faults in when touched.
  char* map(int pid, uint32_t id, int fd, uint64_t inode, size_t need_bytes, size_t populate_from = 0);

  // A new op starts: what it maps from now on stays mapped until it ends.
  void begin_op() { op_start_ = clock_; }

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    char* base;
    size_t bytes;
    uint64_t last_use;
  };
  std::map<std::tuple<int, uint32_t, uint64_t>, Entry> entries_;
  uint64_t clock_ = 0;
  uint64_t op_start_ = 0;  // entries used after this clock belong to the current op
  size_t max_;
  bool warned_ = false;
};

}  // namespace torus::comm::ofi
