// Same-host peers' shared host regions (peer_mappings.h).
#include "comm/ofi/peer_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>

#include "core/log.h"

namespace torus::comm::ofi {
namespace {

// The first failure of a group is a warning (the op falls back to the
// staging path, correct but slower); later ones are debug lines.
template <typename... Args>
void report(bool& warned, fmt::format_string<Args...> f, Args&&... args) {
  std::string msg = fmt::format(f, std::forward<Args>(args)...);
  if (!warned) {
    warned = true;
    TORUS_LOG_WARN("zero-copy host path unavailable, using the staging path: {}", msg);
  } else {
    TORUS_LOG_DEBUG("zero-copy: {}", msg);
  }
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Maps [from, to) of a new mapping in at once (the op is about to touch all
// of it); where the kernel cannot, the pages fault in as they are touched.
void populate(char* base, size_t from, size_t to) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t lo = from / page * page;
  if (to <= lo) return;
  (void)::madvise(base + lo, to - lo, MADV_POPULATE_WRITE);
}

}  // namespace

PeerMappings::~PeerMappings() {
  for (auto& [key, e] : entries_) ::munmap(e.base, e.bytes);
}

char* PeerMappings::map(int pid, uint32_t id, int fd, uint64_t inode, size_t need_bytes, size_t populate_from) {
  const auto key = std::make_tuple(pid, id, inode);
  if (auto it = entries_.find(key); it != entries_.end()) {
    if (it->second.bytes < need_bytes) return nullptr;
    it->second.last_use = ++clock_;
    return it->second.base;
  }
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) {
    report(warned_, "cannot open {} (pid {} region {}): {}", path, pid, id, std::strerror(errno));
    return nullptr;
  }
  struct stat st{};
  if (::fstat(f, &st) != 0 || static_cast<uint64_t>(st.st_ino) != inode) {
    report(warned_, "{} is not the region the peer published (inode {} against {})", path,
           static_cast<unsigned long long>(st.st_ino), inode);
    ::close(f);
    return nullptr;
  }
  if (static_cast<size_t>(st.st_size) < need_bytes || st.st_size == 0) {
    report(warned_, "{} is {} bytes, {} needed", path, static_cast<long long>(st.st_size), need_bytes);
    ::close(f);
    return nullptr;
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  // Not MAP_POPULATE: a region may be a slab of many blocks, most of them
  // not this op's (and free ranges would get pages). Only the op's range is
  // mapped in up front; the rest faults in when touched.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  ::close(f);
  if (p == MAP_FAILED) {
    report(warned_, "mmap of {} ({} bytes) failed: {}", path, bytes, std::strerror(errno));
    return nullptr;
  }
  populate(static_cast<char*>(p), std::min(populate_from, need_bytes), need_bytes);
  // Evict the least recently used, but never a mapping of the current op
  // (used since begin_op): its pointers are in use. Past the limit with
  // nothing older, the cache grows for this op.
  while (entries_.size() >= max_) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.last_use > op_start_) continue;
      if (oldest == entries_.end() || it->second.last_use < oldest->second.last_use) oldest = it;
    }
    if (oldest == entries_.end()) break;
    ::munmap(oldest->second.base, oldest->second.bytes);
    entries_.erase(oldest);
  }
  try {
    entries_.emplace(key, Entry{static_cast<char*>(p), bytes, ++clock_});
  } catch (...) {
    ::munmap(p, bytes);
    throw;
  }
  return static_cast<char*>(p);
}

}  // namespace torus::comm::ofi
