// Private: is a same-host peer process still there, and is it safe to send
// to it?
//
// Note [Dead local peers]: the shm provider of libfabric 1.17 takes a spin
// lock inside the *receiver's* shared region on every send (fi_send, fi_tsend,
// RMA), and every process holds the lock of its own region while it
// progresses (copying incoming messages with process_vm_readv included). A
// process killed in the middle of that leaves its lock held forever, and any
// later send to it spins forever inside the provider, on whatever thread
// posted it: the waiter that drives, the engine thread, or teardown flushing
// an abort notice. (Later libfabric releases replaced the locked command
// queue with a lock-free one.) Knowing that the peer is dead does not help
// in time: a killed process is visible as such only once one of its threads
// has been scheduled again to die, often milliseconds later under load,
// while the other ranks keep sending to it in the meantime.
//
// What helps is knowing whether the peer is *inside the provider* right now:
// a process holds provider locks only during provider calls. With such a
// provider (guards_local_peers(), engine.h), every provider call of an
// engine is made under its ProviderMark: a robust, process-shared
// mutex in a page of its own (a memfd) that same-host peers map read-only
// (through /proc/<pid>/fd). A peer reads it with one load:
//  * free: no thread of the process is inside the provider, so it holds no
//    provider lock: sending is safe.
//  * held: it is inside the provider, perhaps holding its region lock.
//  * owner died (FUTEX_OWNER_DIED, set by the kernel as the thread that held
//    it exits): the process died inside the provider; nothing is sent to it
//    again.
// Each rank also has an inbox word (the second page of its mark, mapped
// writable by its peers): the number of senders in a send to it. A rank
// enters its own progress or posts a receive only while its inbox reads
// zero. A sender (Engine::gate, Engine::try_post) waits for the receiver's
// inbox to read zero (another sender could be holding, or have died
// holding, the receiver's lock), counts itself in, then waits for the
// receiver's mark to be free (the receiver does not enter again meanwhile;
// a live one leaves within a few hundred nanoseconds), sends, and counts
// itself out. Waits are short spins; past them the send is deferred like
// one the provider's queue cannot take yet. The mirror case, a peer killed
// inside a send *to this rank*, leaves this rank's own region lock held:
// its count stays in the inbox, and this rank declares its endpoint wedged
// (Engine, Note [Wedged endpoint]) instead of spinning in its next poll.
//
// The checks leave a window of nanoseconds (between reading a word and the
// provider taking the lock) instead of "forever after the death".
//
// A PeerProcess watches one same-host peer:
//  * provider_state(): the above (kUnknown when the page could not be
//    mapped: another user, no memfd, not glibc).
//  * exited(): one poll(2) on a pidfd: the process has terminated (zombie or
//    reaped). Pid reuse cannot fool it. Without pidfds (kernel < 5.3, or a
//    sandbox that refuses them), kill(pid, 0) == ESRCH.
//  * dying(): thorough (also reads /proc/<pid>/stat): it died in the
//    provider, it exited, or it is being torn down (PF_EXITING: killed,
//    exiting, or its main thread has exited). For cold paths: failure
//    handling, abort notices, the periodic liveness check.
// All are thread safe.
#pragma once

#include <sys/types.h>

namespace torus::comm::ofi {

// Held by the thread that is inside a provider call (see above), and this
// rank's inbox word. Provider calls are serialized by the engine, so the
// mark is never contended; enter()/leave() nest.
class ProviderMark {
 public:
  ProviderMark();  // falls back to private pages (nothing to share) without memfd
  ~ProviderMark();
  ProviderMark(const ProviderMark&) = delete;
  ProviderMark& operator=(const ProviderMark&) = delete;

  void enter();
  void leave();
  // Same-host senders inside a send to this rank (see above).
  int inbox() const { return __atomic_load_n(inbox_, __ATOMIC_SEQ_CST); }
  // The memfd peers open as /proc/<pid>/fd/<shared_fd()>; -1 when private.
  int shared_fd() const { return fd_; }

 private:
  void* pages_ = nullptr;
  int* inbox_ = nullptr;
  int fd_ = -1;
  int depth_ = 0;
};

// RAII enter/leave; a null mark does nothing.
class InProvider {
 public:
  explicit InProvider(ProviderMark* m) : m_(m) {
    if (m_ != nullptr) m_->enter();
  }
  ~InProvider() {
    if (m_ != nullptr) m_->leave();
  }
  InProvider(const InProvider&) = delete;
  InProvider& operator=(const InProvider&) = delete;

 private:
  ProviderMark* m_;
};

class PeerProcess {
 public:
  enum class State { kUnknown, kOutside, kInside, kDiedInside };

  PeerProcess() = default;
  // `mark_fd`: the peer's ProviderMark::shared_fd(), -1 when unknown.
  PeerProcess(pid_t pid, int mark_fd);
  ~PeerProcess();
  PeerProcess(PeerProcess&& o) noexcept;
  PeerProcess& operator=(PeerProcess&& o) noexcept;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool watched() const { return pid_ > 0; }
  State provider_state() const;
  bool exited() const;
  bool dying() const;
  // The peer's inbox word (see above), or null.
  int* inbox() const { return inbox_; }

 private:
  pid_t pid_ = 0;
  int pidfd_ = -1;
  const void* mark_ = nullptr;  // the peer's mark page, read-only
  int* inbox_ = nullptr;        // the peer's inbox page, writable
};

// Counts this thread in a peer's inbox while it is inside a send to it
// (nothing with a null word).
class InInbox {
 public:
  explicit InInbox(int* word) : w_(word) {
    if (w_ != nullptr) __atomic_fetch_add(w_, 1, __ATOMIC_SEQ_CST);
  }
  ~InInbox() {
    if (w_ != nullptr) __atomic_fetch_sub(w_, 1, __ATOMIC_SEQ_CST);
  }
  InInbox(const InInbox&) = delete;
  InInbox& operator=(const InInbox&) = delete;

 private:
  int* w_;
};

// A pid of this host: terminated, or being torn down (see dying()). For code
// that only has a pid (the host segment's members).
bool process_dying(pid_t pid);

}  // namespace torus::comm::ofi
