// Private: the process-wide Open MPI runtime — one progress thread that owns
// every MPI call of the process — and the records it works on.
//
// Threads. MpiRuntime starts one progress thread (the "engine"). It calls
// MPI_Init_thread(MPI_THREAD_FUNNELED), so it is MPI's main thread, and from
// then on it is the only thread that calls MPI (MPI_Initialized/Finalized
// aside). Other threads hand it work through submit() and post(), which never
// block on MPI or on peers. An MpiOp starts a non-blocking MPI call on the
// engine; the engine polls its request with MPI_Test (spinning briefly, then
// yielding, then sleeping up to kMaxIdleSleep between polls; it blocks on a
// condition variable while nothing is in flight) and completes the op's Work.
//
// Note [Deadlines] (work.h) on MPI. Each MpiOp has a deadline. Past it, the
// engine fails the Work with TimeoutError (the op's description, the world
// rank, the peers that may be missing), marks the op's communicator broken
// and fails its other in-flight ops with CommError; ops queued on it but not
// yet started fail the same way without reaching MPI (so their peers wait for
// their own deadlines). A timed-out receive is MPI_Cancel'ed. Other requests
// cannot be cancelled (MPI forbids cancelling collectives): see Note
// [Abandoned requests].
//
// Note [Abandoned requests]. An op failed (timeout, abort, shutdown) while its
// MPI request is pending keeps the request in an abandoned list; MPI may still
// write its buffers if a late peer shows up. The engine therefore keeps the
// op's staging buffers and the Work's keep-alive objects (the tensors that
// ProcessGroup attached) until the request completes, and keeps polling it
// (every few ms). A communicator with pending requests is never freed (MPI
// would free it under a live request); it is left to MPI_Finalize. Raw
// buffers passed straight to a Backend are the caller's: after a timeout they
// must stay valid until the process exits, or be known never to be written.
// Peers that freed their side of such a communicator may later reuse its
// context id for a new one that excludes the ranks still holding it; a late
// message of the abandoned op could then be misdelivered. After a timeout the
// safe course is to tear the job down (the watchdog's abort), not to go on
// creating groups.
//
// Lifetime. acquire() returns the running runtime or starts one; the last
// shared_ptr going away stops the engine: ops still in flight fail with
// CommError (and are abandoned), then, if Torus initialised MPI, the engine
// shuts MPI down as Note [Finalize after a failure] says. Open MPI 4.1
// finalizes with abandoned requests pending (checked: timed-out Iallreduce
// and rendezvous Isend, 2–4 ranks, vader and tcp). MPI cannot be
// initialised twice per process: once Torus has shut MPI down, acquire()
// throws CommError — hold one runtime (a backend, or mpi_runtime_hold() in
// mpi_bootstrap.h) for the whole job. If the application initialised MPI
// itself, Torus needs MPI_THREAD_MULTIPLE (it calls MPI from its own thread)
// and never finalizes.
//
// Note [Finalize after a failure]. MPI_Finalize is collective: Open MPI's
// waits in a PMIx fence for every rank of the job. With a rank stuck it
// waits for ever, and with a rank dead it sometimes does too (Open MPI 4.1.4
// under `mpirun --mca orte_enable_recovery 1`: the survivors of a SIGKILLed
// rank stayed in ompi_mpi_finalize for as long as we waited, 90 s, in 2 of
// about 35 runs of 6 ranks; a plain C program — MPI_Init, one rank kills
// itself, the others call MPI_Finalize — in 1 of 80 runs). So the last
// release first meets the other ranks in an MPI_Ibarrier on MPI_COMM_WORLD,
// polled for at most kShutdownMeetTimeout (10 s; mpi_runtime.cpp), then:
//  * every rank arrived: all are alive and about to finalize, so
//    MPI_Finalize runs (and returns at once);
//  * a rank is missing and this process saw a failure — an op timed out, an
//    MPI call failed, a group was aborted or broke, ops were still in flight
//    at shutdown or requests were abandoned — or mpirun keeps survivors of a
//    dead rank running (orte_enable_recovery, read through MPI_T): the
//    runtime does not call MPI_Finalize, and logs a warning saying why. MPI
//    stays initialised until the process exits (the buffers of abandoned
//    requests are kept until then); mpirun reports an abnormal termination
//    and, without recovery, ends the other ranks (a failed job ends either
//    way). The exit status of the process stays the application's; Torus
//    never exits it.
//  * a rank is missing, no failure was seen and mpirun would end the job if
//    a rank died: the missing rank is late, not dead, and MPI_Finalize waits
//    for it as MPI always does.
// A failed process thus leaves within the meet timeout of its last release;
// a healthy job whose ranks finish within it of one another finalizes
// normally.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "torus/comm/backend.h"
#include "torus/comm/work.h"

