// The `mpi` host backend: argument checks, f16/bf16 staging, in-place
// mapping and the non-blocking MPI call of each op. The progress thread, the
// deadlines and the request bookkeeping live in mpi_runtime.cpp. Contracts
// in mpi_backend.h.
#include "comm/mpi/mpi_backend.h"
#include "comm/work_info.h"

#include <climits>
#include <cstring>
#include <numeric>

#include "comm/backend_registry.h"
#include "comm/mpi/mpi_bootstrap.h"
#include "comm/mpi/mpi_check.h"
#include "core/log.h"
#include "kernels/cpu/reduce.h"

namespace torus::comm {
namespace mpi {

namespace {

constexpr Duration kDefaultSetupTimeout = std::chrono::minutes(10);

bool is_half(DType t) {
  return t == DType::kF16 || t == DType::kBF16;
}

bool valid_dtype(DType t) {
  for (DType d : kAllDTypes) {
    if (d == t) return true;
  }
  return false;
}

bool valid_reduce_op(ReduceOp op) {
  for (ReduceOp r : kAllReduceOps) {
    if (r == op) return true;
  }
  return false;
}

bool is_reduction(OpType op) {
  return op == OpType::kAllReduce || op == OpType::kReduceScatter || op == OpType::kReduce;
}

// Checks shared by every op; throws before any communication.
void check_common(OpType op, DType dtype, Duration timeout, const Backend& b, ReduceOp reduce = ReduceOp::kSum) {
  std::string_view what = op_type_name(op);
  TORUS_CHECK(timeout.count() > 0, InvalidArgument, "mpi {}: timeout must be > 0 ms, got {}", what, timeout.count());
  TORUS_CHECK(valid_dtype(dtype), InvalidArgument, "mpi {}: invalid dtype value {}", what, static_cast<int>(dtype));
  TORUS_CHECK(!is_reduction(op) || valid_reduce_op(reduce), InvalidArgument, "mpi {}: invalid reduce op value {}", what,
              static_cast<int>(reduce));
  TORUS_CHECK(b.supports(op, dtype, reduce), Unsupported, "mpi {}: dtype {} with reduce op {} is not supported", what,
              dtype_name(dtype), reduce_op_name(reduce));
}

// count * blocks elements of `dtype` in bytes, checked for size_t overflow
// (InvalidArgument) and for MPI's int counts (Unsupported).
size_t checked_bytes(std::string_view what, size_t count, size_t blocks, DType dtype) {
  size_t elt = dtype_size(dtype);
  TORUS_CHECK(blocks == 0 || count <= SIZE_MAX / elt / blocks, InvalidArgument,
              "mpi {}: {} x {} elements of {} overflow the address space", what, count, blocks, dtype_name(dtype));
  TORUS_CHECK(count * blocks <= static_cast<size_t>(INT_MAX), Unsupported,
              "mpi {}: {} elements exceed the mpi backend's limit of INT_MAX ({}) elements per op (MPI counts are "
              "int); split the op",
              what, count * blocks, INT_MAX);
  return count * blocks * elt;
}

void check_buffer(std::string_view what, const void* p, size_t bytes, const char* name) {
  TORUS_CHECK(p != nullptr || bytes == 0, InvalidArgument, "mpi {}: `{}` is null but the op moves {} bytes", what, name,
              bytes);
}

void check_rank(std::string_view what, int r, int size, const char* role) {
  TORUS_CHECK(r >= 0 && r < size, InvalidArgument, "mpi {}: {} {} is outside the group [0, {})", what, role, r, size);
}

using FloatBuf = std::shared_ptr<std::vector<float>>;

FloatBuf to_f32(const void* src, size_t n, DType half) {
  auto buf = std::make_shared<std::vector<float>>(n);
  if (n) kernels::half_to_f32(src, buf->data(), n, half);
  return buf;
}

std::vector<int> iota_ranks(int n) {
  std::vector<int> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------
// Issue machinery

MpiBackend::MpiBackend(std::shared_ptr<MpiRuntime> runtime, std::shared_ptr<MpiComm> comm)
    : runtime_(std::move(runtime)), comm_(std::move(comm)) {}

MpiBackend::~MpiBackend() {
  runtime_->release_comm(comm_);
}

bool MpiBackend::supports(OpType op, DType dtype, ReduceOp reduce) const {
  bool op_ok = false;
  for (OpType o : kAllOpTypes) op_ok |= (o == op);
  return op_ok && valid_dtype(dtype) && (!is_reduction(op) || valid_reduce_op(reduce));
}

std::exception_ptr MpiBackend::broken_error(const std::string& what) const {
  return std::make_exception_ptr(
      CommError(fmt::format("{}: group '{}' is broken ({})", what, group().name, comm_->broken_reason())));
}

WorkInfo MpiBackend::make_info(OpType op, DType dtype, std::vector<int64_t> sizes, int peer) const {
  return make_work_info(group(), op, dtype, std::move(sizes), peer);
}

std::shared_ptr<MpiWork> MpiBackend::issue(WorkInfo info, Duration timeout, Spec spec,
                                           const std::function<std::string(uint64_t)>& label) {
  auto op = std::make_shared<MpiOp>();
  std::lock_guard<std::mutex> lock(mu_);
  info.seq = next_seq_++;
  if (label) op->label = label(info.seq);
  op->tag = spec.tag;
  op->work = std::make_shared<MpiWork>(std::move(info));
  if (comm_->broken()) {
    op->work->mark_failed(broken_error(op->label.empty() ? op->work->info().describe() : op->label));
    return op->work;
  }
  op->comm = comm_;
  op->timeout = timeout;
  op->deadline = Clock::now() + timeout;
  op->start = std::move(spec.start);
  op->finish = std::move(spec.finish);
  op->cancellable = spec.cancellable;
  auto work = op->work;
  runtime_->submit(std::move(op));
  return work;
}

WorkPtr MpiBackend::issue_local(WorkInfo info, const std::function<void()>& local) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    info.seq = next_seq_++;
  }
  auto work = std::make_shared<MpiWork>(std::move(info));
  if (comm_->broken()) {
    work->mark_failed(broken_error(work->info().describe()));
    return work;
  }
  local();
  work->mark_completed();
  return work;
}

// ---------------------------------------------------------------------------
// Collectives

WorkPtr MpiBackend::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, Duration timeout) {
  constexpr std::string_view what = "all_reduce";
  check_common(OpType::kAllReduce, dtype, timeout, *this, op);
  size_t bytes = checked_bytes(what, count, 1, dtype);
  check_buffer(what, in, bytes, "in");
  check_buffer(what, out, bytes, "out");
  WorkInfo info = make_info(OpType::kAllReduce, dtype, {static_cast<int64_t>(count)});
  if (size() == 1) {
    return issue_local(std::move(info), [=] {
      if (in != out && bytes) std::memcpy(out, in, bytes);
    });
  }
  MPI_Comm comm = comm_->handle();
  MPI_Op mop = mpi_reduce_op(op);
  int n = static_cast<int>(count), group_size = size();
  Spec spec;
  if (is_half(dtype)) {
    FloatBuf acc = to_f32(in, count, dtype);
    spec.start = [=](MPI_Request* req) {
      return MPI_Iallreduce(MPI_IN_PLACE, acc->data(), n, MPI_FLOAT, mop, comm, req);
    };
    spec.finish = [=](const MPI_Status&) {
      if (op == ReduceOp::kAvg) kernels::divide_inplace(acc->data(), count, DType::kF32, group_size);
      if (count) kernels::f32_to_half(acc->data(), out, count, dtype);
    };
  } else {
    MPI_Datatype type = mpi_transfer_type(dtype);
    const void* send = in == out ? MPI_IN_PLACE : in;
    spec.start = [=](MPI_Request* req) { return MPI_Iallreduce(send, out, n, type, mop, comm, req); };
    if (op == ReduceOp::kAvg) {
      spec.finish = [=](const MPI_Status&) { kernels::divide_inplace(out, count, dtype, group_size); };
    }
  }
  return issue(std::move(info), timeout, std::move(spec));
}

WorkPtr MpiBackend::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                   Duration timeout) {
  constexpr std::string_view what = "reduce_scatter";
  check_common(OpType::kReduceScatter, dtype, timeout, *this, op);
  const size_t group_size = static_cast<size_t>(size());
  size_t in_bytes = checked_bytes(what, count, group_size, dtype);
  size_t out_bytes = count * dtype_size(dtype);
  check_buffer(what, in, in_bytes, "in");
  check_buffer(what, out, out_bytes, "out");
  WorkInfo info =
      make_info(OpType::kReduceScatter, dtype, {static_cast<int64_t>(count * group_size), static_cast<int64_t>(count)});
  const bool in_place = out == static_cast<const char*>(in) + static_cast<size_t>(rank()) * out_bytes;
  if (group_size == 1) {
    return issue_local(std::move(info), [=] {
      if (!in_place && out_bytes) std::memcpy(out, in, out_bytes);
    });
  }
  MPI_Comm comm = comm_->handle();
  MPI_Op mop = mpi_reduce_op(op);
  int n = static_cast<int>(count);
  int64_t divisor = static_cast<int64_t>(group_size);
  Spec spec;
  if (is_half(dtype)) {
    FloatBuf acc_in = to_f32(in, count * group_size, dtype);
    FloatBuf acc_out = std::make_shared<std::vector<float>>(count);
    spec.start = [=](MPI_Request* req) {
      return MPI_Ireduce_scatter_block(acc_in->data(), acc_out->data(), n, MPI_FLOAT, mop, comm, req);
    };
    spec.finish = [=](const MPI_Status&) {
      if (op == ReduceOp::kAvg) kernels::divide_inplace(acc_out->data(), count, DType::kF32, divisor);
      if (count) kernels::f32_to_half(acc_out->data(), out, count, dtype);
    };
  } else {
    // MPI's in-place form leaves the result at the start of the buffer, not at
    // block rank(): receive into a temporary instead, keeping `in` intact.
    auto tmp = in_place ? std::make_shared<std::vector<char>>(out_bytes) : nullptr;
    void* recv = in_place ? static_cast<void*>(tmp->data()) : out;
    MPI_Datatype type = mpi_transfer_type(dtype);
    spec.start = [=](MPI_Request* req) { return MPI_Ireduce_scatter_block(in, recv, n, type, mop, comm, req); };
    spec.finish = [=](const MPI_Status&) {
      if (op == ReduceOp::kAvg) kernels::divide_inplace(recv, count, dtype, divisor);
      if (tmp && out_bytes) std::memcpy(out, tmp->data(), out_bytes);
    };
  }
  return issue(std::move(info), timeout, std::move(spec));
}

