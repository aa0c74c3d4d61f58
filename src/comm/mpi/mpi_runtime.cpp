// The MPI progress engine: one thread per process that initialises MPI,
// starts and polls every MPI request, enforces deadlines and finalizes MPI.
// Contracts and notes in mpi_runtime.h.
#include "comm/mpi/mpi_runtime.h"

#include <condition_variable>
#include <deque>
#include <future>

#include "comm/mpi/mpi_check.h"
#include "core/log.h"

namespace torus::comm::mpi {

namespace {

// Idle policy of the engine while requests are in flight: poll back to back
// for kSpinPolls rounds, then yield (which leaves the core to any other
// runnable thread, so oversubscribed ranks still share the cores) for up to
// kYieldPolls rounds, then sleep with exponential backoff up to
// kMaxIdleSleep. Open MPI's non-blocking collectives advance one round of
// their schedule per MPI_Test, so sleeping early makes multi-round ops
// (segmented reduce, large all_reduce) crawl; the yield phase is long.
// Abandoned requests alone are polled every kAbandonedPoll.
constexpr int kSpinPolls = 32;
constexpr int kYieldPolls = 20000;
constexpr std::chrono::microseconds kMaxIdleSleep{200};
constexpr std::chrono::milliseconds kAbandonedPoll{10};

// How long the ranks wait for each other at shutdown before MPI_Finalize
// (Note [Finalize after a failure] in mpi_runtime.h).
constexpr std::chrono::seconds kShutdownMeetTimeout{10};

// The process-wide singleton: inherent to MPI, which exists once per process
// and can be initialised once.
struct Singleton {
  std::mutex mu;
  std::weak_ptr<MpiRuntime> instance;
  bool torus_initialised_mpi = false;
};
Singleton& singleton() {
  static Singleton s;
  return s;
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return fmt::format("thread level {}", level);
}

// Whether the launcher keeps the other ranks running when one dies: Open
// MPI's orte_enable_recovery (`mpirun --mca orte_enable_recovery 1`), read
// through the MPI tool interface. False where the MPI has no such variable.
bool open_mpi_recovery_enabled() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return false;
  bool on = false;
  int index = 0;
  if (MPI_T_cvar_get_index("orte_enable_recovery", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      // Open MPI writes one byte for a bool variable, four for an int: read
      // into zeroed storage large enough for either.
      uint64_t value = 0;
      if (count == 1 && MPI_T_cvar_read(handle, &value) == MPI_SUCCESS) on = value != 0;
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return on;
}

std::string rank_list(const std::vector<int>& ranks) {
  constexpr size_t kMaxListed = 16;
  if (ranks.size() <= kMaxListed) return fmt::format("[{}]", fmt::join(ranks, ", "));
  std::vector<int> head(ranks.begin(), ranks.begin() + kMaxListed);
  return fmt::format("[{}, ... {} more]", fmt::join(head, ", "), ranks.size() - kMaxListed);
}

std::string label_of(const MpiOp& op) {
  return op.label.empty() ? op.work->info().describe() : op.label;
}

// Which peers may be missing when `op` timed out.
std::string missing_hint_of(const MpiOp& op) {
  if (!op.missing_hint.empty()) return op.missing_hint;
  const WorkInfo& info = op.work->info();
  const GroupInfo& g = op.comm->group();
  auto world_rank_of = [&](int r) {
    return r >= 0 && static_cast<size_t>(r) < g.global_ranks.size() ? g.global_ranks[static_cast<size_t>(r)] : -1;
  };
  if (info.op == OpType::kSend || info.op == OpType::kRecv) {
    return fmt::format("Peer {} (world rank {}) has not {} with tag {}, or is stuck or gone.", info.peer,
                       world_rank_of(info.peer),
                       info.op == OpType::kSend ? "posted the matching recv" : "sent the matching message", op.tag);
  }
  std::vector<int> others, others_world;
  for (int r = 0; r < g.size; ++r) {
    if (r == g.rank) continue;
    others.push_back(r);
    others_world.push_back(world_rank_of(r));
  }
  return fmt::format(
      "MPI cannot tell which peers have not joined: any of group ranks {} (world ranks {}) may have skipped this "
      "op, issued a different op as seq {}, or be stuck or gone.",
      rank_list(others), rank_list(others_world), info.seq);
}

}  // namespace

// ---------------------------------------------------------------------------
// MpiWork, MpiComm

std::vector<std::shared_ptr<void>> MpiWork::take_keep_alive() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(keep_alive_);
}

std::string MpiComm::broken_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

bool MpiComm::mark_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.load(std::memory_order_relaxed)) return false;
  reason_ = reason;
  broken_.store(true, std::memory_order_release);
  return true;
}