namespace torus::comm::mpi {

using Clock = std::chrono::steady_clock;

// A Work whose keep-alive objects the engine can take over when it abandons a
// request (Note [Abandoned requests]).
class MpiWork final : public Work {
 public:
  using Work::Work;
  std::vector<std::shared_ptr<void>> take_keep_alive();
};

// One MPI communicator and its health, shared by its backend and its ops.
// handle() and the engine-only fields are used on the engine thread only; the
// broken state is thread safe.
class MpiComm {
 public:
  MpiComm(MPI_Comm handle, GroupInfo group, bool owned) : handle_(handle), group_(std::move(group)), owned_(owned) {}
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm handle() const { return handle_; }
  const GroupInfo& group() const { return group_; }
  bool owned() const { return owned_; }  // freed by Torus (not MPI_COMM_WORLD)

  bool broken() const { return broken_.load(std::memory_order_acquire); }
  std::string broken_reason() const;
  // Marks the communicator broken; the first reason is kept. Returns whether
  // this call broke it.
  bool mark_broken(const std::string& reason);

  // --- engine thread only ---
  int pending = 0;                 // requests in flight or abandoned on it
  bool release_requested = false;  // its backend is gone: free once pending == 0
  void free_handle();              // MPI_Comm_free if owned

 private:
  MPI_Comm handle_;
  GroupInfo group_;
  bool owned_;
  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;
  std::string reason_;
};

// One asynchronous MPI operation. Built by a backend on the caller's thread,
// then owned by the engine. `start` and `finish` run on the engine thread and
// must not capture the MpiRuntime (the engine must never hold the last
// reference to it).
struct MpiOp {
  std::shared_ptr<MpiWork> work;
  std::shared_ptr<MpiComm> comm;
  // For messages, built only when needed: empty `label` means
  // work->info().describe(); empty `missing_hint` means one derived from the
  // op kind, its group and `tag` (send/recv).
  std::string label;
  std::string missing_hint;
  int tag = -1;
  std::chrono::milliseconds timeout{0};
  Clock::time_point deadline;
  // Starts the MPI call, storing its request (MPI_REQUEST_NULL: done at once);
  // returns the MPI error code.
  std::function<int(MPI_Request*)> start;
  // Optional: runs once the request completed successfully, before the Work
  // completes (unstaging, kAvg division, count checks). May throw: the Work
  // then fails with that exception.
  std::function<void(const MPI_Status&)> finish;
  bool cancellable = false;  // receives: withdrawn (MPI_Cancel) when failed or timed out

  // --- engine state ---
  MPI_Request request = MPI_REQUEST_NULL;
  bool done = false;
};

class MpiRuntime {
 public:
  // The process's runtime, started on first use (MPI_Init_thread on the new
  // engine thread; blocks until MPI is up). Thread safe. Throws CommError if
  // MPI cannot be initialised, or was already finalized by Torus;
  // Unsupported if the application initialised MPI below
  // MPI_THREAD_MULTIPLE.
  static std::shared_ptr<MpiRuntime> acquire();

  // Stops the engine (see Lifetime above). Blocks for the shutdown meeting
  // of the ranks (at most 10 s) and MPI_Finalize (Note [Finalize after a
  // failure]).
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const;
  int world_size() const;
  int tag_ub() const;  // the largest tag MPI accepts (MPI_TAG_UB)

  // Queues `op` for the engine (FIFO with post()); its deadline must be set.
  // Never blocks on MPI. Thread safe.
  void submit(std::shared_ptr<MpiOp> op);

  // Runs one MPI op on `comm` and waits for it: `start` and `finish` as in
  // MpiOp, deadline now + timeout, `label` names it in errors. For setup
  // steps outside a backend's sequence (communicator creation, bootstrap).
  // Blocks; throws TimeoutError/CommError (the op's error). Not callable on
  // the engine thread (InvalidArgument: it would wait on itself).
  void run_blocking(std::shared_ptr<MpiComm> comm, std::string label, std::chrono::milliseconds timeout,
                    std::function<int(MPI_Request*)> start, std::function<void(const MPI_Status&)> finish = {});

  // Runs `task` on the engine thread, in FIFO order with submit(). A task
  // that throws is logged. Never blocks on MPI. Thread safe.
  void post(std::function<void()> task);

  // Fails the in-flight ops of `comm` with CommError(reason), abandoning
  // their requests. Asynchronous (posted). Thread safe.
  void fail_comm_ops(std::shared_ptr<MpiComm> comm, std::string reason);

  // The backend of `comm` is gone: free the communicator once nothing is
  // pending on it. Asynchronous (posted). Thread safe.
  void release_comm(std::shared_ptr<MpiComm> comm);

  bool on_engine_thread() const;

 private:
  struct Engine;
  MpiRuntime();
  std::shared_ptr<Engine> engine_;
  std::thread thread_;
};

}  // namespace torus::comm::mpi