WorkPtr MpiBackend::all_gather(const void* in, void* out, size_t count, DType dtype, Duration timeout) {
  constexpr std::string_view what = "all_gather";
  check_common(OpType::kAllGather, dtype, timeout, *this);
  const size_t group_size = static_cast<size_t>(size());
  size_t out_bytes = checked_bytes(what, count, group_size, dtype);
  size_t in_bytes = count * dtype_size(dtype);
  check_buffer(what, in, in_bytes, "in");
  check_buffer(what, out, out_bytes, "out");
  WorkInfo info =
      make_info(OpType::kAllGather, dtype, {static_cast<int64_t>(count), static_cast<int64_t>(count * group_size)});
  const bool in_place = in == static_cast<const char*>(out) + static_cast<size_t>(rank()) * in_bytes;
  if (group_size == 1) {
    return issue_local(std::move(info), [=] {
      if (!in_place && in_bytes) std::memcpy(out, in, in_bytes);
    });
  }
  MPI_Comm comm = comm_->handle();
  MPI_Datatype type = mpi_transfer_type(dtype);
  int n = static_cast<int>(count);
  const void* send = in_place ? MPI_IN_PLACE : in;
  Spec spec;
  spec.start = [=](MPI_Request* req) { return MPI_Iallgather(send, n, type, out, n, type, comm, req); };
  return issue(std::move(info), timeout, std::move(spec));
}

