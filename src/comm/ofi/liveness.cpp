// Same-host peer liveness (liveness.h).
#include "comm/ofi/liveness.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace torus::comm::ofi {
namespace {

constexpr unsigned long kPfExiting = 0x4;  // PF_EXITING in /proc/<pid>/stat's flags
constexpr size_t kMarkPageBytes = 4096;  // then one page for the inbox word

struct MarkPage {
  pthread_mutex_t mu;
};
static_assert(sizeof(MarkPage) <= kMarkPageBytes);

// The futex word of a robust mutex: the owner's tid, FUTEX_OWNER_DIED once
// the owner died holding it (kernel ABI; glibc keeps it in __data.__lock).
const int* futex_word(const MarkPage* p) {
#ifdef __GLIBC__
  return &p->mu.__data.__lock;
#else
  (void)p;
  return nullptr;
#endif
}

bool gone_by_kill(pid_t pid) { return ::kill(pid, 0) < 0 && errno == ESRCH; }

// /proc/<pid>/stat says the process is a zombie, dead, or exiting. False when
// it cannot be read (gone_by_kill / the pidfd tell those cases apart).
bool stat_says_dying(pid_t pid) {
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // "pid (comm) S ppid pgrp session tty_nr tpgid flags ..."; comm may hold
  // spaces and parentheses, so parse from the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  char state = p[2];
  if (state == 'Z' || state == 'X' || state == 'x') return true;
  p += 3;
  for (int field = 4; field <= 8; ++field) {  // skip ppid .. tpgid
    p = std::strchr(p + 1, ' ');
    if (p == nullptr) return false;
  }
  unsigned long flags = std::strtoul(p + 1, nullptr, 10);
  return (flags & kPfExiting) != 0;
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return static_cast<int>(fd);
  }
#else
  (void)pid;
#endif
  return -1;
}

// Maps a peer's mark page read-only and its inbox page writable; false when
// it cannot.
bool map_peer_mark(pid_t pid, int fd, const void** mark, int** inbox) {
#ifndef __GLIBC__
  (void)pid;
  (void)fd;
  (void)mark;
  (void)inbox;
  return false;
#else
  if (pid <= 0 || fd < 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", static_cast<int>(pid), fd);
  int mine = ::open(path, O_RDWR | O_CLOEXEC);
  if (mine < 0) return false;
  struct stat st {};
  void* m = MAP_FAILED;
  void* in = MAP_FAILED;
  if (::fstat(mine, &st) == 0 && static_cast<size_t>(st.st_size) == 2 * kMarkPageBytes) {
    m = ::mmap(nullptr, kMarkPageBytes, PROT_READ, MAP_SHARED, mine, 0);
    in = ::mmap(nullptr, kMarkPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, mine, kMarkPageBytes);
  }
  ::close(mine);
  if (m == MAP_FAILED || in == MAP_FAILED) {
    if (m != MAP_FAILED) ::munmap(m, kMarkPageBytes);
    if (in != MAP_FAILED) ::munmap(in, kMarkPageBytes);
    return false;
  }
  *mark = m;
  *inbox = static_cast<int*>(in);
  return true;
#endif
}

}  // namespace

// --- ProviderMark --------------------------------------------------------------------

ProviderMark::ProviderMark() {
  void* p = MAP_FAILED;
  int fd = ::memfd_create("torus-ofi-provider-mark", MFD_CLOEXEC);
  if (fd >= 0 && ::ftruncate(fd, 2 * kMarkPageBytes) == 0) {
    p = ::mmap(nullptr, 2 * kMarkPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    if (fd >= 0) ::close(fd);
    fd = -1;
    p = ::mmap(nullptr, 2 * kMarkPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
  }
  pages_ = p;
  inbox_ = reinterpret_cast<int*>(static_cast<char*>(p) + kMarkPageBytes);
  fd_ = fd;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, fd_ >= 0 ? PTHREAD_PROCESS_SHARED : PTHREAD_PROCESS_PRIVATE);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&static_cast<MarkPage*>(pages_)->mu, &a);
  pthread_mutexattr_destroy(&a);
}

ProviderMark::~ProviderMark() {
  pthread_mutex_destroy(&static_cast<MarkPage*>(pages_)->mu);
  ::munmap(pages_, 2 * kMarkPageBytes);
  if (fd_ >= 0) ::close(fd_);
}

void ProviderMark::enter() {
  if (depth_++ > 0) return;
  // EOWNERDEAD: a thread of this process died inside the provider, which
  // only happens while the whole process dies.
  if (pthread_mutex_lock(&static_cast<MarkPage*>(pages_)->mu) == EOWNERDEAD) {
    pthread_mutex_consistent(&static_cast<MarkPage*>(pages_)->mu);
  }
}

void ProviderMark::leave() {
  if (--depth_ > 0) return;
  pthread_mutex_unlock(&static_cast<MarkPage*>(pages_)->mu);
}

// --- PeerProcess ---------------------------------------------------------------------

PeerProcess::PeerProcess(pid_t pid, int mark_fd) : pid_(pid) {
  if (pid_ > 0) {
    pidfd_ = open_pidfd(pid_);
    if (!map_peer_mark(pid_, mark_fd, &mark_, &inbox_)) {
      mark_ = nullptr;
      inbox_ = nullptr;
    }
  }
}

PeerProcess::~PeerProcess() {
  if (pidfd_ >= 0) ::close(pidfd_);
  if (mark_ != nullptr) ::munmap(const_cast<void*>(mark_), kMarkPageBytes);
  if (inbox_ != nullptr) ::munmap(inbox_, kMarkPageBytes);
}

PeerProcess::PeerProcess(PeerProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, 0)),
      pidfd_(std::exchange(o.pidfd_, -1)),
      mark_(std::exchange(o.mark_, nullptr)),
      inbox_(std::exchange(o.inbox_, nullptr)) {}

PeerProcess& PeerProcess::operator=(PeerProcess&& o) noexcept {
  if (this != &o) {
    if (pidfd_ >= 0) ::close(pidfd_);
    if (mark_ != nullptr) ::munmap(const_cast<void*>(mark_), kMarkPageBytes);
    if (inbox_ != nullptr) ::munmap(inbox_, kMarkPageBytes);
    pid_ = std::exchange(o.pid_, 0);
    pidfd_ = std::exchange(o.pidfd_, -1);
    mark_ = std::exchange(o.mark_, nullptr);
    inbox_ = std::exchange(o.inbox_, nullptr);
  }
  return *this;
}

PeerProcess::State PeerProcess::provider_state() const {
  if (mark_ == nullptr) return State::kUnknown;
  const int* w = futex_word(static_cast<const MarkPage*>(mark_));
  if (w == nullptr) return State::kUnknown;
  const int v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
  if ((v & FUTEX_OWNER_DIED) != 0) return State::kDiedInside;
  return (v & FUTEX_TID_MASK) != 0 ? State::kInside : State::kOutside;
}

bool PeerProcess::exited() const {
  if (pid_ <= 0) return false;
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    int n = ::poll(&p, 1, 0);
    if (n > 0) return (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    if (n == 0) return false;
  }
  return gone_by_kill(pid_);
}

bool PeerProcess::dying() const {
  if (pid_ <= 0) return false;
  if (provider_state() == State::kDiedInside || exited()) return true;
  // Not terminated, so the pid still names the peer: /proc is about it.
  return stat_says_dying(pid_);
}

bool process_dying(pid_t pid) { return pid > 0 && (gone_by_kill(pid) || stat_says_dying(pid)); }

}  // namespace torus::comm::ofi
