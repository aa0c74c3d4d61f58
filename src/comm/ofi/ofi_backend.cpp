// The ofi Backend: argument checks, op issue, split, and world creation
// (ofi_backend.h). Algorithms live in group_ops.cpp, algo_*.cpp and
// host_collectives.cpp (with host_one_round.cpp, host_zero_copy.cpp and
// host_stripes.cpp); progress in engine.cpp.
#include "comm/ofi/ofi_backend.h"
#include "comm/work_info.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>

#include "comm/backend_registry.h"
#include "comm/ofi/ofi_group.h"
#include "comm/ofi/spin.h"
#include "core/log.h"
#include "kernels/cpu/reduce.h"
#include "torus/core/params.h"
#include "torus/device/device.h"

namespace torus::comm::ofi {
namespace {

class OfiBackend final : public Backend {
 public:
  OfiBackend(std::shared_ptr<World> world, GroupInfo info, uint32_t context, uint64_t instance)
      : world_(std::move(world)),
        info_(std::move(info)),
        context_(context),
        instance_(instance),
        inline_spin_(std::chrono::microseconds(world_->options.inline_spin_us)) {
    TORUS_CHECK(info_.size <= kMaxGroupSize, Unsupported, "ofi: group '{}' has {} ranks; at most {} are supported",
                info_.name, info_.size, kMaxGroupSize);
    topo_ = make_topology(*world_, context_, instance_, info_.global_ranks, info_.rank);
    state_ = std::make_shared<GroupState>();
    state_->context = context_;
    state_->name = info_.name;
    state_->rank = info_.rank;
    state_->member_addr = topo_->full.addr;
    state_->member_world = info_.global_ranks;
    std::weak_ptr<Topology> weak = topo_;
    int world_rank = world_->rank;
    state_->on_announce = [weak, world_rank](const std::string& reason) {
      if (auto t = weak.lock(); t && t->segment) t->segment->mark_aborted(world_rank, reason);
    };
    world_->engine->add_group(state_);
    // Device buffers (Note [Device buffers]) always go through the engine.
    if (inline_spin_.count() > 0 && topo_->segment && topo_->single_host() && world_->device == nullptr) {
      one_round_max_bytes_ = host_inline_max_bytes(&topo_->host);
      inline_max_bytes_ = world_->options.inline_max_bytes;
      inline_ops_ = true;
    }
  }

  ~OfiBackend() override {
    world_->engine->remove_group(state_.get());
    // Note [Recycled contexts] (ofi_group.h). The world's context 0 is never
    // released; a broken group's may still have traffic in flight.
    if (context_ != 0 && !state_->broken()) {
      std::lock_guard<std::mutex> lock(world_->released_mu);
      world_->released.push_back({context_, instance_, info_.size});
    }
  }

  std::string_view name() const override { return "ofi"; }
  DeviceType device_type() const override {
    return world_->device != nullptr ? world_->device->type() : DeviceType::kCPU;
  }
  const GroupInfo& group() const override { return info_; }
  bool supports(OpType, DType, ReduceOp) const override { return true; }

  WorkPtr all_reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, Duration timeout) override {
    check_buffers(in, out, count);
    const size_t ar_bytes = check_bytes(count, dt, 1, "all_reduce");
    if (device::Device* d = world_->device) {
      check_device(in, ar_bytes, "all_reduce", "input");
      check_device(out, ar_bytes, "all_reduce", "output");
      return issue(OpType::kAllReduce, dt, {static_cast<int64_t>(count)}, -1, timeout, true, ar_bytes,
                   [=](OpCtx& c, Topology* t, uint64_t seq) {
                     return device_all_reduce(c, t, d, in, out, count, dt, op, seq);
                   });
    }
    if (count > 0 && count * dtype_size(dt) <= one_round_max_bytes_ && timeout.count() > 0) {
      if (WorkPtr w = inline_all_reduce(in, out, count, dt, op, timeout)) return w;
    }
    return issue(OpType::kAllReduce, dt, {static_cast<int64_t>(count)}, -1, timeout, true, count * dtype_size(dt),
                 [=](OpCtx& c, Topology* t, uint64_t seq) {
                   return group_all_reduce(c, t, in, out, count, dt, op, seq);
                 });
  }

  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op, Duration timeout) override {
    check_buffers(in, out, count);
    const size_t rs_bytes = check_bytes(count, dt, static_cast<size_t>(size()), "reduce_scatter");
    if (device::Device* d = world_->device) {
      check_device(in, rs_bytes, "reduce_scatter", "input");
      check_device(out, rs_bytes / static_cast<size_t>(size()), "reduce_scatter", "output");
      return issue(OpType::kReduceScatter, dt, {static_cast<int64_t>(count) * size(), static_cast<int64_t>(count)},
                   -1, timeout, true, rs_bytes, [=](OpCtx& c, Topology* t, uint64_t seq) {
                     return device_reduce_scatter(c, t, d, in, out, count, dt, op, seq);
                   });
    }
    return issue(OpType::kReduceScatter, dt, {static_cast<int64_t>(count) * size(), static_cast<int64_t>(count)}, -1,
                 timeout, true, count * dtype_size(dt) * static_cast<size_t>(size()),
                 [=](OpCtx& c, Topology* t, uint64_t seq) {
                   return group_reduce_scatter(c, t, in, out, count, dt, op, seq);
                 });
  }