WorkPtr MpiBackend::all_to_all(const void* in, void* out, std::span<const size_t> send_counts,
                               std::span<const size_t> recv_counts, DType dtype, Duration timeout) {
  constexpr std::string_view what = "all_to_all";
  check_common(OpType::kAllToAll, dtype, timeout, *this);
  const size_t group_size = static_cast<size_t>(size());
  TORUS_CHECK(send_counts.size() == group_size && recv_counts.size() == group_size, InvalidArgument,
              "mpi all_to_all: expected {} send and recv counts (one per rank), got {} and {}", group_size,
              send_counts.size(), recv_counts.size());
  auto total = [&](std::span<const size_t> counts, const char* name) {
    size_t sum = 0;
    for (size_t c : counts) {
      TORUS_CHECK(c <= SIZE_MAX - sum, InvalidArgument, "mpi all_to_all: the {} overflow size_t", name);
      sum += c;
    }
    checked_bytes(what, sum, 1, dtype);
    return sum;
  };
  const size_t send_total = total(send_counts, "send counts");
  const size_t recv_total = total(recv_counts, "recv counts");
  const size_t me = static_cast<size_t>(rank());
  TORUS_CHECK(send_counts[me] == recv_counts[me], InvalidArgument,
              "mpi all_to_all: rank {} sends {} elements to itself but expects {}", me, send_counts[me],
              recv_counts[me]);
  const size_t elt = dtype_size(dtype);
  const size_t send_bytes = send_total * elt, recv_bytes = recv_total * elt;
  check_buffer(what, in, send_bytes, "in");
  check_buffer(what, out, recv_bytes, "out");
  if (send_bytes && recv_bytes) {
    auto a = reinterpret_cast<uintptr_t>(in), b = reinterpret_cast<uintptr_t>(out);
    TORUS_CHECK(a + send_bytes <= b || b + recv_bytes <= a, InvalidArgument,
                "mpi all_to_all: `in` and `out` overlap; all_to_all has no in-place form");
  }
  WorkInfo info =
      make_info(OpType::kAllToAll, dtype, {static_cast<int64_t>(send_total), static_cast<int64_t>(recv_total)});
  if (group_size == 1) {
    return issue_local(std::move(info), [=] {
      if (send_bytes) std::memcpy(out, in, send_bytes);
    });
  }
  MPI_Comm comm = comm_->handle();
  MPI_Datatype type = mpi_transfer_type(dtype);
  // Always the v-form, even when this rank's counts are all equal: each rank
  // sees only its own counts, and a rank that started MPI_Ialltoall while
  // its peers started MPI_Ialltoallv would never match them (a rank that
  // routes no tokens, all zeros, is the normal case of expert parallelism).
  // Measured with equal counts on 2 and 4 ranks, 1 to 2^20 floats per block
  // (Open MPI 4.1, vader): no consistent advantage of MPI_Ialltoall.
  // The count and displacement arrays must live until the op completes.
  struct Layout {
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  };
  auto layout = std::make_shared<Layout>();
  int send_off = 0, recv_off = 0;  // within INT_MAX: checked above
  for (size_t r = 0; r < group_size; ++r) {
    layout->send_counts.push_back(static_cast<int>(send_counts[r]));
    layout->send_displs.push_back(send_off);
    send_off += static_cast<int>(send_counts[r]);
    layout->recv_counts.push_back(static_cast<int>(recv_counts[r]));
    layout->recv_displs.push_back(recv_off);
    recv_off += static_cast<int>(recv_counts[r]);
  }
  Spec spec;
  spec.start = [=](MPI_Request* req) {
    return MPI_Ialltoallv(in, layout->send_counts.data(), layout->send_displs.data(), type, out,
                          layout->recv_counts.data(), layout->recv_displs.data(), type, comm, req);
  };
  return issue(std::move(info), timeout, std::move(spec));
}

