// Private: the progress engine of one ofi world — the thing that makes
// operations move. What an op is, and what its coroutine sees of it (OpCtx):
// op.h.
//
// One Engine owns the world's Fabric (endpoint + CQ) and runs every op of
// every group of that world (the world and all its splits share it). Ops are
// coroutines (task.h); the engine resumes them when what they wait for is
// there.
//
// Note [Who drives]: "driving" = polling the CQ and resuming ready ops, under
// the driver lock. A thread blocked in Work::wait() drives itself (lowest
// latency, no hand-off); the engine's own thread drives only while nobody
// waits, so ops also progress when the caller never waits (overlap). While
// ops exist and nobody waits, the engine thread polls (backing off to short
// sleeps when nothing moves); with no ops for a while it sleeps until the
// next submit. Work completion callbacks run after the driver lock is
// released, so a callback may issue or wait on other ops.
//
// Note [Op order]: per group, collectives run one at a time in issue order
// (a FIFO); point-to-point ops start (post) in issue order as soon as they
// are submitted and run concurrently with everything else, so a rank may
// post a recv, then enter a collective, without deadlocking a peer that does
// the reverse. Different groups progress independently.
//
// Note [Failure]: an op fails when it passes its deadline (TimeoutError
// naming what it waited for: peers, requests, segment rounds), when a
// completion reports an error or a same-host peer process is gone
// (CommError naming the peer), or when the group is aborted. The failing
// rank marks its group broken — later and queued ops fail at once with
// CommError — and tells the group's other ranks with a best-effort control
// message (FI_MSG), so they fail promptly too instead of waiting for their
// own deadlines. Only hard failures are announced: a deadline is each rank's
// own (every rank reports its own TimeoutError), and abort() is local.
// Pending requests of a failed op are cancelled; their completions are
// swallowed when they arrive.
//
// Note [Never send to the dead]: a send to a same-host peer is handed to the
// provider only while no thread of that peer is inside the provider and no
// other sender is in a send to it (the inbox handshake of liveness.h, Note
// [Dead local peers]: with shm, a send whose receiver's lock is held by a
// process that died inside the provider spins forever); meanwhile it waits
// in the engine's queue of unposted requests, as when the provider is full. A send to a peer
// known to be gone fails at once with CommError naming the peer. Known gone:
// it died inside the provider (its mark says so), its process terminated
// (without a mark to read), a failure or the periodic liveness check found
// it dying, or an abort notice said so. Abort notices skip gone peers and
// the peer whose link just failed.
//
// Note [Wedged endpoint]: progress and receive posts wait while a same-host
// sender is inside a send to this rank (its inbox count, liveness.h). When
// the count stays up for kInboxWedgeAfter and a same-host peer is gone, that
// peer died inside the send, holding this rank's region lock: the endpoint
// is wedged for good. Every group of the world breaks (CommError naming the
// peer; peers are told), nothing polls the CQ again, and teardown closes
// nothing (Note [Teardown after a hard failure]).
//
// Note [Teardown after a hard failure]: once a peer died or a group broke
// with a hard failure (this rank's or a peer's abort notice), teardown
// leaves the endpoint, CQ, AV, domain and fabric open, and keeps the memory
// pending transfers point at (scratch, registered regions, control
// buffers), instead of closing them: libfabric's rxm over tcp intermittently
// crashed inside fi_close of the CQ with transfers to a dead peer still
// queued (about 1 in 30 teardowns on a loaded host). The process exits
// soon after such a failure, and the OS reclaims the sockets and memory; a
// process that builds a new world after one pays one endpoint's memory.
// Teardown after clean runs and after timeouts (the peers live) closes
// everything in order: endpoint and CQ first, then the memory, then the
// domain.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/ofi/fabric.h"
#include "comm/ofi/liveness.h"
#include "comm/ofi/op.h"
#include "torus/comm/work.h"

namespace torus::comm::ofi {

// The part of a group the engine knows: its op queue and whether it is
// broken. Shared by the backend and its queued ops.
struct GroupState {
  uint32_t context = 0;
  std::string name;
  int rank = 0;
  std::vector<fi_addr_t> member_addr;  // by group rank, for control messages
  std::vector<int> member_world;       // world rank by group rank

  // Called once when this rank announces a hard failure of the group to its
  // peers (e.g. to flag the host segment). Driver thread.
  std::function<void(const std::string&)> on_announce;

  // Marks the group broken; the first reason wins. Returns true the first time.
  bool set_broken(const std::string& reason);
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  std::string broken_reason() const;

  // Driver only.
  std::deque<std::unique_ptr<Op>> queue;