  WorkPtr all_gather(const void* in, void* out, size_t count, DType dt, Duration timeout) override {
    check_buffers(in, out, count);
    const size_t ag_bytes = check_bytes(count, dt, static_cast<size_t>(size()), "all_gather");
    if (device::Device* d = world_->device) {
      check_device(in, ag_bytes / static_cast<size_t>(size()), "all_gather", "input");
      check_device(out, ag_bytes, "all_gather", "output");
      return issue(OpType::kAllGather, dt, {static_cast<int64_t>(count), static_cast<int64_t>(count) * size()}, -1,
                   timeout, true, ag_bytes, [=](OpCtx& c, Topology* t, uint64_t seq) {
                     return device_all_gather(c, t, d, in, out, count, dt, seq);
                   });
    }
    return issue(OpType::kAllGather, dt, {static_cast<int64_t>(count), static_cast<int64_t>(count) * size()}, -1,
                 timeout, true, count * dtype_size(dt) * static_cast<size_t>(size()),
                 [=](OpCtx& c, Topology* t, uint64_t seq) {
                   return group_all_gather(c, t, in, out, count, dt, seq);
                 });
  }

  WorkPtr all_to_all(const void* in, void* out, std::span<const size_t> send_counts,
                     std::span<const size_t> recv_counts, DType dt, Duration timeout) override {
    const size_t n = static_cast<size_t>(size());
    TORUS_CHECK(send_counts.size() == n && recv_counts.size() == n, InvalidArgument,
                "ofi all_to_all on group '{}': {} send and {} recv counts for {} ranks", info_.name,
                send_counts.size(), recv_counts.size(), n);
    std::vector<size_t> sc(send_counts.begin(), send_counts.end()), rc(recv_counts.begin(), recv_counts.end());
    const size_t me = static_cast<size_t>(rank());
    TORUS_CHECK(sc[me] == rc[me], InvalidArgument,
                "ofi all_to_all on group '{}': rank {} sends {} elements to itself but receives {}", info_.name, me,
                sc[me], rc[me]);
    size_t sum_s = 0, sum_r = 0;
    for (size_t i = 0; i < n; ++i) {
      TORUS_CHECK(!__builtin_add_overflow(sum_s, sc[i], &sum_s) && !__builtin_add_overflow(sum_r, rc[i], &sum_r),
                  InvalidArgument, "ofi all_to_all on group '{}': the counts overflow", info_.name);
    }
    check_bytes(std::max(sum_s, sum_r), dt, 1, "all_to_all");
    const int64_t total_s = static_cast<int64_t>(sum_s), total_r = static_cast<int64_t>(sum_r);
    TORUS_CHECK(total_s == 0 || total_r == 0 || in != out, InvalidArgument,
                "ofi all_to_all on group '{}': in must not alias out", info_.name);
    check_buffers(in, in, sum_s);
    check_buffers(out, out, sum_r);
    if (device::Device* d = world_->device) {
      check_device(in, sum_s * dtype_size(dt), "all_to_all", "input");
      check_device(out, sum_r * dtype_size(dt), "all_to_all", "output");
      return issue(OpType::kAllToAll, dt, {total_s, total_r}, -1, timeout, true,
                   std::max(sum_s, sum_r) * dtype_size(dt), [=](OpCtx& c, Topology* t, uint64_t seq) {
                     return device_all_to_all(c, t, d, in, out, sc, rc, dt, seq);
                   });
    }
    return issue(OpType::kAllToAll, dt, {total_s, total_r}, -1, timeout, true,
                 std::max(sum_s, sum_r) * dtype_size(dt), [=](OpCtx& c, Topology* t, uint64_t seq) {
                   return group_all_to_all(c, t, in, out, sc, rc, dt, seq);
                 });
  }

  WorkPtr broadcast(void* buf, size_t count, DType dt, int root, Duration timeout) override {
    check_rank(root, "root");
    check_buffers(buf, buf, count);
    const size_t bc_bytes = check_bytes(count, dt, 1, "broadcast");
    if (device::Device* d = world_->device) {
      check_device(buf, bc_bytes, "broadcast", "buffer");
      return issue(OpType::kBroadcast, dt, {static_cast<int64_t>(count)}, root, timeout, true, bc_bytes,
                   [=](OpCtx& c, Topology* t, uint64_t seq) {
                     return device_broadcast(c, t, d, buf, count, dt, root, seq);
                   });
    }
    if (count > 0 && count * dtype_size(dt) <= one_round_max_bytes_ && timeout.count() > 0) {
      if (WorkPtr w = inline_broadcast(buf, count, dt, root, timeout)) return w;
    }
    return issue(OpType::kBroadcast, dt, {static_cast<int64_t>(count)}, root, timeout, true, count * dtype_size(dt),
                 [=](OpCtx& c, Topology* t, uint64_t seq) {
                   return group_broadcast(c, t, buf, count, dt, root, seq);
                 });
  }