WorkPtr MpiBackend::broadcast(void* buf, size_t count, DType dtype, int root, Duration timeout) {
  constexpr std::string_view what = "broadcast";
  check_common(OpType::kBroadcast, dtype, timeout, *this);
  check_rank(what, root, size(), "root");
  size_t bytes = checked_bytes(what, count, 1, dtype);
  check_buffer(what, buf, bytes, "buf");
  WorkInfo info = make_info(OpType::kBroadcast, dtype, {static_cast<int64_t>(count)}, root);
  if (size() == 1) return issue_local(std::move(info), [] {});
  MPI_Comm comm = comm_->handle();
  MPI_Datatype type = mpi_transfer_type(dtype);
  int n = static_cast<int>(count);
  Spec spec;
  spec.start = [=](MPI_Request* req) { return MPI_Ibcast(buf, n, type, root, comm, req); };
  return issue(std::move(info), timeout, std::move(spec));
}

WorkPtr MpiBackend::reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root,
                           Duration timeout) {
  constexpr std::string_view what = "reduce";
  check_common(OpType::kReduce, dtype, timeout, *this, op);
  check_rank(what, root, size(), "root");
  size_t bytes = checked_bytes(what, count, 1, dtype);
  const bool is_root = rank() == root;
  check_buffer(what, in, bytes, "in");
  if (is_root) check_buffer(what, out, bytes, "out");
  WorkInfo info = make_info(OpType::kReduce, dtype, {static_cast<int64_t>(count)}, root);
  if (size() == 1) {
    return issue_local(std::move(info), [=] {
      if (in != out && bytes) std::memcpy(out, in, bytes);
    });
  }
  MPI_Comm comm = comm_->handle();
  MPI_Op mop = mpi_reduce_op(op);
  int n = static_cast<int>(count), group_size = size();
  Spec spec;
  if (is_half(dtype)) {
    FloatBuf acc = to_f32(in, count, dtype);
    spec.start = [=](MPI_Request* req) {
      return is_root ? MPI_Ireduce(MPI_IN_PLACE, acc->data(), n, MPI_FLOAT, mop, root, comm, req)
                     : MPI_Ireduce(acc->data(), nullptr, n, MPI_FLOAT, mop, root, comm, req);
    };
    if (is_root) {
      spec.finish = [=](const MPI_Status&) {
        if (op == ReduceOp::kAvg) kernels::divide_inplace(acc->data(), count, DType::kF32, group_size);
        if (count) kernels::f32_to_half(acc->data(), out, count, dtype);
      };
    }
  } else {
    MPI_Datatype type = mpi_transfer_type(dtype);
    const void* send = is_root && in == out ? MPI_IN_PLACE : in;
    void* recv = is_root ? out : nullptr;
    spec.start = [=](MPI_Request* req) { return MPI_Ireduce(send, recv, n, type, mop, root, comm, req); };
    if (is_root && op == ReduceOp::kAvg) {
      spec.finish = [=](const MPI_Status&) { kernels::divide_inplace(out, count, dtype, group_size); };
    }
  }
  return issue(std::move(info), timeout, std::move(spec));
}