 private:
  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// A Work whose wait() drives the engine (Note [Who drives]).
class OfiWork final : public Work {
 public:
  OfiWork(WorkInfo info, std::weak_ptr<Engine> engine) : Work(std::move(info)), engine_(std::move(engine)) {}
  // A Work that completed before it was returned (an op run in the caller's
  // thread).
  struct Completed {};
  OfiWork(WorkInfo info, Completed) : Work(std::move(info)) { complete_unshared(); }
  // Completes a Work nobody else holds yet (no callbacks, nothing kept
  // alive, no waiters), without the locking of mark_completed().
  void complete_unshared() {
    done_ = true;
    finished_.store(true, std::memory_order_release);
  }
  // The engine that wait() drives; set before the Work is shared.
  void set_engine(std::weak_ptr<Engine> engine) { engine_ = std::move(engine); }
  bool is_completed() const override { return finished_.load(std::memory_order_acquire); }
  // Once is_completed(), the outcome without taking the Work's lock.
  void rethrow_if_failed() const {
    if (error_) std::rethrow_exception(error_);
  }
  void wait() override;
  void wait(std::chrono::milliseconds timeout) override;

 private:
  friend class Engine;
  std::weak_ptr<Engine> engine_;
  std::atomic<bool> finished_{false};
};

inline constexpr std::chrono::milliseconds kInboxWedgeAfter{20};

// Whether `provider`'s sends to a same-host peer take a lock in that peer's
// shared memory (Note [Dead local peers]): shm, and efa (which hands
// same-host traffic to shm). Only then do ranks publish provider marks.
bool guards_local_peers(const std::string& provider);

struct EngineOptions {
  std::chrono::microseconds standby_poll{200};  // engine thread's nap while others drive
  // Then it sleeps until the next submit. Short: a rank that computes
  // between its collectives (a training step) shares its core with this
  // thread, and every standby nap is a context switch on that core. With
  // 50 ms here, the benchmark GPT's forward ran 4 ms slower under DDP than
  // without it, and the whole data-parallel step cost 7% of the no-sync
  // step; with 1 ms, about 2.5%. Ops issued back to back never let it sleep.
  std::chrono::milliseconds idle_to_sleep{1};
  // The host runs more ranks than cores: waits yield their core after a few
  // tries (spin.h) instead of spinning first.
  bool oversubscribed = false;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // `local_pids[w]` is the pid of world rank w when it runs on this host
  // (liveness checks), else 0; `mark_fds[w]` its published
  // ProviderMark::shared_fd() (-1 or empty: unknown). `mark` is this rank's
  // (published before; null: none, for providers whose sends cannot hang on
  // a dead peer: guards_local_peers()). Starts the engine thread.
  Engine(std::unique_ptr<Fabric> fabric, int world_rank, std::vector<pid_t> local_pids,
         std::vector<int> mark_fds = {}, std::unique_ptr<ProviderMark> mark = nullptr, EngineOptions options = {});
  ~Engine();  // fails every outstanding op with CommError and stops the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Fabric& fabric() { return *fabric_; }
  int world_rank() const { return world_rank_; }
  pid_t local_pid(int world) const;

  // Groups must be registered while they can receive control messages.
  void add_group(const std::shared_ptr<GroupState>& g);
  void remove_group(const GroupState* g);

  // Queues an op (Note [Op order]). Thread safe. The op's group must be
  // registered. Fails the op at once if the group is broken.
  void submit(std::unique_ptr<Op> op);

  // Breaks `g` (abort()): its running op fails at the next poll, queued ops
  // fail. With `announce`, peers get a control message too. Thread safe.
  void break_group(const std::shared_ptr<GroupState>& g, const std::string& reason, bool announce);

  // Note [Inline ops]: runs `op` (not submitted) in the calling thread,
  // outside the driver lock: makes and starts its coroutine and resumes it
  // whenever what it waits for is there, for at most `spin` (spin.h).
  // Returns true when it finished successfully: its Work is complete and
  // the op may be dropped. Otherwise (still waiting, or failed) submit() it
  // as it is; the engine resumes it where it stopped, or reports its
  // failure as for any op. Only for ops that touch nothing the driver owns
  // (host segment collectives: no requests, no pooled scratch), and only
  // while no other op of the group is queued or running.
  // `group` is the op's group (op.group may still be unset: the caller
  // sets it, and the op's other shared references, only if it hands the op
  // over).
  bool run_inline(Op& op, const GroupState& group, std::chrono::nanoseconds spin);
  const EngineOptions& options() const { return options_; }

  // Drives progress until `work` completes or `until` passes (Note [Who
  // drives]). Returns whether it completed.
  bool drive_until(const OfiWork& work, Clock::time_point until = Clock::time_point::max());

  // --- driver-side helpers used by OpCtx --------------------------------------
  Request* new_request();
  void release(Request* r);
  // Hands r (fields filled) to the provider, or queues it behind earlier
  // requests the provider could not take yet, keeping the posting order
  // per destination for sends and overall for receives (matching follows
  // posting order). A full queue towards one peer never holds up traffic to
  // the others. Never blocks.
  void post(Request* r);
  // Polls the CQ once; returns whether anything completed.
  bool drain_cq();
  // Whether world rank `world` runs on this host and is known to be gone
  // (Note [Never send to the dead]): a sticky verdict, else a check —
  // cheap (its mark says it died inside the provider; without a mark, its
  // process terminated) or, with `thorough`, also whether its process is
  // being torn down (liveness.h). A positive answer sticks. Thread safe.
  bool peer_gone(int world, bool thorough = false) const;
  // "world rank 3 (pid 1234) on this host has exited".
  std::string describe_gone(int world) const;
  std::unique_ptr<Scratch> lend_scratch(size_t bytes);
  void return_scratch(std::unique_ptr<Scratch> s);
  // Keeps memory that cancelled operations may still point at until the
  // endpoint is closed.
  void bury(std::vector<std::unique_ptr<Scratch>>& scratch, std::vector<MemoryRegion>& regs);