  WorkPtr reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, int root,
                 Duration timeout) override {
    check_rank(root, "root");
    check_buffers(in, rank() == root ? out : in, count);
    const size_t rd_bytes = check_bytes(count, dt, 1, "reduce");
    if (device::Device* d = world_->device) {
      check_device(in, rd_bytes, "reduce", "input");
      if (rank() == root) check_device(out, rd_bytes, "reduce", "output");
      return issue(OpType::kReduce, dt, {static_cast<int64_t>(count)}, root, timeout, true, rd_bytes,
                   [=](OpCtx& c, Topology* t, uint64_t seq) {
                     return device_reduce(c, t, d, in, out, count, dt, op, root, seq);
                   });
    }
    return issue(OpType::kReduce, dt, {static_cast<int64_t>(count)}, root, timeout, true, count * dtype_size(dt),
                 [=](OpCtx& c, Topology* t, uint64_t seq) {
                   return group_reduce(c, t, in, out, count, dt, op, root, seq);
                 });
  }

  WorkPtr send(const void* buf, size_t count, DType dt, int peer, int tag, Duration timeout) override {
    check_rank(peer, "peer");
    check_tag(tag);
    check_buffers(buf, buf, count);
    const size_t bytes = check_bytes(count, dt, 1, "send");
    if (device::Device* d = world_->device) {
      const device::NicAddress a = check_device(buf, bytes, "send", "buffer");
      void* nic = world_->device_zero_copy ? a.address : nullptr;
      const MemoryKind kind = world_->device_kind;
      return issue(OpType::kSend, dt, {static_cast<int64_t>(count)}, peer, timeout, false, bytes,
                   [=](OpCtx& c, Topology* t, uint64_t) {
                     return device_send(c, t, d, kind, buf, nic, a.device, bytes, peer, tag);
                   });
    }
    return issue(OpType::kSend, dt, {static_cast<int64_t>(count)}, peer, timeout, false, bytes,
                 [=](OpCtx& c, Topology* t, uint64_t) { return algo::send(c, &t->p2p, peer, buf, bytes, tag); });
  }

  WorkPtr recv(void* buf, size_t count, DType dt, int peer, int tag, Duration timeout) override {
    check_rank(peer, "peer");
    check_tag(tag);
    check_buffers(buf, buf, count);
    const size_t bytes = check_bytes(count, dt, 1, "recv");
    if (device::Device* d = world_->device) {
      const device::NicAddress a = check_device(buf, bytes, "recv", "buffer");
      void* nic = world_->device_zero_copy ? a.address : nullptr;
      const MemoryKind kind = world_->device_kind;
      return issue(OpType::kRecv, dt, {static_cast<int64_t>(count)}, peer, timeout, false, bytes,
                   [=](OpCtx& c, Topology* t, uint64_t) {
                     return device_recv(c, t, d, kind, buf, nic, a.device, bytes, peer, tag);
                   });
    }
    return issue(OpType::kRecv, dt, {static_cast<int64_t>(count)}, peer, timeout, false, bytes,
                 [=](OpCtx& c, Topology* t, uint64_t) { return algo::recv(c, &t->p2p, peer, buf, bytes, tag); });
  }

  WorkPtr barrier(Duration timeout) override {
    return issue(OpType::kBarrier, DType::kU8, {}, -1, timeout, true, 0,
                 [](OpCtx& c, Topology* t, uint64_t seq) { return group_barrier(c, t, seq); });
  }

  std::shared_ptr<Backend> split(int color, int key, const std::string& name, Duration timeout) override;

  void abort(const std::string& reason) override {
    world_->engine->break_group(state_, fmt::format("abort() on world rank {}: {}", world_->rank, reason), false);
  }

 private:
  // `bytes`: the most data the op moves per rank (the inline limit applies).
  template <typename Make>
  WorkPtr issue(OpType type, DType dt, std::vector<int64_t> sizes, int peer, Duration timeout, bool collective,
                size_t bytes, Make make) {
    TORUS_CHECK(timeout.count() > 0, InvalidArgument, "ofi {} on group '{}': timeout must be > 0, got {} ms",
                op_type_name(type), info_.name, timeout.count());
    std::lock_guard<std::mutex> lock(issue_mu_);
    return submit_locked(next_info(type, dt, std::move(sizes), peer, collective), timeout, collective,
                         std::move(make), collective && inline_ops_ && bytes <= inline_max_bytes_);
  }

  // Whether no collective of this group is queued or running in the engine
  // (the last one handed over has finished: the engine runs them in
  // order), so that this thread may run one on the host segment. issue_mu_
  // held.
  bool may_run_inline() {
    if (state_->broken() || (last_collective_ && !last_collective_->is_completed())) return false;
    last_collective_.reset();
    return true;
  }

  // The WorkInfo of the next op, with its sequence number. issue_mu_ held.
  WorkInfo next_info(OpType type, DType dt, std::vector<int64_t> sizes, int peer, bool collective) {
    return make_work_info(info_, type, dt, std::move(sizes), peer, collective ? ++collective_seq_ : ++p2p_seq_);
  }

  // Hands the op to the engine, after running it here first when
  // `try_inline` and may_run_inline() (Note [Inline ops] in engine.h).
  // issue_mu_ held.
  template <typename Make>
  WorkPtr submit_locked(WorkInfo wi, Duration timeout, bool collective, Make make, bool try_inline = false) {
    const uint64_t seq = wi.seq;
    Topology* topo = topo_.get();  // alive while this backend is, and past it through op->keep
    auto body = [topo, make = std::move(make), seq](OpCtx& c) { return make(c, topo, seq); };
    auto op = std::make_unique<OpWith<decltype(body)>>(std::move(body));
    op->work = std::allocate_shared<OfiWork>(CachedAllocator<OfiWork>(), std::move(wi), std::weak_ptr<Engine>());
    op->collective = collective;
    op->issued = Clock::now();
    op->deadline = op->issued + timeout;
    // An op finished here never needs the shared references below: they
    // are taken only for the engine.
    if (try_inline && may_run_inline() && world_->engine->run_inline(*op, *state_, inline_spin_)) {
      return std::move(op->work);
    }
    op->keep = topo_;
    op->group = state_;
    op->work->set_engine(world_->engine);
    if (collective) last_collective_ = op->work;
    WorkPtr work = op->work;
    world_->engine->submit(std::move(op));
    return work;
  }

  // Note [Inline mailbox all_reduce] (host_collectives.h): a tiny all_reduce
  // on a one-host group runs in this thread when no collective of the group
  // is queued or running in the engine (the last one issued has finished:
  // the engine runs them in order). Returns null when the op was not started
  // (issue it normally); a Work already complete when the peers arrived in
  // time; else the Work of an engine op that finishes it.
  WorkPtr inline_all_reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, Duration timeout) {
    const int64_t divisor = op == ReduceOp::kAvg ? size() : 0;
    return run_one_round_inline(
        OpType::kAllReduce, dt, count, -1, timeout,
        [&](HostGroup* h) { return host_all_reduce_inline(h, in, out, count, dt, op, divisor, inline_spin_); },
        [=](OpCtx& c, Topology* t, uint64_t round) {
          return host_all_reduce_finish(c, &t->host, round, in, out, count, dt, op, divisor);
        });
  }

  // A one-round broadcast, the same way (host_broadcast_inline).
  WorkPtr inline_broadcast(void* buf, size_t count, DType dt, int root, Duration timeout) {
    const size_t bytes = count * dtype_size(dt);
    const int lroot = local_root(topo_.get(), root);
    return run_one_round_inline(
        OpType::kBroadcast, dt, count, root, timeout,
        [&](HostGroup* h) { return host_broadcast_inline(h, buf, bytes, lroot, inline_spin_); },
        [=](OpCtx& c, Topology* t, uint64_t round) {
          return host_broadcast_finish(c, &t->host, round, buf, bytes, lroot);
        });
  }

  // The common part of the two: `start` runs the op's inline form; a Work
  // already complete when it finished, the engine's Work of `finish(round)`
  // when a late peer left it published, null when it did not start.
  template <typename Start, typename Finish>
  WorkPtr run_one_round_inline(OpType type, DType dt, size_t count, int peer, Duration timeout, Start start,
                               Finish finish) {
    std::lock_guard<std::mutex> lock(issue_mu_);
    if (!may_run_inline()) return nullptr;
    HostGroup* h = &topo_->host;
    const InlineOutcome got = start(h);
    if (got == InlineOutcome::kNotStarted) return nullptr;
    WorkInfo wi = next_info(type, dt, {static_cast<int64_t>(count)}, peer, true);
    if (got == InlineOutcome::kDone) {
      return std::allocate_shared<OfiWork>(CachedAllocator<OfiWork>(), std::move(wi), OfiWork::Completed{});
    }
    const uint64_t round = h->round;
    return submit_locked(std::move(wi), timeout, true,
                         [finish, round](OpCtx& c, Topology* t, uint64_t) { return finish(c, t, round); });
  }

  void check_rank(int r, const char* what) const {
    TORUS_CHECK(r >= 0 && r < size(), InvalidArgument, "ofi: {} {} is not a rank of group '{}' (size {})", what, r,
                info_.name, size());
  }
  void check_tag(int tag) const {
    TORUS_CHECK(tag >= 0, InvalidArgument, "ofi: tag must be >= 0, got {}", tag);
  }
  // Bytes of count * blocks elements; InvalidArgument when it overflows.
  size_t check_bytes(size_t count, DType dt, size_t blocks, const char* op) const {
    size_t elems = 0, bytes = 0;
    TORUS_CHECK(!__builtin_mul_overflow(count, blocks, &elems) &&
                    !__builtin_mul_overflow(elems, dtype_size(dt), &bytes) && bytes <= SIZE_MAX / 2,
                InvalidArgument, "ofi {} on group '{}': {} x {} elements of {} overflow a buffer size", op,
                info_.name, blocks, count, dtype_name(dt));
    return bytes;
  }
  // Note [Device buffers]: on a device world every buffer must be `bytes` of
  // that device's memory (InvalidArgument before anything is sent); returns
  // where the NIC finds it.
  device::NicAddress check_device(const void* p, size_t bytes, const char* op, const char* what) const {
    if (bytes == 0) return {};
    try {
      return world_->device->nic_address(p, bytes);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("ofi {} on group '{}': the {} must be {} bytes of {} device memory: {}", op,
                                        info_.name, what, bytes, device_type_name(world_->device->type()), e.what()));
    }
  }
  void check_buffers(const void* a, const void* b, size_t count) const {
    TORUS_CHECK(count == 0 || (a != nullptr && b != nullptr), InvalidArgument,
                "ofi: null buffer for {} elements on group '{}'", count, info_.name);
  }

  std::shared_ptr<World> world_;
  GroupInfo info_;
  uint32_t context_;
  uint64_t instance_;  // unique to this group over the world's life (0: the world)
  std::shared_ptr<Topology> topo_;
  std::shared_ptr<GroupState> state_;
  std::mutex issue_mu_;
  std::shared_ptr<OfiWork> last_collective_;  // the last collective handed to the engine (issue_mu_)
  std::chrono::nanoseconds inline_spin_;
  size_t one_round_max_bytes_ = 0;  // all_reduce up to this runs as host_all_reduce_inline; 0: never
  // Other collectives moving up to this many bytes per rank start in the
  // caller's thread (Engine::run_inline); unset (0 and never) when the
  // group is not all on one host's segment or the spin is 0.
  size_t inline_max_bytes_ = 0;
  bool inline_ops_ = false;
  uint64_t collective_seq_ = 0;
  uint64_t p2p_seq_ = 0;
  int splits_ = 0;
};