WorkPtr MpiBackend::barrier(Duration timeout) {
  check_common(OpType::kBarrier, DType::kF32, timeout, *this);
  WorkInfo info = make_info(OpType::kBarrier, DType::kF32, {});
  if (size() == 1) return issue_local(std::move(info), [] {});
  MPI_Comm comm = comm_->handle();
  Spec spec;
  spec.start = [=](MPI_Request* req) { return MPI_Ibarrier(comm, req); };
  return issue(std::move(info), timeout, std::move(spec));
}

// ---------------------------------------------------------------------------
// Point to point

WorkPtr MpiBackend::send(const void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) {
  constexpr std::string_view what = "send";
  check_common(OpType::kSend, dtype, timeout, *this);
  check_rank(what, peer, size(), "peer");
  TORUS_CHECK(tag >= 0 && tag <= runtime_->tag_ub(), InvalidArgument, "mpi send: tag {} is outside [0, {}]", tag,
              runtime_->tag_ub());
  size_t bytes = checked_bytes(what, count, 1, dtype);
  check_buffer(what, buf, bytes, "buf");
  MPI_Comm comm = comm_->handle();
  MPI_Datatype type = mpi_transfer_type(dtype);
  int n = static_cast<int>(count);
  Spec spec;
  spec.tag = tag;
  spec.start = [=](MPI_Request* req) { return MPI_Isend(buf, n, type, peer, tag, comm, req); };
  return issue(make_info(OpType::kSend, dtype, {static_cast<int64_t>(count)}, peer), timeout, std::move(spec));
}