void MpiComm::free_handle() {
  if (!owned_ || handle_ == MPI_COMM_NULL) return;
  int rc = MPI_Comm_free(&handle_);
  if (rc != MPI_SUCCESS) {
    TORUS_LOG_WARN("mpi: freeing the communicator of group '{}' failed: {}", group_.name, mpi_error_string(rc));
  }
  handle_ = MPI_COMM_NULL;
}

// ---------------------------------------------------------------------------
// The engine

struct MpiRuntime::Engine {
  // Set by init() before the runtime is handed out; read-only afterwards.
  int world_rank = 0;
  int world_size = 1;
  int tag_ub = 32767;  // the minimum the MPI standard guarantees
  bool owns_mpi = false;
  bool launcher_keeps_survivors = false;
  std::thread::id thread_id;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;  // guarded by mu
  bool stop = false;                        // guarded by mu

  // Engine thread only.
  struct Abandoned {
    std::shared_ptr<MpiOp> op;                // its request, closures, staging buffers
    std::vector<std::shared_ptr<void>> keep;  // the Work's keep-alive objects
  };
  std::vector<std::shared_ptr<MpiOp>> inflight;
  std::vector<Abandoned> abandoned;
  // The first failure of this process's MPI traffic (Note [Finalize after a
  // failure]); empty while there was none.
  std::string failure;

  void run(std::promise<void> started);
  void init();
  void loop();
  void shutdown();

  void start_op(const std::shared_ptr<MpiOp>& op);
  bool poll_inflight();
  void poll_abandoned();
  void complete(const std::shared_ptr<MpiOp>& op, const MPI_Status& status);
  void time_out(const std::shared_ptr<MpiOp>& op);
  void fail(const std::shared_ptr<MpiOp>& op, std::exception_ptr error);
  void fail_comm_ops(const MpiComm* comm, const std::string& reason);
  void retire(MpiComm& comm);
  void note_failure(const std::string& what);
  bool meet_peers_for_finalize();
  bool finalize_mpi();
};

void MpiRuntime::Engine::run(std::promise<void> started) {
  thread_id = std::this_thread::get_id();
  try {
    init();
  } catch (...) {
    started.set_exception(std::current_exception());
    return;
  }
  started.set_value();
  loop();
  shutdown();
}

void MpiRuntime::Engine::init() {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  TORUS_CHECK(!finalized, CommError,
              "mpi: MPI was already finalized in this process and cannot be initialised again; keep one mpi "
              "backend (or mpi_runtime_hold()) alive for the whole job");
  if (initialised) {
    int level = MPI_THREAD_SINGLE;
    TORUS_CHECK_MPI(MPI_Query_thread(&level));
    TORUS_CHECK(level == MPI_THREAD_MULTIPLE, Unsupported,
                "mpi: the application initialised MPI with {}; the Torus mpi backend calls MPI from its own "
                "progress thread and needs MPI_THREAD_MULTIPLE (or let Torus initialise MPI)",
                thread_level_name(level));
    owns_mpi = false;
  } else {
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    TORUS_CHECK(rc == MPI_SUCCESS, CommError, "mpi: MPI_Init_thread failed (error code {})", rc);
    owns_mpi = true;
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      throw CommError(
          fmt::format("mpi: MPI provides only {}; Torus needs MPI_THREAD_FUNNELED", thread_level_name(provided)));
    }
    TORUS_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    launcher_keeps_survivors = open_mpi_recovery_enabled();
  }
  TORUS_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  TORUS_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  int* ub = nullptr;
  int flag = 0;
  TORUS_CHECK_MPI(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag));
  if (flag && ub) tag_ub = *ub;
  TORUS_LOG_DEBUG("mpi: progress engine up (world rank {}/{}, {}, tag_ub {})", world_rank, world_size,
                  owns_mpi ? "MPI initialised by Torus" : "MPI initialised by the application", tag_ub);
}