// CPUs this process may run on; a process bound to one CPU is taken to be
// one of several bound ranks, each on its own: then the CPUs online.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (n <= 1) n = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  return n;
}

std::string encode_ints(std::initializer_list<int64_t> v) { return fmt::format("{}", fmt::join(v, ",")); }

std::vector<int64_t> decode_ints(const std::string& s) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::stoll(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

// Note [Recycled contexts]: counts the groups this process destroyed since
// its last split; the member that completes a group's count frees its context.
void flush_released(World& w) {
  std::vector<World::Released> mine;
  {
    std::lock_guard<std::mutex> lock(w.released_mu);
    mine.swap(w.released);
  }
  Store& store = *w.store;
  for (const auto& r : mine) {
    if (store.add(fmt::format("released/{}", r.instance), 1) != r.size) continue;
    int64_t slot = store.add("free/tail", 1);
    store.set_string(fmt::format("free/{}", slot), std::to_string(r.context));
    store.remove(fmt::format("released/{}", r.instance));
  }
}

// A context for a new group: one from the free list, else a fresh one. Each
// free slot is claimed by exactly one rank (the first to count its claim).
// Throws CommError when all are in use.
uint32_t claim_context(World& w, Duration timeout) {
  Store& store = *w.store;
  const int64_t tail = store.add("free/tail", 0);
  for (;;) {
    int64_t slot;
    {
      std::lock_guard<std::mutex> lock(w.released_mu);
      if (static_cast<int64_t>(w.free_scanned) >= tail) break;
      slot = static_cast<int64_t>(++w.free_scanned);
    }
    if (store.add(fmt::format("free/{}/claim", slot), 1) != 1) continue;
    // The releaser counted the slot before it wrote it: it is on its way.
    const std::string key = fmt::format("free/{}", slot);
    uint32_t context = static_cast<uint32_t>(std::stoul(store.get_string(key, timeout)));
    store.remove(key);  // its claim stays: a rank that has not tried this slot yet must lose it
    return context;
  }
  int64_t id = store.add("contexts", 1);
  TORUS_CHECK(id > 0 && id < static_cast<int64_t>(kMaxContexts), CommError,
              "out of tag contexts: all {} are held by groups that are alive, or that some member has not "
              "destroyed cleanly yet; destroy groups that are no longer needed",
              kMaxContexts - 1);
  return static_cast<uint32_t>(id);
}

std::shared_ptr<Backend> OfiBackend::split(int color, int key, const std::string& name, Duration timeout) {
  TORUS_CHECK(timeout.count() > 0, InvalidArgument, "ofi split: timeout must be > 0");
  int index;
  {
    std::lock_guard<std::mutex> lock(issue_mu_);
    index = splits_++;
  }
  Store& store = *world_->store;
  flush_released(*world_);
  const std::string prefix = fmt::format("split/{}/{}", instance_, index);
  store.set_string(fmt::format("{}/{}", prefix, rank()), encode_ints({color, key}));
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < size(); ++r) {
    auto v = decode_ints(store.get_string(fmt::format("{}/{}", prefix, r), timeout));
    TORUS_CHECK(v.size() == 2, CommError, "ofi split: malformed entry of rank {}", r);
    if (v[0] == color) members.emplace_back(v[1], r);
  }
  std::sort(members.begin(), members.end());
  GroupInfo gi;
  gi.name = name;
  gi.size = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank()) gi.rank = static_cast<int>(i);
    gi.global_ranks.push_back(info_.global_ranks[static_cast<size_t>(members[i].second)]);
  }
  // The first member picks the context and publishes it, or the reason it
  // could not, so that every member fails at once with the same reason.
  const std::string ctx_key = fmt::format("{}/color{}/context", prefix, color);
  std::string published;
  if (gi.rank == 0) {
    try {
      uint32_t context = claim_context(*world_, timeout);
      published = encode_ints({context, store.add("instances", 1)});
    } catch (const Error& e) {
      published = std::string("error: ") + e.what();
    }
    store.set_string(ctx_key, published);
  } else {
    published = store.get_string(ctx_key, timeout);
  }
  TORUS_CHECK(published.rfind("error: ", 0) != 0, CommError, "ofi split of group '{}' into '{}' (color {}): {}",
              info_.name, name, color, published.substr(7));
  auto ids = decode_ints(published);
  TORUS_CHECK(ids.size() == 2, CommError, "ofi split: malformed context record '{}'", published);
  return std::make_shared<OfiBackend>(world_, std::move(gi), static_cast<uint32_t>(ids[0]),
                                      static_cast<uint64_t>(ids[1]));
}

}  // namespace