WorkPtr MpiBackend::recv(void* buf, size_t count, DType dtype, int peer, int tag, Duration timeout) {
  constexpr std::string_view what = "recv";
  check_common(OpType::kRecv, dtype, timeout, *this);
  check_rank(what, peer, size(), "peer");
  TORUS_CHECK(tag >= 0 && tag <= runtime_->tag_ub(), InvalidArgument, "mpi recv: tag {} is outside [0, {}]", tag,
              runtime_->tag_ub());
  size_t bytes = checked_bytes(what, count, 1, dtype);
  check_buffer(what, buf, bytes, "buf");
  MPI_Comm comm = comm_->handle();
  MPI_Datatype type = mpi_transfer_type(dtype);
  int n = static_cast<int>(count);
  Spec spec;
  spec.tag = tag;
  spec.cancellable = true;
  spec.start = [=](MPI_Request* req) { return MPI_Irecv(buf, n, type, peer, tag, comm, req); };
  spec.finish = [=](const MPI_Status& status) {
    int got = 0;
    MPI_Status copy = status;
    TORUS_CHECK_MPI(MPI_Get_count(&copy, type, &got));
    TORUS_CHECK(got == n, CommError, "mpi recv: the message from peer {} with tag {} holds {} elements, expected {}",
                peer, tag, got, n);
  };
  return issue(make_info(OpType::kRecv, dtype, {static_cast<int64_t>(count)}, peer), timeout, std::move(spec));
}

// ---------------------------------------------------------------------------
// Group management

std::shared_ptr<Backend> MpiBackend::split(int color, int key, const std::string& name, Duration timeout) {
  TORUS_CHECK(timeout.count() > 0, InvalidArgument, "mpi split: timeout must be > 0 ms, got {}", timeout.count());
  TORUS_CHECK(!name.empty(), InvalidArgument, "mpi split: the new group needs a name");
  TORUS_CHECK(!runtime_->on_engine_thread(), InvalidArgument,
              "mpi split: called on the MPI progress thread (from a completion callback), where it would wait on "
              "itself");
  struct Result {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 0;
    std::vector<int> global_ranks;
  };
  auto result = std::make_shared<Result>();
  MPI_Comm parent = comm_->handle();
  std::weak_ptr<MpiComm> parent_state = comm_;
  Spec spec;
  spec.start = [=](MPI_Request* req) { return MPI_Ibarrier(parent, req); };
  spec.finish = [=](const MPI_Status&) {
    // Every rank has reached the split: the blocking MPI_Comm_split only
    // waits for ranks that are already on their way.
    try {
      TORUS_CHECK_MPI(MPI_Comm_split(parent, color < 0 ? MPI_UNDEFINED : color, key, &result->comm));
    } catch (const std::exception& e) {
      if (auto p = parent_state.lock()) p->mark_broken(e.what());
      throw;
    }
    if (result->comm == MPI_COMM_NULL) return;
    TORUS_CHECK_MPI(MPI_Comm_set_errhandler(result->comm, MPI_ERRORS_RETURN));
    TORUS_CHECK_MPI(MPI_Comm_rank(result->comm, &result->rank));
    TORUS_CHECK_MPI(MPI_Comm_size(result->comm, &result->size));
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    TORUS_CHECK_MPI(MPI_Comm_group(result->comm, &group));
    TORUS_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> local = iota_ranks(result->size);
    result->global_ranks.resize(local.size());
    int rc = MPI_Group_translate_ranks(group, result->size, local.data(), world, result->global_ranks.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    TORUS_CHECK_MPI(rc);
  };
  auto label = [&](uint64_t seq) {
    return fmt::format("split seq {} of group '{}' into '{}' (rank {}/{}, color {}, key {})", seq, group().name, name,
                       rank(), size(), color, key);
  };
  auto work = issue(make_info(OpType::kBarrier, DType::kF32, {}), timeout, std::move(spec), label);
  work->wait();
  if (result->comm == MPI_COMM_NULL) return nullptr;
  GroupInfo info{name, result->rank, result->size, std::move(result->global_ranks)};
  TORUS_LOG_DEBUG("mpi: split group '{}' into '{}': rank {}/{}, world ranks [{}]", group().name, info.name, info.rank,
                  info.size, fmt::join(info.global_ranks, ", "));
  return std::make_shared<MpiBackend>(runtime_, std::make_shared<MpiComm>(result->comm, std::move(info), true));
}

void MpiBackend::abort(const std::string& reason) {
  comm_->mark_broken(fmt::format("aborted: {}", reason));
  runtime_->fail_comm_ops(comm_, fmt::format("group '{}' was aborted: {}", group().name, reason));
}

}  // namespace mpi

