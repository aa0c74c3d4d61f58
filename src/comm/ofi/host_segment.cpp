// The host segment's rendezvous, layout and failure flags (host_segment.h).
#include "comm/ofi/host_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "comm/ofi/liveness.h"
#include "core/log.h"

namespace torus::comm::ofi {
namespace {

constexpr uint64_t kMagic = 0x544f525553484d31ull;  // "TORUSHM1"
constexpr size_t kPage = 4096;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

struct HostSegment::Header {
  uint64_t magic;
  uint32_t local_size;
  uint32_t depth;
  uint64_t stripe;
  uint64_t eager_bytes;
  uint64_t zero_copy_bytes;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> aborted;
  std::atomic<uint32_t> reason_ready;
  // A rank refused the segment while attaching (a configuration that
  // differs): local rank 0 stops waiting for it. An abort of a later op (a
  // rank past attaching whose first op failed) does not end the wait.
  std::atomic<uint32_t> setup_failed;
  int32_t aborted_by;
  char reason[512];
};

HostSegment::HostSegment(const Config& cfg, Store& store)
    : local_rank_(cfg.local_rank), local_size_(cfg.local_size), stripe_(cfg.stripe_bytes), depth_(cfg.depth) {
  TORUS_CHECK(local_size_ >= 2 && cfg.local_rank >= 0 && cfg.local_rank < local_size_, InvalidArgument,
              "host segment: bad local rank {} of {}", cfg.local_rank, local_size_);
  const size_t L = static_cast<size_t>(local_size_), D = static_cast<size_t>(depth_);
  staging_bytes_ = round_up(D * L * stripe_ + D * stripe_, kPage);
  control_offset_ = round_up(sizeof(Header), kPage);
  staging_offset_ = control_offset_ + round_up(L * sizeof(SegmentControl), kPage);
  map_bytes_ = staging_offset_ + L * staging_bytes_;

  Fd fd;
  const std::string ready_key = cfg.store_key + "/ready";
  if (local_rank_ == 0) {
    fd.fd = ::shm_open(cfg.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    TORUS_CHECK_SYS(fd.fd, "shm_open({}) for the host segment", cfg.name);
    if (::ftruncate(fd.fd, static_cast<off_t>(map_bytes_)) < 0) {
      int err = errno;
      ::shm_unlink(cfg.name.c_str());
      throw CommError(fmt::format("ftruncate of host segment {} to {} bytes: {}", cfg.name, map_bytes_,
                                  detail::errno_string(err)));
    }
  } else {
    (void)store.get(ready_key, cfg.timeout);
    fd.fd = ::shm_open(cfg.name.c_str(), O_RDWR, 0600);
    TORUS_CHECK_SYS(fd.fd, "shm_open({}) of the host segment made by local rank 0", cfg.name);
    struct stat st {};
    TORUS_CHECK_SYS(::fstat(fd.fd, &st), "fstat({})", cfg.name);
    TORUS_CHECK(static_cast<size_t>(st.st_size) == map_bytes_, CommError,
                "host segment {} has {} bytes, expected {}: ranks disagree on its shape", cfg.name, st.st_size,
                map_bytes_);
  }
  void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    if (local_rank_ == 0) ::shm_unlink(cfg.name.c_str());
    throw CommError(fmt::format("mmap of host segment {} ({} bytes): {}", cfg.name, map_bytes_,
                                detail::errno_string(err)));
  }
  base_ = static_cast<char*>(p);
  // Unmaps (and, on local rank 0, unlinks) unless the constructor succeeds.
  struct Guard {
    HostSegment* self;
    const std::string* name;
    bool leader;
    ~Guard() {
      if (self == nullptr) return;
      if (leader) ::shm_unlink(name->c_str());
      ::munmap(self->base_, self->map_bytes_);
      self->base_ = nullptr;
    }
  } guard{this, &cfg.name, local_rank_ == 0};
  Header* h = header();
  if (local_rank_ == 0) {
    new (h) Header{};
    h->magic = kMagic;
    h->local_size = static_cast<uint32_t>(local_size_);
    h->depth = static_cast<uint32_t>(depth_);
    h->stripe = stripe_;
    h->eager_bytes = cfg.eager_bytes;
    h->zero_copy_bytes = cfg.zero_copy_bytes;
    for (int i = 0; i < local_size_; ++i) new (&control(i)) SegmentControl{};
    store.set(ready_key, std::vector<uint8_t>{'1'});
  } else {
    TORUS_CHECK(h->magic == kMagic && h->local_size == L && h->depth == D && h->stripe == stripe_, CommError,
                "host segment {} does not match this rank's configuration", cfg.name);
    if (h->eager_bytes != cfg.eager_bytes || h->zero_copy_bytes != cfg.zero_copy_bytes) {
      // The abort word tells local rank 0, which waits for everyone to attach.
      const std::string msg = fmt::format(
          "TORUS_OFI_SHM_EAGER_BYTES / TORUS_OFI_SHM_ZERO_COPY_BYTES are {} / {} on world rank {} but {} / {} on "
          "local rank 0 of host segment {}; they must be the same on every rank",
          cfg.eager_bytes, cfg.zero_copy_bytes, cfg.world_rank, h->eager_bytes, h->zero_copy_bytes, cfg.name);
      mark_aborted(cfg.world_rank, msg);
      h->setup_failed.store(1, std::memory_order_release);
      throw InvalidArgument(msg);
    }
  }
  // Touch this rank's own staging pages now rather than inside the first op.
  std::memset(base_ + staging_offset_ + static_cast<size_t>(local_rank_) * staging_bytes_, 0, staging_bytes_);
  control(local_rank_).pid = static_cast<int32_t>(::getpid());
  control(local_rank_).world_rank = cfg.world_rank;
  h->attached.fetch_add(1, std::memory_order_acq_rel);

  if (local_rank_ == 0) {
    auto deadline = std::chrono::steady_clock::now() + cfg.timeout;
    while (h->attached.load(std::memory_order_acquire) < L) {
      if (h->setup_failed.load(std::memory_order_acquire) != 0) {
        throw InvalidArgument(fmt::format("host segment {}: {}", cfg.name, aborted()));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        uint32_t attached = h->attached.load();
        throw TimeoutError(fmt::format("host segment {}: only {} of {} local ranks attached within {} ms", cfg.name,
                                       attached, L, cfg.timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ::shm_unlink(cfg.name.c_str());
  }
  guard.self = nullptr;
  TORUS_LOG_DEBUG("ofi: host segment {} ready: {} local ranks, {} KiB stripes, depth {}, {} MiB", cfg.name,
                  local_size_, stripe_ >> 10, depth_, map_bytes_ >> 20);
}

HostSegment::~HostSegment() {
  if (base_ != nullptr) ::munmap(base_, map_bytes_);
}

HostSegment::Header* HostSegment::header() const { return reinterpret_cast<Header*>(base_); }

SegmentControl& HostSegment::control(int local_rank) const {
  return reinterpret_cast<SegmentControl*>(base_ + control_offset_)[local_rank];
}

char* HostSegment::in_slot(int local_rank, uint64_t round) const {
  return base_ + staging_offset_ + static_cast<size_t>(local_rank) * staging_bytes_ +
         (round % static_cast<uint64_t>(depth_)) * static_cast<size_t>(local_size_) * stripe_;
}

char* HostSegment::out_slot(int local_rank, uint64_t round) const {
  return base_ + staging_offset_ + static_cast<size_t>(local_rank) * staging_bytes_ +
         static_cast<size_t>(depth_) * static_cast<size_t>(local_size_) * stripe_ +
         (round % static_cast<uint64_t>(depth_)) * stripe_;
}

void HostSegment::mark_aborted(int world_rank, const std::string& reason) {
  Header* h = header();
  uint32_t expected = 0;
  if (!h->aborted.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  h->aborted_by = world_rank;
  std::snprintf(h->reason, sizeof(h->reason), "%s", reason.c_str());
  h->reason_ready.store(1, std::memory_order_release);
}

bool HostSegment::is_aborted() const { return header()->aborted.load(std::memory_order_acquire) != 0; }

std::string HostSegment::aborted() const {
  Header* h = header();
  if (h->aborted.load(std::memory_order_acquire) == 0) return {};
  // The reason is written right after the flag; wait for it briefly.
  for (int i = 0; i < 100000 && h->reason_ready.load(std::memory_order_acquire) == 0; ++i) {
    __builtin_ia32_pause();
  }
  if (h->reason_ready.load(std::memory_order_acquire) == 0) return "another local rank aborted the group";
  return fmt::format("world rank {}: {}", h->aborted_by, std::string(h->reason, strnlen(h->reason, sizeof(h->reason))));
}

int HostSegment::find_dead_member() const {
  for (int i = 0; i < local_size_; ++i) {
    if (i == local_rank_) continue;
    pid_t pid = control(i).pid;
    if (process_dying(pid)) return control(i).world_rank;
  }
  return -1;
}

}  // namespace torus::comm::ofi
