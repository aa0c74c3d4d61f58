// The nccl comm backend (nccl_backend.h): argument checks, the stream-ordered
// issue path, split, and the factories.
#include "comm/nccl/nccl_backend.h"
#include "comm/work_info.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "comm/backend_registry.h"
#include "comm/nccl/efa_check.h"
#include "comm/nccl/nccl_check.h"
#include "comm/nccl/nccl_comm.h"
#include "comm/nccl/nccl_work.h"
#include "comm/nccl/watchdog.h"
#include "core/log.h"
#include "device/cuda/cuda_device.h"
#include "torus/comm/store.h"
#include "torus/core/params.h"
#include "torus/device/device.h"

namespace torus::comm {

using nccl::Clock;
using nccl::NcclComm;

namespace {

ncclDataType_t to_nccl(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  throw InvalidArgument(fmt::format("nccl: unknown dtype {}", static_cast<int>(t)));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;  // integers: sum then truncating division (NCCL's SumPostDiv)
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProd: return ncclProd;
  }
  throw InvalidArgument(fmt::format("nccl: unknown reduce op {}", static_cast<int>(op)));
}

cudaStream_t as_cuda(const device::Stream& s) { return static_cast<cudaStream_t>(s.native_handle()); }

const char* byte_ptr(const void* p, size_t offset) { return static_cast<const char*>(p) + offset; }
char* byte_ptr(void* p, size_t offset) { return static_cast<char*>(p) + offset; }

}  // namespace

struct NcclBackend::Impl {
  GroupInfo group;
  NcclOptions options;
  int device = 0;
  std::unique_ptr<NcclComm> comm;
  device::Stream stream;         // the group's communication stream
  device::Event ready;           // caller's stream -> comm stream (reused under issue_mu)
  device::DeviceBuffer scratch;  // one i32 for barrier()
  std::unique_ptr<nccl::Watchdog> watchdog;
  std::mutex issue_mu;
  uint64_t seq = 0;

  Impl(std::unique_ptr<NcclComm> c, GroupInfo g, NcclOptions o)
      : group(std::move(g)), options(o), device(c->device()), comm(std::move(c)) {
    device::cuda::DeviceGuard guard(device);
    device::Device& cuda = device::get_device(DeviceType::kCUDA);
    stream = cuda.create_stream({.high_priority = true});
    ready = cuda.create_event();
    scratch = device::DeviceBuffer(DeviceType::kCUDA, sizeof(int32_t));
    comm->set_shutdown_timeout(options.shutdown_timeout);
    NcclComm* raw = comm.get();
    nccl::WatchdogHooks hooks;
    hooks.async_error = [raw] { return raw->async_error(); };
    hooks.abort = [raw](const std::string&) { raw->abort(); };
    watchdog = std::make_unique<nccl::Watchdog>(
        std::move(hooks), nccl::Watchdog::Options{group.name, group.rank, options.watchdog_poll, true});
  }

  ~Impl() {
    if (!watchdog->drain(options.shutdown_timeout)) {
      watchdog->abort(fmt::format("the backend of group '{}' was destroyed with {} op(s) still in flight after {} ms",
                                  group.name, watchdog->in_flight(), options.shutdown_timeout.count()));
    }
    watchdog.reset();  // stops the thread before the communicator goes
    comm.reset();      // finalise + destroy when healthy; an aborted one is left alone
    try {
      device::cuda::DeviceGuard guard(device);
      scratch.reset();
      ready = device::Event();
      stream = device::Stream();
    } catch (const std::exception& e) {
      TORUS_LOG_WARN("nccl: releasing the resources of group '{}' failed: {}", group.name, e.what());
    }
  }

  WorkInfo info(OpType op, DType dtype, std::vector<int64_t> sizes, int peer = -1) const {
    return make_work_info(group, op, dtype, std::move(sizes), peer);
  }

  void throw_if_broken(const WorkInfo& w) const {
    if (watchdog->broken()) {
      throw CommError(fmt::format("{} refused: group '{}' is broken ({})", w.describe(), group.name,
                                  watchdog->broken_reason()));
    }
  }