// ---------------------------------------------------------------------------
// The world backend

BackendPtr create_mpi_world_backend(const BackendInit& init) {
  auto runtime = mpi::MpiRuntime::acquire();
  const int rank = runtime->world_rank(), size = runtime->world_size();
  if (init.launch) {
    TORUS_CHECK(init.launch->rank == rank && init.launch->world_size == size, InvalidArgument,
                "mpi: the launch information (source '{}') says rank {} of {}, but MPI_COMM_WORLD has this process "
                "as rank {} of {}; the job must be launched by one mpirun that matches it",
                init.launch->source, init.launch->rank, init.launch->world_size, rank, size);
  }
  Duration timeout = init.timeout.count() > 0 ? init.timeout : mpi::kDefaultSetupTimeout;
  auto world =
      std::make_shared<mpi::MpiComm>(MPI_COMM_WORLD, GroupInfo{"MPI_COMM_WORLD", rank, size, mpi::iota_ranks(size)},
                                     /*owned=*/false);
  auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  runtime->run_blocking(
      world, fmt::format("creating the world group (MPI_Comm_idup of MPI_COMM_WORLD, rank {}/{})", rank, size), timeout,
      [dup](MPI_Request* req) { return MPI_Comm_idup(MPI_COMM_WORLD, dup.get(), req); },
      [dup](const MPI_Status&) { TORUS_CHECK_MPI(MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN)); });
  TORUS_LOG_DEBUG("mpi: world group ready (rank {}/{})", rank, size);
  auto comm = std::make_shared<mpi::MpiComm>(*dup, GroupInfo{"world", rank, size, mpi::iota_ranks(size)},
                                             /*owned=*/true);
  return std::make_shared<mpi::MpiBackend>(std::move(runtime), std::move(comm));
}

// Note [Backend registration]: mpi is a host backend that serves a job
// launched by mpirun (or a single process, which MPI sees alone), and
// mpirun's runtime is the bootstrap's channel before the store exists.
void register_mpi_backend(BackendRegistry& registry) {
  BackendFactory f;
  f.name = "mpi";
  f.role = BackendRole::kHost;
  f.preference = 10;
  f.usability = [](const BackendInit& init) {
    if (init.launch != nullptr && !init.launch->launched_by_mpi && init.launch->world_size > 1) {
      return Usability{false, "not launched by mpirun"};
    }
    return Usability{true, "Open MPI"};
  };
  f.create = create_mpi_world_backend;
  registry.add(std::move(f));
  registry.add_channel("mpi", LauncherChannel{mpi_runtime_hold, [](const std::string& value, Duration timeout) {
                                                return mpi_bootstrap_broadcast(value, timeout);
                                              }});
}

}  // namespace torus::comm