void MpiRuntime::Engine::loop() {
  int idle = 0;
  auto last_abandoned_poll = Clock::now();
  for (;;) {
    std::deque<std::function<void()>> batch;
    {
      std::unique_lock<std::mutex> lock(mu);
      auto woken = [&] { return stop || !tasks.empty(); };
      if (!woken()) {
        if (inflight.empty() && abandoned.empty()) {
          cv.wait(lock, woken);
        } else if (inflight.empty()) {
          cv.wait_for(lock, kAbandonedPoll, woken);
        } else if (idle > kYieldPolls) {
          auto sleep = std::chrono::microseconds(int64_t{1} << std::min(idle - kYieldPolls, 8));
          cv.wait_for(lock, std::min(sleep, kMaxIdleSleep), woken);
        }
      }
      batch.swap(tasks);
      if (stop && batch.empty()) return;
    }
    for (auto& task : batch) {
      try {
        task();
      } catch (const std::exception& e) {
        TORUS_LOG_ERROR("mpi: engine task failed: {}", e.what());
      }
    }
    bool progressed = !batch.empty();
    if (!inflight.empty()) progressed |= poll_inflight();
    auto now = Clock::now();
    if (!abandoned.empty() && now - last_abandoned_poll >= kAbandonedPoll) {
      poll_abandoned();
      last_abandoned_poll = now;
    }
    if (progressed) {
      idle = 0;
    } else if (++idle > kSpinPolls && idle <= kYieldPolls) {
      std::this_thread::yield();
    }
  }
}

void MpiRuntime::Engine::shutdown() {
  for (auto& op : inflight) {
    if (!op->done) {
      note_failure(fmt::format("{} was still in flight at shutdown", label_of(*op)));
      fail(op, std::make_exception_ptr(CommError(fmt::format(
                   "{}: the MPI runtime shut down (its last backend was destroyed) while the op was in flight",
                   label_of(*op)))));
    }
  }
  inflight.clear();
  poll_abandoned();
  if (!abandoned.empty()) {
    note_failure(fmt::format("{} MPI request(s) of failed ops never completed", abandoned.size()));
    TORUS_LOG_WARN("mpi: {} MPI request(s) of failed ops never completed; {} with them pending", abandoned.size(),
                   owns_mpi ? "shutting MPI down" : "leaving MPI");
  }
  if (owns_mpi && !finalize_mpi()) {
    // MPI stays up until the process exits and may still touch the buffers
    // of abandoned requests (Note [Abandoned requests]): keep them until then
    // (reachable, so leak checkers do not report them). Once per process:
    // MPI cannot be initialised again.
    static auto* kept_until_exit = new std::vector<Abandoned>();
    *kept_until_exit = std::move(abandoned);
  }
  // Whatever MPI still referenced is gone with MPI itself.
  abandoned.clear();
}

