// The `neuron` comm backend (contracts in neuron_backend.h): argument
// checks, the mapping of device pointers to runtime tensor slices, the
// runtime's prepare/schedule calls, and completion through the shared
// watchdog policy.
#include "comm/neuron/neuron_backend.h"
#include "comm/work_info.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>

#include "comm/backend_registry.h"
#include "comm/nccl/watchdog.h"
#include "core/log.h"
#include "device/neuron/neuron_device.h"
#include "device/neuron/neuron_memory.h"
#include "device/neuron/nrt_api.h"

namespace torus::comm {
namespace {

using device::neuron::NeuronMemory;
using device::neuron::NrtApi;
using device::neuron::NrtLibrary;
namespace nrt = device::neuron;
using Clock = nccl::Clock;

int nrt_dtype(DType t) {
  switch (t) {
    case DType::kF32: return nrt::NRT_DTYPE_FLOAT32;
    case DType::kF16: return nrt::NRT_DTYPE_FLOAT16;
    case DType::kBF16: return nrt::NRT_DTYPE_BFLOAT16;
    case DType::kI32: return nrt::NRT_DTYPE_INT32;
    case DType::kI64: return nrt::NRT_DTYPE_INT64;
    case DType::kU8: return nrt::NRT_DTYPE_UINT8;
    case DType::kF64: return -1;
  }
  return -1;
}

int nrt_reduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return nrt::NRT_OP_ADD;
    case ReduceOp::kMax: return nrt::NRT_OP_MAX;
    case ReduceOp::kMin: return nrt::NRT_OP_MIN;
    default: return -1;
  }
}

bool is_reduction(OpType op) {
  return op == OpType::kAllReduce || op == OpType::kReduceScatter || op == OpType::kReduce;
}

// A runtime tensor covering exactly [ptr, ptr + bytes): the allocation's own
// tensor when it matches, else a slice (freed with this object, unless
// leaked on failure: neuron_backend.h).
class TensorRef {
 public:
  TensorRef(const NrtApi& api, const void* ptr, size_t bytes, const char* what) : api_(api) {
    auto r = NeuronMemory::get().resolve(ptr, bytes, what);
    if (r.offset == 0 && api.nrt_tensor_get_size(r.tensor) == bytes) {
      tensor_ = r.tensor;
      return;
    }
    TORUS_CHECK(api.nrt_tensor_allocate_slice != nullptr, Unsupported,
                "{}: the Neuron runtime lacks nrt_tensor_allocate_slice, so a collective must cover whole "
                "allocations (offset {} size {} of a {}-byte tensor)",
                what, r.offset, bytes, api.nrt_tensor_get_size(r.tensor));
    TORUS_CHECK_NRT(api.nrt_tensor_allocate_slice(r.tensor, r.offset, bytes, "torus-cc", &slice_));
    tensor_ = slice_;
  }
  ~TensorRef() {
    if (slice_ != nullptr && !leak_) api_.nrt_tensor_free(&slice_);
  }
  TensorRef(const TensorRef&) = delete;
  TensorRef& operator=(const TensorRef&) = delete;
  nrt::nrt_tensor* tensor() const { return tensor_; }
  void leak() { leak_ = true; }

 private:
  const NrtApi& api_;
  nrt::nrt_tensor* tensor_ = nullptr;
  nrt::nrt_tensor* slice_ = nullptr;
  bool leak_ = false;
};

// What one scheduled op keeps alive until it completes.
struct Pending {
  std::unique_ptr<TensorRef> in, out;
  std::vector<uint32_t> replica_group;
  nrt::nrt_cc_comm_t comm{};
  nrt::nrt_tensor* in_list_tensor = nullptr;
  nrt::nrt_tensor* out_list_tensor = nullptr;
  nrt::nrt_tensor_list_t in_list{}, out_list{};
  nrt::NRT_STATUS status = nrt::NRT_SUCCESS;  // written by the runtime at completion
  nrt::nrta_seq_t seq = 0;
};

// Per process: the runtime's global communicator and this rank's core.
struct NeuronWorld {
  const NrtLibrary* lib = nullptr;
  int rank = 0;
  int size = 1;
  int core = 0;
  std::mutex issue_mu;  // prepare + schedule of one op at a time: ops keep issue order
};