  // Breaks the group for an issue-time failure and throws `error`.
  template <typename E>
  [[noreturn]] void fail_issue(E error) {
    watchdog->abort(error.what());
    throw error;
  }

  // Waits, under the op's deadline, for an NCCL call that returned
  // ncclInProgress to be enqueued; breaks the group and throws otherwise.
  void finish_enqueue(ncclResult_t r, const WorkInfo& w, Clock::time_point deadline) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) {
      NcclComm::Readiness ready_state = comm->wait_ready(deadline);
      switch (ready_state.status) {
        case NcclComm::Status::kReady: return;
        case NcclComm::Status::kTimeout:
          fail_issue(TimeoutError(fmt::format("{} could not be enqueued before its deadline (NCCL kept reporting "
                                              "ncclInProgress); the communicator was aborted",
                                              w.describe())));
        case NcclComm::Status::kAborted:
          throw CommError(fmt::format("{} interrupted: group '{}' was aborted", w.describe(), group.name));
        case NcclComm::Status::kError:
          fail_issue(CommError(fmt::format("{} failed in NCCL: {}", w.describe(), ready_state.error)));
      }
    }
    std::string text = nccl::nccl_error_text(r, nullptr);
    if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
      // NCCL leaves the communicator usable after rejecting arguments.
      throw InvalidArgument(fmt::format("{}: NCCL rejected the call: {}", w.describe(), text));
    }
    fail_issue(CommError(fmt::format("{} failed in NCCL: {}", w.describe(), text)));
  }

  // The issue path of every op (Note [Stream-ordered work]). `enqueue` makes
  // the NCCL call(s) on (comm, stream) and returns NCCL's result.
  template <typename Enqueue>
  WorkPtr issue(WorkInfo w, Duration timeout, bool host_blocking, Enqueue&& enqueue) {
    TORUS_CHECK(timeout.count() > 0, InvalidArgument, "nccl {}: timeout must be > 0, got {} ms",
                op_type_name(w.op), timeout.count());
    std::lock_guard<std::mutex> lock(issue_mu);
    w.seq = ++seq;
    throw_if_broken(w);
    const Clock::time_point deadline = Clock::now() + timeout;
    device::cuda::DeviceGuard guard(device);
    auto work = std::make_shared<nccl::NcclWork>(w, device, watchdog->gate(), host_blocking);
    ready.record(device::current_stream(DeviceType::kCUDA, device));
    stream.wait(ready);
    ncclResult_t r = comm->call([&](ncclComm_t c) { return enqueue(c, as_cuda(stream)); });
    finish_enqueue(r, w, deadline);
    work->end_event().record(stream);
    nccl::NcclWork* raw = work.get();  // the watchdog's entry owns the work
    watchdog->track(work, [raw] { return raw->device_done(); }, deadline);
    return work;
  }

  void check_rank(int r, const char* what) const {
    TORUS_CHECK(r >= 0 && r < group.size, InvalidArgument, "nccl: {} {} is out of range for group '{}' of size {}",
                what, r, group.name, group.size);
  }

  static void check_buffer(const void* p, size_t count, const char* what) {
    TORUS_CHECK(p != nullptr || count == 0, InvalidArgument, "nccl: {} is null for {} elements", what, count);
  }

  // Grouped point-to-point calls; the first failure is returned after the
  // group is closed (a group must always be ended).
  static ncclResult_t grouped(ncclComm_t c, cudaStream_t s, std::span<const P2POp> ops) {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    for (const P2POp& op : ops) {
      if (op.count == 0) continue;
      ncclResult_t r = op.kind == P2POp::Kind::kSend ? ncclSend(op.buf, op.count, to_nccl(op.dtype), op.peer, c, s)
                                                     : ncclRecv(op.buf, op.count, to_nccl(op.dtype), op.peer, c, s);
      if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    ncclResult_t end = ncclGroupEnd();
    return first != ncclSuccess ? first : end;
  }

  std::shared_ptr<Backend> split(int color, int key, const std::string& name, Duration timeout);
};

// --- split --------------------------------------------------------------------