// Note [Finalize after a failure]. Returns whether MPI was finalized.
bool MpiRuntime::Engine::finalize_mpi() {
  const bool met = meet_peers_for_finalize();
  std::string skip;
  if (!met && !failure.empty()) {
    skip = fmt::format("this process saw a failure ({})", failure);
  } else if (!met && launcher_keeps_survivors) {
    skip = "mpirun runs with orte_enable_recovery, so a missing rank may be dead";
  }
  if (!skip.empty()) {
    TORUS_LOG_WARN(
        "mpi: not calling MPI_Finalize: not every rank reached shutdown within {} s and {}. MPI_Finalize waits "
        "for every rank of the job (Open MPI: a PMIx fence), and with a rank dead or stuck it can block this process "
        "forever. MPI stays initialised until the process exits; mpirun reports that as an abnormal termination "
        "(and, without --mca orte_enable_recovery 1, ends the other ranks).",
        kShutdownMeetTimeout.count(), skip);
    return false;
  }
  if (!met) {
    TORUS_LOG_INFO("mpi: not every rank reached shutdown within {} s; MPI_Finalize waits for the late ones",
                   kShutdownMeetTimeout.count());
  }
  int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) TORUS_LOG_ERROR("mpi: MPI_Finalize failed: {}", mpi_error_string(rc));
  TORUS_LOG_DEBUG("mpi: MPI finalized");
  return true;
}