class NeuronBackend final : public Backend, public std::enable_shared_from_this<NeuronBackend> {
 public:
  NeuronBackend(std::shared_ptr<NeuronWorld> world, GroupInfo group)
      : world_(std::move(world)), group_(std::move(group)) {
    nccl::WatchdogHooks hooks;
    hooks.async_error = [] { return std::string(); };
    // The runtime has no abort for a scheduled collective (neuron_backend.h).
    hooks.abort = [name = group_.name](const std::string& reason) {
      TORUS_LOG_WARN("neuron: group '{}' is broken ({}); its scheduled collectives cannot be cancelled", name,
                     reason);
    };
    watchdog_ = std::make_unique<nccl::Watchdog>(
        std::move(hooks), nccl::Watchdog::Options{group_.name, group_.rank, std::chrono::milliseconds(1), true});
    scratch_ = device::DeviceBuffer(DeviceType::kNeuron, 2 * sizeof(int64_t) * static_cast<size_t>(group_.size));
  }
  ~NeuronBackend() override {
    if (!watchdog_->drain(std::chrono::seconds(5))) {
      watchdog_->abort("the backend was destroyed with ops in flight");
    }
  }

  std::string_view name() const override { return "neuron"; }
  DeviceType device_type() const override { return DeviceType::kNeuron; }
  const GroupInfo& group() const override { return group_; }

  bool supports(OpType op, DType dtype, ReduceOp reduce) const override {
    bool op_ok = op == OpType::kAllReduce || op == OpType::kReduceScatter || op == OpType::kAllGather ||
                 op == OpType::kBarrier;
    return op_ok && nrt_dtype(dtype) >= 0 && (!is_reduction(op) || nrt_reduce(reduce) >= 0);
  }