std::shared_ptr<Topology> make_topology(const World& w, uint32_t context, uint64_t instance,
                                        const std::vector<int>& members, int my_rank) {
  auto t = std::make_shared<Topology>();
  const int n = static_cast<int>(members.size());
  t->rank = my_rank;
  t->size = n;
  t->tuning = w.tuning;
  auto view = [&](TagKind kind, const std::vector<int>& group_ranks, int me) {
    PeerView v;
    v.base = tag_base(context, kind);
    v.rank = me;
    for (int g : group_ranks) {
      int world = members[static_cast<size_t>(g)];
      v.addr.push_back(w.addr[static_cast<size_t>(world)]);
      v.world.push_back(world);
    }
    return v;
  };
  std::vector<int> all(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  t->full = view(TagKind::kCollective, all, my_rank);
  t->p2p = view(TagKind::kP2P, all, my_rank);

  std::vector<int> host_ids;  // world host index of each of our hosts
  for (int g = 0; g < n; ++g) {
    int hid = w.host_of[static_cast<size_t>(members[static_cast<size_t>(g)])];
    auto it = std::find(host_ids.begin(), host_ids.end(), hid);
    int h = static_cast<int>(it - host_ids.begin());
    if (it == host_ids.end()) {
      host_ids.push_back(hid);
      t->hosts.emplace_back();
    }
    t->hosts[static_cast<size_t>(h)].push_back(g);
    t->host_of.push_back(h);
  }
  t->my_host = t->host_of[static_cast<size_t>(my_rank)];
  const auto& mine = t->hosts[static_cast<size_t>(t->my_host)];
  t->local_size = static_cast<int>(mine.size());
  t->local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), my_rank) - mine.begin());
  size_t max_local = 0;
  t->uniform = true;
  for (const auto& h : t->hosts) {
    max_local = std::max(max_local, h.size());
    if (h.size() != mine.size()) t->uniform = false;
  }
  t->segment_on = w.options.host_shm && max_local >= 2;

  std::vector<int> firsts;
  for (const auto& h : t->hosts) firsts.push_back(h.front());
  t->leaders = view(TagKind::kLeaders, firsts, t->local_rank == 0 ? t->my_host : -1);
  if (t->uniform) {
    std::vector<int> same_index;
    for (const auto& h : t->hosts) same_index.push_back(h[static_cast<size_t>(t->local_rank)]);
    t->cross = view(TagKind::kCross, same_index, t->my_host);
  }

  if (t->segment_on && t->local_size >= 2) {
    HostSegment::Config cfg;
    int hid = host_ids[static_cast<size_t>(t->my_host)];
    cfg.name = fmt::format("/torus-ofi-{}-g{}-h{}", w.nonce, instance, hid);
    cfg.store_key = fmt::format("segment/{}/{}", instance, hid);
    cfg.local_rank = t->local_rank;
    cfg.local_size = t->local_size;
    cfg.world_rank = w.rank;
    cfg.stripe_bytes = w.options.stripe_bytes(t->local_size);
    cfg.depth = std::max(2, w.options.shm_depth);  // the pipeline copies in round t + 1 while reading round t
    cfg.eager_bytes = w.options.shm_eager_bytes;
    cfg.zero_copy_bytes = w.options.shm_zero_copy_bytes;
    cfg.timeout = w.timeout;
    t->segment = std::make_unique<HostSegment>(cfg, *w.store);
    t->host.seg = t->segment.get();
    t->host.nt_bytes = w.options.shm_nt_bytes;
    t->host.inline_wait = wait_policy(Wait::kInline, w.oversubscribed);
    t->host.eager_bytes = w.options.shm_eager_bytes;
    t->host.zero_copy_bytes = w.options.shm_zero_copy_bytes;
    for (auto& seen : t->host.seen) seen.assign(static_cast<size_t>(t->local_size), 0);
    t->host.sig_checked.assign(static_cast<size_t>(t->local_size), 0);
  }
  return t;
}