// Every rank meets the others in a barrier on MPI_COMM_WORLD (Torus's own
// while it owns MPI: the application cannot call MPI under
// MPI_THREAD_FUNNELED). True if all arrived within kShutdownMeetTimeout. A
// barrier that did not complete is left to MPI_Finalize or to the exit.
bool MpiRuntime::Engine::meet_peers_for_finalize() {
  if (world_size == 1) return true;
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &request) != MPI_SUCCESS) return false;
  const auto deadline = Clock::now() + kShutdownMeetTimeout;
  for (int polls = 0;; ++polls) {
    int flag = 0;
    if (MPI_Test(&request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (flag) return true;
    if (Clock::now() >= deadline) return false;
    // Open MPI advances the barrier only inside MPI calls: poll often, but
    // leave the core to the other ranks once the peers are clearly late.
    if (polls > kYieldPolls) {
      std::this_thread::sleep_for(kMaxIdleSleep);
    } else if (polls > kSpinPolls) {
      std::this_thread::yield();
    }
  }
}

void MpiRuntime::Engine::note_failure(const std::string& what) {
  if (failure.empty()) failure = what;
}

void MpiRuntime::Engine::start_op(const std::shared_ptr<MpiOp>& op) {
  MpiComm& comm = *op->comm;
  if (comm.broken()) {
    op->work->mark_failed(std::make_exception_ptr(CommError(
        fmt::format("{}: group '{}' is broken ({})", label_of(*op), comm.group().name, comm.broken_reason()))));
    return;
  }
  int rc = MPI_SUCCESS;
  try {
    rc = op->start(&op->request);
  } catch (...) {
    op->work->mark_failed(std::current_exception());
    return;
  }
  if (rc != MPI_SUCCESS) {
    std::string msg = fmt::format("{}: starting the MPI call failed: {}", label_of(*op), mpi_error_string(rc));
    note_failure(msg);
    comm.mark_broken(msg);
    op->request = MPI_REQUEST_NULL;
    op->work->mark_failed(std::make_exception_ptr(CommError(msg)));
    return;
  }
  ++comm.pending;
  if (op->request == MPI_REQUEST_NULL) {
    MPI_Status status{};
    complete(op, status);
    return;
  }
  inflight.push_back(op);
}

bool MpiRuntime::Engine::poll_inflight() {
  bool progressed = false;
  // Index loop: completing an op may fail others (done = true), never append.
  for (size_t i = 0; i < inflight.size(); ++i) {
    std::shared_ptr<MpiOp> op = inflight[i];
    if (op->done) continue;
    int flag = 0;
    MPI_Status status{};
    int rc = MPI_Test(&op->request, &flag, &status);
    if (rc != MPI_SUCCESS) {
      std::string msg = fmt::format("{}: MPI reported an error: {}", label_of(*op), mpi_error_string(rc));
      note_failure(msg);
      op->comm->mark_broken(msg);
      fail(op, std::make_exception_ptr(CommError(msg)));
      fail_comm_ops(op->comm.get(), msg);
      progressed = true;
    } else if (flag) {
      complete(op, status);
      progressed = true;
    } else if (Clock::now() >= op->deadline) {
      time_out(op);
      progressed = true;
    }
  }
  std::erase_if(inflight, [](const std::shared_ptr<MpiOp>& op) { return op->done; });
  return progressed;
}

void MpiRuntime::Engine::poll_abandoned() {
  std::erase_if(abandoned, [&](Abandoned& a) {
    int flag = 0;
    int rc = MPI_Test(&a.op->request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) {
      TORUS_LOG_DEBUG("mpi: abandoned request of {} {}", label_of(*a.op), flag ? "completed late" : "failed");
      a.op->request = MPI_REQUEST_NULL;
      retire(*a.op->comm);
      return true;
    }
    return false;
  });
}

void MpiRuntime::Engine::complete(const std::shared_ptr<MpiOp>& op, const MPI_Status& status) {
  op->done = true;
  op->request = MPI_REQUEST_NULL;
  retire(*op->comm);
  try {
    if (op->finish) op->finish(status);
  } catch (...) {
    // A finish step that broke its group (a failed MPI_Comm_split) is a
    // failure of the MPI traffic; a local check (a short message) is not.
    if (op->comm->broken()) note_failure(op->comm->broken_reason());
    op->work->mark_failed(std::current_exception());
    return;
  }
  op->work->mark_completed();
}

void MpiRuntime::Engine::time_out(const std::shared_ptr<MpiOp>& op) {
  if (op->cancellable) {
    // A receive can be withdrawn; if a message matched it meanwhile, the op
    // simply completes.
    MPI_Cancel(&op->request);
    int flag = 0, cancelled = 0;
    MPI_Status status{};
    if (MPI_Test(&op->request, &flag, &status) == MPI_SUCCESS && flag) {
      MPI_Test_cancelled(&status, &cancelled);
      if (!cancelled) {
        complete(op, status);
        return;
      }
      op->request = MPI_REQUEST_NULL;
    }
  }
  const GroupInfo& g = op->comm->group();
  std::string msg = fmt::format(
      "world rank {}: {} timed out after {} ms. {} Group '{}' is now broken: its later ops fail with CommError.",
      world_rank, label_of(*op), op->timeout.count(), missing_hint_of(*op), g.name);
  TORUS_LOG_ERROR("mpi: {}", msg);
  op->comm->mark_broken(fmt::format("{} timed out after {} ms", label_of(*op), op->timeout.count()));
  note_failure(op->comm->broken_reason());
  fail(op, std::make_exception_ptr(TimeoutError(msg)));
  fail_comm_ops(op->comm.get(),
                fmt::format("group '{}' broke while this op was in flight: {}", g.name, op->comm->broken_reason()));
}

void MpiRuntime::Engine::fail(const std::shared_ptr<MpiOp>& op, std::exception_ptr error) {
  op->done = true;
  if (op->request != MPI_REQUEST_NULL && op->cancellable) {
    // A receive can be withdrawn, so that no late message lands in it.
    MPI_Cancel(&op->request);
    int flag = 0;
    if (MPI_Test(&op->request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) op->request = MPI_REQUEST_NULL;
  }
  if (op->request != MPI_REQUEST_NULL) {
    // Note [Abandoned requests]: MPI may still use the buffers.
    abandoned.push_back({op, op->work->take_keep_alive()});
  } else {
    retire(*op->comm);
  }
  op->work->mark_failed(std::move(error));
}

void MpiRuntime::Engine::fail_comm_ops(const MpiComm* comm, const std::string& reason) {
  note_failure(reason);
  for (auto& op : inflight) {
    if (!op->done && op->comm.get() == comm) {
      fail(op, std::make_exception_ptr(CommError(fmt::format("{}: {}", label_of(*op), reason))));
    }
  }
}

void MpiRuntime::Engine::retire(MpiComm& comm) {
  --comm.pending;
  if (comm.release_requested && comm.pending == 0) comm.free_handle();
}

// ---------------------------------------------------------------------------
// MpiRuntime

std::shared_ptr<MpiRuntime> MpiRuntime::acquire() {
  Singleton& s = singleton();
  std::lock_guard<std::mutex> lock(s.mu);
  if (auto rt = s.instance.lock()) return rt;
  TORUS_CHECK(!s.torus_initialised_mpi, CommError,
              "mpi: Torus already shut MPI down in this process (its last mpi backend was destroyed) and MPI "
              "cannot be initialised twice; keep one mpi backend (or mpi_runtime_hold()) alive for the whole job");
  std::shared_ptr<MpiRuntime> rt(new MpiRuntime());
  s.instance = rt;
  s.torus_initialised_mpi = rt->engine_->owns_mpi;
  return rt;
}

MpiRuntime::MpiRuntime() : engine_(std::make_shared<Engine>()) {
  std::promise<void> started;
  auto ready = started.get_future();
  thread_ = std::thread([engine = engine_, p = std::move(started)]() mutable { engine->run(std::move(p)); });
  try {
    ready.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

MpiRuntime::~MpiRuntime() {
  // Serialised with acquire(): a new runtime never starts while this one
  // finalizes.
  std::lock_guard<std::mutex> lock(singleton().mu);
  {
    std::lock_guard<std::mutex> guard(engine_->mu);
    engine_->stop = true;
  }
  engine_->cv.notify_one();
  if (std::this_thread::get_id() == engine_->thread_id) {
    // The last reference went away on the engine itself (e.g. a keep-alive
    // object released by a completing op): it finishes on its own.
    thread_.detach();
  } else {
    thread_.join();
  }
}

int MpiRuntime::world_rank() const {
  return engine_->world_rank;
}
int MpiRuntime::world_size() const {
  return engine_->world_size;
}
int MpiRuntime::tag_ub() const {
  return engine_->tag_ub;
}
bool MpiRuntime::on_engine_thread() const {
  return std::this_thread::get_id() == engine_->thread_id;
}

void MpiRuntime::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(engine_->mu);
    engine_->tasks.push_back(std::move(task));
  }
  engine_->cv.notify_one();
}

void MpiRuntime::submit(std::shared_ptr<MpiOp> op) {
  // The engine object outlives every task (the thread holds it).
  post([e = engine_.get(), op = std::move(op)] { e->start_op(op); });
}

void MpiRuntime::run_blocking(std::shared_ptr<MpiComm> comm, std::string label, std::chrono::milliseconds timeout,
                              std::function<int(MPI_Request*)> start, std::function<void(const MPI_Status&)> finish) {
  TORUS_CHECK(!on_engine_thread(), InvalidArgument, "mpi: {} called on the MPI progress thread", label);
  WorkInfo info;
  info.group = comm->group().name;
  info.rank = comm->group().rank;
  info.group_size = comm->group().size;
  auto op = std::make_shared<MpiOp>();
  op->work = std::make_shared<MpiWork>(std::move(info));
  op->comm = std::move(comm);
  op->label = std::move(label);
  op->missing_hint = "Some ranks of the job have not reached this setup step (or are stuck or gone).";
  op->timeout = timeout;
  op->deadline = Clock::now() + timeout;
  op->start = std::move(start);
  op->finish = std::move(finish);
  auto work = op->work;
  submit(std::move(op));
  work->wait();
}

void MpiRuntime::fail_comm_ops(std::shared_ptr<MpiComm> comm, std::string reason) {
  post([e = engine_.get(), comm = std::move(comm), reason = std::move(reason)] {
    e->fail_comm_ops(comm.get(), reason);
  });
}

void MpiRuntime::release_comm(std::shared_ptr<MpiComm> comm) {
  post([comm = std::move(comm)] {
    comm->release_requested = true;
    if (comm->pending == 0) comm->free_handle();
  });
}

}  // namespace torus::comm::mpi