std::shared_ptr<Backend> NcclBackend::Impl::split(int color, int key, const std::string& name, Duration timeout) {
  TORUS_CHECK(timeout.count() > 0, InvalidArgument, "nccl split: timeout must be > 0");
  std::lock_guard<std::mutex> lock(issue_mu);
  WorkInfo w = info(OpType::kAllGather, DType::kI64, {2, 2 * static_cast<int64_t>(group.size)});
  w.seq = ++seq;
  throw_if_broken(w);
  const Clock::time_point deadline = Clock::now() + timeout;
  device::cuda::DeviceGuard guard(device);
  device::Device& cuda = device::get_device(DeviceType::kCUDA);

  // Every rank's (color, key), gathered over this communicator: the new
  // group's members and order, known identically on every rank.
  const size_t bytes = 2 * sizeof(int64_t) * static_cast<size_t>(group.size);
  device::PinnedBuffer host(DeviceType::kCUDA, bytes);
  device::DeviceBuffer dev(DeviceType::kCUDA, bytes);
  int64_t* h = host.as<int64_t>();
  h[2 * group.rank] = color;
  h[2 * group.rank + 1] = key;
  const size_t mine = 2 * sizeof(int64_t) * static_cast<size_t>(group.rank);
  cuda.copy_async(byte_ptr(dev.data(), mine), byte_ptr(host.data(), mine), 2 * sizeof(int64_t), stream);
  ncclResult_t r = comm->call([&](ncclComm_t c) {
    return ncclAllGather(byte_ptr(dev.data(), mine), dev.data(), 2, ncclInt64, c, as_cuda(stream));
  });
  finish_enqueue(r, w, deadline);
  cuda.copy_async(host.data(), dev.data(), bytes, stream);
  device::Event gathered = cuda.create_event();
  gathered.record(stream);
  while (!gathered.query()) {
    if (watchdog->broken()) throw CommError(fmt::format("split of group '{}' interrupted: the group is broken ({})",
                                                        group.name, watchdog->broken_reason()));
    if (Clock::now() >= deadline) {
      fail_issue(TimeoutError(fmt::format("split of group '{}' (rank {}): exchanging colors timed out; the "
                                          "communicator was aborted",
                                          group.name, group.rank)));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  std::vector<int> members;  // parent ranks of the new group, in new-rank order
  if (color >= 0) {
    for (int q = 0; q < group.size; ++q) {
      if (h[2 * q] == color) members.push_back(q);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return h[2 * a + 1] < h[2 * b + 1]; });
  }

  std::unique_ptr<NcclComm> child;
  try {
    child = comm->split(color, key, name, deadline);
  } catch (const Error& e) {
    watchdog->abort(fmt::format("split into '{}' failed: {}", name, e.what()));
    throw;
  }
  if (color < 0) return nullptr;

  GroupInfo g;
  g.name = name;
  g.size = static_cast<int>(members.size());
  g.rank = static_cast<int>(std::find(members.begin(), members.end(), group.rank) - members.begin());
  for (int q : members) g.global_ranks.push_back(group.global_ranks[static_cast<size_t>(q)]);
  TORUS_CHECK(child->rank() == g.rank && child->size() == g.size, CommError,
              "split of group '{}' into '{}': NCCL placed this rank at {} of {}, expected {} of {}", group.name, name,
              child->rank(), child->size(), g.rank, g.size);
  TORUS_LOG_DEBUG("nccl: split group '{}' (color {}, key {}) into '{}': rank {} of {}", group.name, color, key, name,
                  g.rank, g.size);
  return std::make_shared<NcclBackend>(std::make_unique<Impl>(std::move(child), std::move(g), options));
}

// --- NcclBackend ----------------------------------------------------------------

NcclBackend::NcclBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NcclBackend::~NcclBackend() {
  if (impl_ && impl_->watchdog->on_watchdog_thread()) {
    // The last reference went away in a completion callback, on the watchdog
    // thread, which cannot stop and join itself: tear down from a helper
    // thread (it waits for the watchdog's current poll to finish).
    std::thread([impl = std::move(impl_)]() mutable { impl.reset(); }).detach();
  }
}

const GroupInfo& NcclBackend::group() const { return impl_->group; }
int NcclBackend::device() const { return impl_->device; }
bool NcclBackend::broken() const { return impl_->watchdog->broken(); }

bool NcclBackend::supports(OpType, DType, ReduceOp) const {
  // Every op, dtype and reduce op of the Backend interface maps onto NCCL.
  return true;
}

WorkPtr NcclBackend::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, Duration timeout) {
  Impl::check_buffer(in, count, "all_reduce input");
  Impl::check_buffer(out, count, "all_reduce output");
  return impl_->issue(impl_->info(OpType::kAllReduce, dtype, {static_cast<int64_t>(count)}), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) {
                        return ncclAllReduce(in, out, count, to_nccl(dtype), to_nccl(op), c, s);
                      });
}