std::vector<uint8_t> endpoint_record(int32_t pid, int32_t mark_fd, const std::string& provider,
                                     const std::vector<uint8_t>& address) {
  const int32_t header[4] = {pid, mark_fd, static_cast<int32_t>(provider.size()),
                             static_cast<int32_t>(address.size())};
  std::vector<uint8_t> blob(sizeof(header) + provider.size() + address.size());
  std::memcpy(blob.data(), header, sizeof(header));
  std::memcpy(blob.data() + sizeof(header), provider.data(), provider.size());
  std::memcpy(blob.data() + sizeof(header) + provider.size(), address.data(), address.size());
  return blob;
}

namespace {

// Note [Device buffers] (device_ops.cpp): a world whose ops take device
// memory. Selects this rank's device, then decides once whether point to
// point hands device buffers to the provider: with TORUS_OFI_HMEM=auto, when
// the provider granted FI_HMEM and registering a probe buffer of the device
// succeeds; otherwise every op moves them through host memory.
void set_up_device_buffers(World& world, Fabric& fabric, const LaunchInfo& launch) {
  const OfiOptions& o = world.options;
  const std::string_view type = device_type_name(o.memory);
  device::Device& dev = device::get_device(o.memory);
  TORUS_CHECK(dev.count() > 0, Error, "ofi-{} on rank {}: {}", type, launch.rank, dev.describe());
  device::select_device_for_local_rank(launch.local_rank, launch.local_size);
  world.device = &dev;
  const MemoryKind kind = o.memory == DeviceType::kNeuron ? MemoryKind::kNeuron : MemoryKind::kCuda;
  std::string why;
  if (o.hmem == OfiOptions::Hmem::kOff) {
    why = "TORUS_OFI_HMEM=off";
  } else if (o.hmem == OfiOptions::Hmem::kAsHost) {
    world.device_zero_copy = true;
    world.device_kind = MemoryKind::kHost;
  } else if (!fabric.has_hmem()) {
    why = fmt::format("provider '{}' offers no FI_HMEM", fabric.provider());
  } else {
    device::DeviceBuffer probe(o.memory, 4096);
    const device::NicAddress a = dev.nic_address(probe.data(), 4096);
    if (a.address == nullptr) {
      why = fmt::format("the {} runtime gives no device address for its memory", type);
    } else {
      try {
        MemoryRegion r = fabric.register_memory(a.address, 4096, FI_SEND | FI_RECV, kind, a.device);
        world.device_zero_copy = true;
        world.device_kind = kind;
      } catch (const CommError& e) {
        why = e.what();
      }
    }
  }
  const std::string how =
      world.device_zero_copy
          ? fmt::format("point to point registers {} memory with the provider ({}); collectives go through host "
                        "memory",
                        type, o.hmem == OfiOptions::Hmem::kAsHost ? "as host memory, TORUS_OFI_HMEM=as-host"
                                                                  : "FI_HMEM")
          : fmt::format("every op moves it through host memory ({})", why);
  if (launch.rank == 0) {
    TORUS_LOG_INFO("ofi: buffers in {} memory: {}", type, how);
  } else {
    TORUS_LOG_DEBUG("ofi: buffers in {} memory: {}", type, how);
  }
}

}  // namespace