  WorkPtr all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, Duration timeout) override {
    check(OpType::kAllReduce, dtype, op, timeout);
    size_t bytes = checked_bytes("all_reduce", count, 1, dtype);
    return collective(OpType::kAllReduce, in, bytes, out, bytes, dtype, op, timeout, {static_cast<int64_t>(count)});
  }

  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                         Duration timeout) override {
    check(OpType::kReduceScatter, dtype, op, timeout);
    size_t out_bytes = checked_bytes("reduce_scatter", count, 1, dtype);
    size_t in_bytes = checked_bytes("reduce_scatter", count, static_cast<size_t>(size()), dtype);
    return collective(OpType::kReduceScatter, in, in_bytes, out, out_bytes, dtype, op, timeout,
                      {static_cast<int64_t>(count) * size(), static_cast<int64_t>(count)});
  }

  WorkPtr all_gather(const void* in, void* out, size_t count, DType dtype, Duration timeout) override {
    check(OpType::kAllGather, dtype, ReduceOp::kSum, timeout);
    size_t in_bytes = checked_bytes("all_gather", count, 1, dtype);
    size_t out_bytes = checked_bytes("all_gather", count, static_cast<size_t>(size()), dtype);
    return collective(OpType::kAllGather, in, in_bytes, out, out_bytes, dtype, ReduceOp::kSum, timeout,
                      {static_cast<int64_t>(count), static_cast<int64_t>(count) * size()});
  }

  WorkPtr all_to_all(const void*, void*, std::span<const size_t>, std::span<const size_t>, DType dtype,
                     Duration timeout) override {
    refuse(OpType::kAllToAll, "all-to-all exists only inside compiled NEFF programs");
  }
  WorkPtr broadcast(void*, size_t, DType, int, Duration) override {
    refuse(OpType::kBroadcast, "the runtime has no host-driven broadcast");
  }
  WorkPtr reduce(const void*, void*, size_t, DType, ReduceOp, int, Duration) override {
    refuse(OpType::kReduce, "the runtime has no host-driven rooted reduce (use all_reduce)");
  }
  WorkPtr send(const void*, size_t, DType, int, int, Duration) override {
    refuse(OpType::kSend, "point-to-point (nrt_async_sendrecv_*) is not wired into this backend yet");
  }
  WorkPtr recv(void*, size_t, DType, int, int, Duration) override {
    refuse(OpType::kRecv, "point-to-point (nrt_async_sendrecv_*) is not wired into this backend yet");
  }

  WorkPtr barrier(Duration timeout) override {
    TORUS_CHECK(timeout.count() > 0, InvalidArgument, "neuron barrier: timeout must be > 0 ms, got {}",
                timeout.count());
    // A one-element sum over the scratch buffer.
    void* p = scratch_.data();
    return collective(OpType::kBarrier, p, sizeof(float), p, sizeof(float), DType::kF32, ReduceOp::kSum, timeout,
                      {1});
  }

  std::shared_ptr<Backend> split(int color, int key, const std::string& name, Duration timeout) override {
    TORUS_CHECK(timeout.count() > 0, InvalidArgument, "neuron split: timeout must be > 0 ms");
    TORUS_CHECK(!name.empty(), InvalidArgument, "neuron split: the new group needs a name");
    TORUS_CHECK(!watchdog_->on_watchdog_thread(), InvalidArgument,
                "neuron split: cannot run on the watchdog thread (from a completion callback)");
    const size_t n = static_cast<size_t>(size());
    device::Device& dev = device::get_device(DeviceType::kNeuron);
    int64_t mine[2] = {color, key};
    auto* base = scratch_.as<int64_t>();
    int64_t* slot = base + 2 * static_cast<size_t>(rank());
    dev.copy(slot, mine, sizeof(mine));
    all_gather(slot, base, 2, DType::kI64, timeout)->wait();
    std::vector<int64_t> all(2 * n);
    dev.copy(all.data(), base, all.size() * sizeof(int64_t));
    if (color < 0) return nullptr;
    std::vector<int> members;
    for (size_t r = 0; r < n; ++r) {
      if (all[2 * r] == color) members.push_back(static_cast<int>(r));
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return std::make_pair(all[2 * static_cast<size_t>(a) + 1], a) < std::make_pair(all[2 * static_cast<size_t>(b) + 1], b);
    });
    GroupInfo g;
    g.name = name;
    g.size = static_cast<int>(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      g.global_ranks.push_back(group_.global_ranks[static_cast<size_t>(members[i])]);
      if (members[i] == rank()) g.rank = static_cast<int>(i);
    }
    return std::make_shared<NeuronBackend>(world_, std::move(g));
  }

  void abort(const std::string& reason) override { watchdog_->abort(reason); }

 private:
  [[noreturn]] void refuse(OpType op, const char* why) const {
    throw Unsupported(fmt::format("neuron {}: not supported by Neuron runtime {}: {} (host-driven collectives: "
                                  "all_reduce, reduce_scatter, all_gather)",
                                  op_type_name(op), world_->lib->version_string(), why));
  }

  void check(OpType op, DType dtype, ReduceOp reduce, Duration timeout) const {
    std::string_view what = op_type_name(op);
    TORUS_CHECK(timeout.count() > 0, InvalidArgument, "neuron {}: timeout must be > 0 ms, got {}", what,
                timeout.count());
    TORUS_CHECK(nrt_dtype(dtype) >= 0, Unsupported,
                "neuron {}: dtype {} is not supported by Neuron runtime {} (f32, f16, bf16, i32, i64, u8)", what,
                dtype_name(dtype), world_->lib->version_string());
    TORUS_CHECK(!is_reduction(op) || nrt_reduce(reduce) >= 0, Unsupported,
                "neuron {}: reduce op {} is not supported by Neuron runtime {} (sum, max, min)", what,
                reduce_op_name(reduce), world_->lib->version_string());
  }

  static size_t checked_bytes(std::string_view what, size_t count, size_t blocks, DType dtype) {
    size_t elt = dtype_size(dtype);
    TORUS_CHECK(blocks == 0 || count <= SIZE_MAX / elt / blocks, InvalidArgument,
                "neuron {}: {} x {} elements of {} overflow the address space", what, count, blocks, dtype_name(dtype));
    return count * blocks * elt;
  }

  WorkInfo make_info(OpType op, DType dtype, std::vector<int64_t> sizes) {
    return make_work_info(group_, op, dtype, std::move(sizes), -1, ++seq_);
  }

  WorkPtr failed(WorkInfo info, std::exception_ptr e) {
    auto w = std::make_shared<Work>(std::move(info));
    w->mark_failed(std::move(e));
    return w;
  }

  WorkPtr collective(OpType op, const void* in, size_t in_bytes, void* out, size_t out_bytes, DType dtype,
                     ReduceOp reduce, Duration timeout, std::vector<int64_t> sizes) {
    std::string_view what = op_type_name(op);
    NeuronMemory& mem = NeuronMemory::get();
    // Argument checks, before anything is issued.
    if (in_bytes != 0) {
      TORUS_CHECK(mem.is_device_address(in), InvalidArgument,
                  "neuron {}: the input {} is not Neuron device memory (allocate it on the Neuron device)", what, in);
      mem.resolve(in, in_bytes, "neuron collective input");
    }
    if (out_bytes != 0) {
      TORUS_CHECK(mem.is_device_address(out), InvalidArgument,
                  "neuron {}: the output {} is not Neuron device memory (allocate it on the Neuron device)", what,
                  out);
      mem.resolve(out, out_bytes, "neuron collective output");
    }
    std::lock_guard<std::mutex> lock(world_->issue_mu);
    WorkInfo info = make_info(op, dtype, std::move(sizes));
    // An op the runtime failed breaks the group (its peers cannot know how
    // far it got); the watchdog is told here, on the issuing thread, since
    // completions run on its own thread.
    if (std::string reason = failure_->get(); !reason.empty()) watchdog_->abort(reason);
    if (watchdog_->broken()) {
      std::string message =
          fmt::format("{}: group '{}' is broken ({})", info.describe(), group_.name, watchdog_->broken_reason());
      return failed(std::move(info), std::make_exception_ptr(CommError(message)));
    }
    if (in_bytes == 0 && out_bytes == 0) return make_completed_work(std::move(info));
    device::Device& dev = device::get_device(DeviceType::kNeuron);
    if (group_.size == 1) {
      if (in != out) dev.copy(out, in, std::min(in_bytes, out_bytes));
      return make_completed_work(std::move(info));
    }
    const NrtApi& api = world_->lib->api();
    auto p = std::make_shared<Pending>();
    p->in = std::make_unique<TensorRef>(api, in, in_bytes, "neuron collective input");
    p->out = std::make_unique<TensorRef>(api, out, out_bytes, "neuron collective output");
    p->replica_group.assign(group_.global_ranks.begin(), group_.global_ranks.end());
    p->comm.replica_group = p->replica_group.data();
    p->comm.rank = static_cast<uint32_t>(group_.rank);
    p->comm.rank_n = static_cast<uint32_t>(group_.size);
    p->comm.ctx_device_id = static_cast<uint32_t>(world_->rank);
    p->comm.ctx_device_count = static_cast<uint32_t>(world_->size);
    p->comm.vnc = static_cast<uint32_t>(world_->core);
    p->in_list_tensor = p->in->tensor();
    p->out_list_tensor = p->out->tensor();
    p->in_list = {&p->in_list_tensor, 1};
    p->out_list = {&p->out_list_tensor, 1};
    int cc_op = op == OpType::kAllGather       ? nrt::NRT_CC_ALLGATHER
                : op == OpType::kReduceScatter ? nrt::NRT_CC_REDUCESCATTER
                                               : nrt::NRT_CC_ALLREDUCE;
    auto work = std::make_shared<Work>(info);
    nrt::nrt_cc_context* ctx = nullptr;
    nrt::NRT_STATUS s = api.nrta_cc_prepare(&p->comm, &p->in_list, &p->out_list, nrt_dtype(dtype),
                                            nrt_reduce(reduce) >= 0 ? nrt_reduce(reduce) : nrt::NRT_OP_ADD, cc_op,
                                            &ctx);
    if (s == nrt::NRT_SUCCESS) s = api.nrta_cc_schedule(&ctx, 0, &p->status, &p->seq);
    if (s != nrt::NRT_SUCCESS) {
      // Peers may have scheduled theirs: the group cannot continue.
      std::string reason = fmt::format("{}: scheduling it on the Neuron runtime failed: {}", info.describe(),
                                       nrt::status_name(s));
      watchdog_->abort(reason);
      return failed(std::move(info), std::make_exception_ptr(CommError(reason)));
    }
    // A failed status turns the completion into CommError; a failed or timed
    // out op keeps its slices (the runtime may still touch them).
    work->on_complete([p, failure = failure_, desc = info.describe()](std::exception_ptr e) {
      if (e) {
        p->in->leak();
        p->out->leak();
        static std::mutex leaked_mu;
        static std::vector<std::shared_ptr<Pending>> leaked;
        std::lock_guard<std::mutex> l(leaked_mu);
        leaked.push_back(p);
        return;
      }
      if (p->status != nrt::NRT_SUCCESS) {
        std::string reason = fmt::format("{}: the Neuron runtime reported {}", desc, nrt::status_name(p->status));
        failure->set(reason);
        throw CommError(reason);
      }
    });
    work->keep_alive(p);
    const nrt::NrtApi* a = &api;
    watchdog_->track(
        work,
        [a, seq = p->seq] {
          bool done = false;
          return a->nrta_is_completed(seq, &done) == nrt::NRT_SUCCESS && done;
        },
        Clock::now() + timeout);
    return work;
  }

  // The first runtime failure of an op of this group ("" while none).
  struct Failure {
    std::mutex mu;
    std::string reason;
    void set(const std::string& r) {
      std::lock_guard<std::mutex> l(mu);
      if (reason.empty()) reason = r;
    }
    std::string get() {
      std::lock_guard<std::mutex> l(mu);
      return reason;
    }
  };

  std::shared_ptr<NeuronWorld> world_;
  GroupInfo group_;
  std::shared_ptr<Failure> failure_ = std::make_shared<Failure>();
  std::unique_ptr<nccl::Watchdog> watchdog_;
  device::DeviceBuffer scratch_;
  uint64_t seq_ = 0;
};

}  // namespace