WorkPtr NcclBackend::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                    Duration timeout) {
  Impl::check_buffer(in, count, "reduce_scatter input");
  Impl::check_buffer(out, count, "reduce_scatter output");
  const auto n = static_cast<int64_t>(count);
  return impl_->issue(impl_->info(OpType::kReduceScatter, dtype, {n * size(), n}), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) {
                        return ncclReduceScatter(in, out, count, to_nccl(dtype), to_nccl(op), c, s);
                      });
}

WorkPtr NcclBackend::all_gather(const void* in, void* out, size_t count, DType dtype, Duration timeout) {
  Impl::check_buffer(in, count, "all_gather input");
  Impl::check_buffer(out, count, "all_gather output");
  const auto n = static_cast<int64_t>(count);
  return impl_->issue(impl_->info(OpType::kAllGather, dtype, {n, n * size()}), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, out, count, to_nccl(dtype), c, s); });
}

WorkPtr NcclBackend::all_to_all(const void* in, void* out, std::span<const size_t> send_counts,
                                std::span<const size_t> recv_counts, DType dtype, Duration timeout) {
  const auto n = static_cast<size_t>(size());
  TORUS_CHECK(send_counts.size() == n && recv_counts.size() == n, InvalidArgument,
              "nccl all_to_all: {} send and {} recv counts for a group of {}", send_counts.size(), recv_counts.size(),
              n);
  const size_t total_send = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
  const size_t total_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  Impl::check_buffer(in, total_send, "all_to_all input");
  Impl::check_buffer(out, total_recv, "all_to_all output");
  TORUS_CHECK(in != out || total_send + total_recv == 0, InvalidArgument, "nccl all_to_all: input and output alias");
  const size_t elt = dtype_size(dtype);
  std::vector<P2POp> ops;
  ops.reserve(2 * n);
  size_t send_off = 0;
  size_t recv_off = 0;
  for (size_t r = 0; r < n; ++r) {
    ops.push_back({P2POp::Kind::kSend, const_cast<char*>(byte_ptr(in, send_off * elt)), send_counts[r], dtype,
                   static_cast<int>(r)});
    ops.push_back({P2POp::Kind::kRecv, byte_ptr(out, recv_off * elt), recv_counts[r], dtype, static_cast<int>(r)});
    send_off += send_counts[r];
    recv_off += recv_counts[r];
  }
  return impl_->issue(
      impl_->info(OpType::kAllToAll, dtype, {static_cast<int64_t>(total_send), static_cast<int64_t>(total_recv)}),
      timeout, false, [&](ncclComm_t c, cudaStream_t s) { return Impl::grouped(c, s, ops); });
}

WorkPtr NcclBackend::broadcast(void* buf, size_t count, DType dtype, int root, Duration timeout) {
  impl_->check_rank(root, "broadcast root");
  Impl::check_buffer(buf, count, "broadcast buffer");
  return impl_->issue(impl_->info(OpType::kBroadcast, dtype, {static_cast<int64_t>(count)}, root), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) {
                        return ncclBroadcast(buf, buf, count, to_nccl(dtype), root, c, s);
                      });
}

WorkPtr NcclBackend::reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root,
                            Duration timeout) {
  impl_->check_rank(root, "reduce root");
  Impl::check_buffer(in, count, "reduce input");
  if (rank() == root) Impl::check_buffer(out, count, "reduce output on the root");
  return impl_->issue(impl_->info(OpType::kReduce, dtype, {static_cast<int64_t>(count)}, root), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) {
                        // NCCL reads recvbuff only on the root; null elsewhere is allowed.
                        return ncclReduce(in, out, count, to_nccl(dtype), to_nccl(op), root, c, s);
                      });
}