namespace {

// How the world's endpoint is asked for: the provider named by the options,
// else shm when every rank is on one host, else any RDM provider but shm.
FabricOptions world_fabric_options(const OfiOptions& given, const HostMap& hosts) {
  FabricOptions fo;
  fo.provider = given.provider;
  if (fo.provider.empty() && hosts.num_hosts() <= 1) fo.provider = "shm";
  if (hosts.num_hosts() > 1) fo.avoid.emplace_back("shm");
  fo.register_local = given.register_local;
  fo.want_hmem = given.memory != DeviceType::kCPU && given.hmem == OfiOptions::Hmem::kAuto;
  return fo;
}

}  // namespace

BackendPtr create_world_backend(const BackendInit& init, const OfiOptions& given) {
  TORUS_CHECK(init.launch != nullptr && init.hosts != nullptr && init.store != nullptr, InvalidArgument,
              "ofi backend needs launch info, a host map and a store");
  const LaunchInfo& launch = *init.launch;
  const HostMap& hosts = *init.hosts;
  const int rank = launch.rank, size = launch.world_size;
  TORUS_CHECK(static_cast<int>(hosts.host_of_rank.size()) == size, InvalidArgument,
              "ofi backend: host map has {} ranks, world has {}", hosts.host_of_rank.size(), size);
  TORUS_CHECK(size <= kMaxGroupSize, Unsupported, "ofi backend: {} ranks; at most {} are supported", size,
              kMaxGroupSize);

  auto world = std::make_shared<World>();
  world->options = given;
  world->rank = rank;
  world->size = size;
  world->host_of = hosts.host_of_rank;
  world->timeout = init.timeout.count() > 0 ? init.timeout : env_params().timeout;
  world->tuning = {given.rd_max_bytes, given.tree_max_bytes, given.chunk_bytes, given.window};

  auto fabric = std::make_unique<Fabric>(world_fabric_options(given, hosts));
  if (rank == 0) {
    TORUS_LOG_INFO("ofi: {}; {} ranks on {} hosts; host segment {}; reductions {}", fabric->describe(), size,
                   hosts.num_hosts(), given.host_shm ? "on" : "off", kernels::reduce_isa());
  } else {
    TORUS_LOG_DEBUG("ofi: {}", fabric->describe());
  }
  if (given.memory != DeviceType::kCPU) set_up_device_buffers(*world, *fabric, launch);

  // Every world made by this process gets its own key space in the store.
  static std::atomic<int> worlds{0};
  world->store = std::make_shared<PrefixStore>(fmt::format("ofi/w{}", worlds.fetch_add(1)), init.store);
  Store& store = *world->store;
  if (rank == 0) {
    std::random_device rd;
    store.set_string("nonce", fmt::format("{:08x}{:08x}{:08x}", rd(), rd(), ::getpid()));
  }
  // What a rank publishes: its pid and the fd of its provider mark (same-
  // host liveness, liveness.h; -1 without one), the lengths of its
  // provider's name and of its endpoint address, then both. Address
  // lengths may differ between ranks of one provider (fabric.h).
  constexpr size_t kHeader = 4 * sizeof(int32_t);
  std::unique_ptr<ProviderMark> mark;
  if (guards_local_peers(fabric->provider())) mark = std::make_unique<ProviderMark>();
  const std::string& my_provider = fabric->provider();
  const std::vector<uint8_t> blob =
      endpoint_record(static_cast<int32_t>(::getpid()), mark ? mark->shared_fd() : -1, my_provider, fabric->address());
  store.set(fmt::format("addr/{}", rank), blob);
  world->nonce = store.get_string("nonce", world->timeout);

  std::vector<std::vector<uint8_t>> addresses(static_cast<size_t>(size));
  std::vector<pid_t> local_pids(static_cast<size_t>(size), 0);
  std::vector<int> mark_fds(static_cast<size_t>(size), -1);
  for (int r = 0; r < size; ++r) {
    std::vector<uint8_t> b = store.get(fmt::format("addr/{}", r), world->timeout);
    int32_t h[4] = {0, -1, -1, -1};
    if (b.size() >= kHeader) std::memcpy(h, b.data(), kHeader);
    TORUS_CHECK(b.size() >= kHeader && h[2] >= 0 && h[3] > 0 &&
                    b.size() == kHeader + static_cast<size_t>(h[2]) + static_cast<size_t>(h[3]),
                CommError, "ofi: rank {} published a malformed endpoint record ({} bytes)", r, b.size());
    const std::string theirs(reinterpret_cast<const char*>(b.data() + kHeader), static_cast<size_t>(h[2]));
    TORUS_CHECK(theirs == my_provider, CommError,
                "ofi: rank {} uses the libfabric provider '{}', this rank uses '{}': set FI_PROVIDER or "
                "TORUS_OFI_PROVIDER the same on every rank",
                r, theirs, my_provider);
    if (hosts.host_of_rank[static_cast<size_t>(r)] == hosts.host_of_rank[static_cast<size_t>(rank)]) {
      local_pids[static_cast<size_t>(r)] = h[0];
      mark_fds[static_cast<size_t>(r)] = h[1];
    }
    addresses[static_cast<size_t>(r)].assign(b.begin() + static_cast<long>(kHeader) + h[2], b.end());
  }
  world->addr = fabric->insert_addresses(addresses);
  const int local_ranks = static_cast<int>(std::count(hosts.host_of_rank.begin(), hosts.host_of_rank.end(),
                                                      hosts.host_of_rank[static_cast<size_t>(rank)]));
  const int cpus = usable_cpus();
  world->oversubscribed = given.oversubscribed >= 0 ? given.oversubscribed == 1 : local_ranks > cpus;
  if (rank == 0 && world->oversubscribed) {
    TORUS_LOG_INFO("ofi: {} ranks on this host and {} CPUs: waits yield their core almost at once", local_ranks,
                   cpus);
  }
  EngineOptions eo;
  eo.oversubscribed = world->oversubscribed;
  world->engine = std::make_shared<Engine>(std::move(fabric), rank, std::move(local_pids), std::move(mark_fds),
                                           std::move(mark), eo);

  GroupInfo gi;
  gi.name = "world";
  gi.rank = rank;
  gi.size = size;
  for (int r = 0; r < size; ++r) gi.global_ranks.push_back(r);
  return std::make_shared<OfiBackend>(world, std::move(gi), 0, 0);
}

}  // namespace torus::comm::ofi