 private:
  struct Completion {
    std::shared_ptr<OfiWork> work;
    std::exception_ptr error;
  };
  bool poll_once(std::vector<Completion>& done);
  bool retry_posts();
  long try_post(Request* r);
  void absorb_incoming(std::vector<Completion>& done);
  void place(std::unique_ptr<Op> op, std::vector<Completion>& done);
  bool step(Op& op, std::vector<Completion>& done);
  void fail(Op& op, std::exception_ptr error, std::vector<Completion>& done);
  // fail(), or hold a provider error back a moment (Note [Held provider
  // errors] in engine_failure.cpp); returns whether the op finished.
  bool hold_or_fail(Op& op, std::exception_ptr error, std::vector<Completion>& done);
  void finish(Op& op, std::exception_ptr error, std::vector<Completion>& done);
  void check_deadlines(Clock::time_point now, std::vector<Completion>& done);
  bool check_liveness(Op& op, std::vector<Completion>& done);
  void complete(std::vector<Completion>& done);
  void handle_control(Request* r);
  void post_control_recvs();
  // Tells g's other ranks that it broke, except `skip` (a world rank whose
  // link just failed) and peers known to be gone.
  void announce(GroupState& g, const std::string& reason, int skip = -1);
  // Fails a send that must not reach the provider (its peer is gone).
  void refuse(Request* r);
  // Whether the provider may take request `r` now: a send kPost, kDefer
  // (another sender is in a send to its same-host peer; try_post() may
  // still defer it while the peer is inside the provider) or kRefuse (its
  // peer is gone; Note [Never send to the dead]); a receive kDefer while
  // this rank's inbox is busy (own_region_free()).
  enum class Gate { kPost, kDefer, kRefuse };
  Gate gate(const Request* r);
  // Whether this rank may enter a provider call that takes its own region
  // lock (progress, receive posts); may wedge the endpoint (Note [Wedged
  // endpoint]).
  bool own_region_free();
  void wedge(int world);
  void repost_control(size_t i);
  void thread_main();

  std::unique_ptr<Fabric> fabric_;
  int world_rank_;
  std::vector<pid_t> local_pids_;
  std::vector<PeerProcess> peers_;                 // by world rank; unwatched when not on this host
  std::unique_ptr<std::atomic<bool>[]> gone_;      // by world rank: known gone (sticky)
  EngineOptions options_;

  std::unique_ptr<ProviderMark> mark_;  // held by the fabric inside provider calls; may be null
  std::atomic<bool> wedged_{false};     // Note [Wedged endpoint]
  bool hard_failure_ = false;           // Note [Teardown after a hard failure]; driver thread
  Clock::time_point inbox_busy_since_{}, next_wedge_scan_{};
  std::vector<size_t> control_reposts_;  // control receives to repost once the inbox is free

  // Driver state (driver_mu_).
  std::mutex driver_mu_;
  std::deque<Request> pool_;
  Request* free_ = nullptr;
  std::vector<std::shared_ptr<GroupState>> groups_;  // snapshot of registered groups
  std::vector<std::unique_ptr<Op>> p2p_;
  std::vector<std::vector<char>> control_bufs_;
  std::vector<Request*> control_reqs_;
  std::deque<std::vector<char>> notice_bufs_;
  std::vector<MemoryRegion> control_mrs_;
  std::vector<std::unique_ptr<Scratch>> scratch_pool_;
  std::vector<std::unique_ptr<Scratch>> graveyard_scratch_;
  std::vector<MemoryRegion> graveyard_regs_;
  uint64_t polls_ = 0;
  Clock::time_point next_deadline_check_{};

  // Shared state (state_mu_).
  std::mutex state_mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Op>> incoming_;
  std::vector<std::shared_ptr<GroupState>> registered_;
  std::vector<std::pair<std::shared_ptr<GroupState>, std::string>> notices_;  // breaks to announce
  bool groups_changed_ = false;
  bool stop_ = false;
  std::atomic<bool> deep_sleep_{false};
  int64_t posted_requests_ = 0;  // driver: requests posted and not completed
  // Driver: requests waiting for provider queue space, sends per destination.
  std::deque<Request*> unposted_recvs_;
  std::unordered_map<fi_addr_t, std::deque<Request*>> unposted_sends_;
  size_t unposted_ = 0;
  int control_sends_ = 0;          // driver: abort notices in flight
  std::atomic<bool> has_incoming_{false};
  std::atomic<int> waiters_{0};
  std::atomic<int64_t> outstanding_{0};  // ops submitted and not finished
  std::thread thread_;
};

}  // namespace torus::comm::ofi