WorkPtr NcclBackend::send(const void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) {
  impl_->check_rank(peer, "send peer");
  TORUS_CHECK(tag >= 0, InvalidArgument, "nccl send: tag must be >= 0, got {}", tag);
  TORUS_CHECK(peer != rank(), InvalidArgument,
              "nccl send to itself (rank {}) would deadlock on one stream; use batch_send_recv", peer);
  Impl::check_buffer(buf, count, "send buffer");
  return impl_->issue(impl_->info(OpType::kSend, dtype, {static_cast<int64_t>(count)}, peer), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) { return ncclSend(buf, count, to_nccl(dtype), peer, c, s); });
}

WorkPtr NcclBackend::recv(void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) {
  impl_->check_rank(peer, "recv peer");
  TORUS_CHECK(tag >= 0, InvalidArgument, "nccl recv: tag must be >= 0, got {}", tag);
  TORUS_CHECK(peer != rank(), InvalidArgument,
              "nccl recv from itself (rank {}) would deadlock on one stream; use batch_send_recv", peer);
  Impl::check_buffer(buf, count, "recv buffer");
  return impl_->issue(impl_->info(OpType::kRecv, dtype, {static_cast<int64_t>(count)}, peer), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) { return ncclRecv(buf, count, to_nccl(dtype), peer, c, s); });
}

WorkPtr NcclBackend::batch_send_recv(std::span<const P2POp> ops, Duration timeout) {
  std::vector<int64_t> sizes;
  for (const P2POp& op : ops) {
    impl_->check_rank(op.peer, op.kind == P2POp::Kind::kSend ? "batch send peer" : "batch recv peer");
    Impl::check_buffer(op.buf, op.count, "batch_send_recv buffer");
    to_nccl(op.dtype);  // rejects unknown dtypes before communicating
    sizes.push_back(static_cast<int64_t>(op.count));
  }
  OpType kind = !ops.empty() && ops.front().kind == P2POp::Kind::kRecv ? OpType::kRecv : OpType::kSend;
  DType dtype = ops.empty() ? DType::kU8 : ops.front().dtype;
  return impl_->issue(impl_->info(kind, dtype, std::move(sizes)), timeout, false,
                      [&](ncclComm_t c, cudaStream_t s) { return Impl::grouped(c, s, ops); });
}

WorkPtr NcclBackend::barrier(Duration timeout) {
  int32_t* one = impl_->scratch.as<int32_t>();
  return impl_->issue(impl_->info(OpType::kBarrier, DType::kI32, {}), timeout, true,
                      [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(one, one, 1, ncclInt32, ncclSum, c, s); });
}

std::shared_ptr<Backend> NcclBackend::split(int color, int key, const std::string& name, Duration timeout) {
  return impl_->split(color, key, name, timeout);
}

void NcclBackend::abort(const std::string& reason) {
  impl_->watchdog->abort(fmt::format("aborted by the application: {}", reason));
}

// --- factories ------------------------------------------------------------------