namespace torus::comm {

BackendPtr create_ofi_world_backend(const BackendInit& init) {
  return ofi::create_world_backend(init, ofi::OfiOptions::from_env());
}

// Note [Backend registration]: ofi is the preferred host backend wherever
// libfabric offers a provider for the job's hosts (shm on one host, else the
// first RDM provider but shm: world_fabric_options), since its own
// collectives beat Open MPI's on one host (docs/decisions.md); and, in a
// build with the Neuron device, the same backend on Neuron device memory
// ("ofi-neuron", Note [Device buffers] in device_ops.cpp), made by name only.
void register_ofi_backend(BackendRegistry& registry) {
  BackendFactory f;
  f.name = "ofi";
  f.role = BackendRole::kHost;
  f.preference = 20;
  f.usability = [](const BackendInit& init) {
    if (init.hosts == nullptr) return Usability{false, "no host map"};
    try {
      const std::string provider =
          ofi::Fabric::find_provider(ofi::world_fabric_options(ofi::OfiOptions::from_env(), *init.hosts));
      return Usability{true, fmt::format("libfabric provider {} on {} host(s)", provider, init.hosts->num_hosts())};
    } catch (const CommError& e) {  // a bad TORUS_OFI_* value still throws: it is no reason to fall back
      return Usability{false, e.what()};
    }
  };
  f.create = create_ofi_world_backend;
  registry.add(std::move(f));

  if (device::registered(DeviceType::kNeuron)) {
    BackendFactory n;
    n.name = "ofi-neuron";
    n.role = BackendRole::kNamed;
    n.memory = DeviceType::kNeuron;
    n.create = [](const BackendInit& init) {
      ofi::OfiOptions options = ofi::OfiOptions::from_env();
      options.memory = DeviceType::kNeuron;
      return ofi::create_world_backend(init, options);
    };
    registry.add(std::move(n));
  }
}

}  // namespace torus::comm