BackendPtr create_neuron_world_backend(const BackendInit& init) {
  TORUS_CHECK(init.launch != nullptr, InvalidArgument, "neuron world backend: the launch information is required");
  const LaunchInfo& l = *init.launch;
  const NrtLibrary& lib = NrtLibrary::require("the neuron comm backend");
  TORUS_CHECK(lib.api().has_collectives() && lib.version().rt_minor >= nrt::kMinCollectivesMinor, Unsupported,
              "neuron comm backend: Neuron runtime {} ('{}') does not offer host-driven collectives with the 3.0 "
              "asynchronous API (runtime 2.{} or later)",
              lib.version_string(), lib.path(), nrt::kMinCollectivesMinor);
  TORUS_CHECK(l.local_size <= lib.visible_cores(), InvalidArgument,
              "neuron comm backend: {} ranks on this host but {} NeuronCore(s) visible: each rank needs its own "
              "NeuronCore (NEURON_RT_VISIBLE_CORES, or fewer ranks per host)",
              l.local_size, lib.visible_cores());
  auto world = std::make_shared<NeuronWorld>();
  world->lib = &lib;
  world->rank = l.rank;
  world->size = l.world_size;
  world->core = device::select_device_for_local_rank(l.local_rank, l.local_size);
  TORUS_CHECK_NRT(lib.api().nrt_cc_global_comm_init(static_cast<uint32_t>(world->core),
                                                    static_cast<uint32_t>(l.rank),
                                                    static_cast<uint32_t>(l.world_size)));
  GroupInfo g;
  g.name = "world";
  g.rank = l.rank;
  g.size = l.world_size;
  g.global_ranks.resize(static_cast<size_t>(l.world_size));
  std::iota(g.global_ranks.begin(), g.global_ranks.end(), 0);
  TORUS_LOG_DEBUG("neuron comm backend: rank {} of {} on NeuronCore {} (Neuron runtime {})", l.rank, l.world_size,
                  world->core, lib.version_string());
  return std::make_shared<NeuronBackend>(std::move(world), std::move(g));
}

// Note [Backend registration]: the Neuron runtime's collectives, on Neuron
// device memory, made by name only.
void register_neuron_backend(BackendRegistry& registry) {
  BackendFactory f;
  f.name = "neuron";
  f.role = BackendRole::kNamed;
  f.memory = DeviceType::kNeuron;
  f.create = create_neuron_world_backend;
  registry.add(std::move(f));
}

}  // namespace torus::comm