std::shared_ptr<NcclBackend> create_nccl_backend(const NcclInit& init) {
  TORUS_CHECK(init.store != nullptr, InvalidArgument, "nccl: a Store is required to exchange the unique id");
  TORUS_CHECK(init.size > 0 && init.rank >= 0 && init.rank < init.size, InvalidArgument,
              "nccl: rank {} of {} is out of range", init.rank, init.size);
  TORUS_CHECK(init.timeout.count() > 0, InvalidArgument, "nccl: the init timeout must be > 0");
  TORUS_CHECK(!init.store_prefix.empty(), InvalidArgument, "nccl: store_prefix must not be empty");
  TORUS_CHECK(init.global_ranks.empty() || init.global_ranks.size() == static_cast<size_t>(init.size),
              InvalidArgument, "nccl: {} global ranks for a group of {}", init.global_ranks.size(), init.size);
  device::Device& cuda = device::get_device(DeviceType::kCUDA);
  const int count = cuda.count();
  TORUS_CHECK(count > 0, Error, "nccl: {}", cuda.describe());
  TORUS_CHECK(init.device >= 0 && init.device < count, InvalidArgument, "nccl: CUDA device {} of {} does not exist",
              init.device, count);

  const auto start = Clock::now();
  const Clock::time_point deadline = start + init.timeout;
  const std::string id_key = init.store_prefix + "/unique_id";
  ncclUniqueId id;
  static_assert(sizeof(id) == NCCL_UNIQUE_ID_BYTES);
  if (init.rank == 0) {
    TORUS_CHECK_NCCL(ncclGetUniqueId(&id), nullptr);
    init.store->set(id_key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id)));
  } else {
    std::vector<uint8_t> bytes = init.store->get(id_key, init.timeout);
    TORUS_CHECK(bytes.size() == sizeof(id), CommError, "nccl: the unique id under '{}' has {} bytes, expected {}",
                id_key, bytes.size(), sizeof(id));
    std::memcpy(id.internal, bytes.data(), sizeof(id));
  }
  // The last rank to have the id removes it from the store.
  if (init.store->add(init.store_prefix + "/readers", 1) == init.size) {
    init.store->remove(id_key);
    init.store->remove(init.store_prefix + "/readers");
  }

  std::unique_ptr<NcclComm> comm = NcclComm::init(id, init.size, init.rank, init.device, init.group_name, deadline);
  GroupInfo g;
  g.name = init.group_name;
  g.rank = init.rank;
  g.size = init.size;
  g.global_ranks = init.global_ranks;
  if (g.global_ranks.empty()) {
    g.global_ranks.resize(static_cast<size_t>(init.size));
    std::iota(g.global_ranks.begin(), g.global_ranks.end(), 0);
  }
  TORUS_LOG_INFO("nccl: group '{}' ready, rank {} of {} on CUDA device {}, in {} ms", g.name, g.rank, g.size,
                 init.device, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
  return std::make_shared<NcclBackend>(std::make_unique<NcclBackend::Impl>(std::move(comm), std::move(g), init.options));
}

BackendPtr create_nccl_world_backend(const BackendInit& init) {
  TORUS_CHECK(init.launch != nullptr && init.store != nullptr, InvalidArgument,
              "create_nccl_world_backend needs the launch info and the store");
  static std::atomic<int> generation{0};
  const int n = generation++;
  const LaunchInfo& L = *init.launch;
  int version = 0;
  TORUS_CHECK_NCCL(ncclGetVersion(&version), nullptr);
  NcclInit ni;
  ni.store = init.store;
  ni.store_prefix = fmt::format("torus/nccl/world/{}", n);
  ni.rank = L.rank;
  ni.size = L.world_size;
  ni.device = device::select_device_for_local_rank(L.local_rank, L.local_size);
  ni.group_name = "world";
  ni.timeout = init.timeout.count() > 0 ? init.timeout : env_params().timeout;
  device::DeviceProperties p = device::get_device(DeviceType::kCUDA).properties(ni.device);
  TORUS_LOG_INFO("nccl: NCCL {}.{}.{}, rank {} (local {} of {}) on CUDA device {} ({})", version / 10000,
                 version / 100 % 100, version % 100, L.rank, L.local_rank, L.local_size, ni.device, p.name);
  std::shared_ptr<NcclBackend> b = create_nccl_backend(ni);
  nccl::log_efa_check();  // after init: NCCL has loaded its network plugin by now
  return b;
}

// Note [Backend registration]: nccl is the device backend of CUDA memory,
// made by the bootstrap whenever the process sees a CUDA device. Every rank
// decides alike (a job is homogeneous); ranks without a GPU in a GPU job
// fail in the NCCL bootstrap with a clear error.
void register_nccl_backend(BackendRegistry& registry) {
  BackendFactory f;
  f.name = "nccl";
  f.role = BackendRole::kDevice;
  f.memory = DeviceType::kCUDA;
  f.usability = [](const BackendInit&) {
    device::Device& d = device::get_device(DeviceType::kCUDA);
    return d.count() > 0 ? Usability{true, d.describe()} : Usability{false, d.describe()};
  };
  f.create = create_nccl_world_backend;
  registry.add(std::move(f));
}

}  // namespace torus::comm
