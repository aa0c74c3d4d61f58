// Topology-aware collectives (ofi_group.h): the choice between the host
// segment, the hierarchical compositions and the flat provider algorithms.
#include <algorithm>

#include "comm/ofi/ofi_group.h"
#include "comm/ofi/reduce_ops.h"

namespace torus::comm::ofi {
namespace {

int64_t divisor_of(ReduceOp op, int size) { return op == ReduceOp::kAvg ? size : 0; }

bool flat(const Topology* t) { return !t->segment_on; }
bool local_only(const Topology* t) { return t->segment_on && t->single_host(); }

// One leader per host, with the root leading its own host. View rank h is
// host h; `rank` is -1 on non-leaders.
PeerView leaders_for_root(const Topology* t, int root) {
  PeerView v = t->leaders;
  int rh = t->host_of[static_cast<size_t>(root)];
  v.addr[static_cast<size_t>(rh)] = t->full.addr[static_cast<size_t>(root)];
  v.world[static_cast<size_t>(rh)] = t->full.world[static_cast<size_t>(root)];
  v.rank = -1;
  if (t->my_host == rh) {
    if (t->rank == root) v.rank = rh;
  } else if (t->local_rank == 0) {
    v.rank = t->my_host;
  }
  return v;
}

// Note [Half sums across hosts]: a hierarchical sum, average or product of
// f16/bf16 runs both of its phases in f32 and rounds once at the end, as
// the backend contract says for half types (ofi_backend.h). Rounding each
// host's partial result to 16 bits first would round twice: bf16 256 + 1 on
// one host and 1 + 0 on the other gave 256 instead of 258. max and min are
// exact in the half type.
bool widened(DType dt, ReduceOp op) { return is_half(dt) && op != ReduceOp::kMax && op != ReduceOp::kMin; }

// The several-host all_reduce (ofi_group.h); dt is never widened here.
Task hierarchical_all_reduce(OpCtx& c, Topology* t, const void* in, void* out_v, size_t count, DType dt,
                             ReduceOp op, int64_t divisor, uint64_t seq) {
  const size_t e = dtype_size(dt), bytes = count * e;
  char* out = static_cast<char*>(out_v);
  const int L = t->local_size, me = t->local_rank;
  if (t->uniform && bytes > t->tuning.rd_max_bytes && count >= static_cast<size_t>(L)) {
    // Reduce-scatter on the host, all_reduce of each block across hosts,
    // all-gather on the host: every rank's link carries 1/L of the data.
    algo::Partition p = algo::balanced(count, L);
    char* block = out + p.off[static_cast<size_t>(me)] * e;
    if (L > 1) {
      co_await host_reduce_scatter_blocks(c, &t->host, in, out, p.len, p.off, dt, op);
    } else {
      copy_bytes(out, in, bytes);
    }
    co_await algo::all_reduce(c, &t->cross, block, block, p.len[static_cast<size_t>(me)], dt, op, divisor, seq,
                              t->tuning);
    if (L > 1) co_await host_all_gather_blocks(c, &t->host, out, p.len, p.off, dt);
    co_return;
  }
  // Reduce to each host's leader, all_reduce among leaders, broadcast back.
  if (L > 1) {
    co_await host_reduce(c, &t->host, in, out, count, dt, op, 0, 0);
  } else {
    copy_bytes(out, in, bytes);
  }
  if (me == 0) co_await algo::all_reduce(c, &t->leaders, out, out, count, dt, op, divisor, seq, t->tuning);
  if (L > 1) co_await host_broadcast(c, &t->host, out, bytes, 0);
}

}  // namespace

int local_root(const Topology* t, int root) {
  if (t->host_of[static_cast<size_t>(root)] != t->my_host) return 0;
  const auto& mine = t->hosts[static_cast<size_t>(t->my_host)];
  return static_cast<int>(std::find(mine.begin(), mine.end(), root) - mine.begin());
}

// The several-host reduce (ofi_group.h); dt is never widened here.
static Task hierarchical_reduce(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt,
                                ReduceOp op, int64_t divisor, int root, uint64_t seq) {
  const size_t bytes = count * dtype_size(dt);
  const int lroot = local_root(t, root);
  PeerView leaders = leaders_for_root(t, root);
  const bool leader = leaders.rank >= 0;
  // The host's partial result: the root's own buffer, a scratch buffer on
  // other leaders.
  char* partial = t->rank == root ? static_cast<char*>(out) : leader ? c.scratch(bytes) : nullptr;
  if (t->local_size > 1) {
    co_await host_reduce(c, &t->host, in, partial, count, dt, op, 0, lroot);
  } else {
    copy_bytes(partial, in, bytes);
  }
  if (leader) {
    co_await algo::reduce(c, &leaders, partial, partial, count, dt, op, divisor,
                          t->host_of[static_cast<size_t>(root)], seq, t->tuning);
  }
}

Task group_all_reduce(OpCtx& c, Topology* t, const void* in, void* out_v, size_t count, DType dt, ReduceOp op,
                      uint64_t seq) {
  const int64_t divisor = divisor_of(op, t->size);
  const size_t e = dtype_size(dt), bytes = count * e;
  char* out = static_cast<char*>(out_v);
  if (t->size == 1 || count == 0) {
    copy_bytes(out, in, bytes);
    co_return;
  }
  if (flat(t)) {
    co_await algo::all_reduce(c, &t->full, in, out, count, dt, op, divisor, seq, t->tuning);
    co_return;
  }
  if (local_only(t)) {
    co_await host_all_reduce(c, &t->host, in, out, count, dt, op, divisor);
    co_return;
  }
  if (widened(dt, op)) {
    // Note [Half sums across hosts]: both phases run in f32, rounded once.
    char* w = c.scratch(count * sizeof(float));
    kernels::half_to_f32(in, reinterpret_cast<float*>(w), count, dt);
    co_await hierarchical_all_reduce(c, t, w, w, count, DType::kF32, op, divisor, seq);
    kernels::f32_to_half(reinterpret_cast<const float*>(w), out, count, dt);
    co_return;
  }
  co_await hierarchical_all_reduce(c, t, in, out, count, dt, op, divisor, seq);
}

Task group_reduce_scatter(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt, ReduceOp op,
                          uint64_t seq) {
  const int64_t divisor = divisor_of(op, t->size);
  if (t->size == 1 || count == 0) {
    copy_bytes(out, in, count * dtype_size(dt));
  } else if (local_only(t)) {
    co_await host_reduce_scatter(c, &t->host, in, out, count, dt, op, divisor);
  } else {
    co_await algo::reduce_scatter(c, &t->full, in, out, count, dt, op, divisor, seq, t->tuning);
  }
}

Task group_all_gather(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt, uint64_t seq) {
  const size_t e = dtype_size(dt);
  if (t->size == 1 || count == 0) {
    copy_bytes(out, in, count * e);
  } else if (local_only(t)) {
    co_await host_all_gather(c, &t->host, in, out, count, e);
  } else {
    co_await algo::all_gather(c, &t->full, in, out, count, e, seq, t->tuning);
  }
}

Task group_broadcast(OpCtx& c, Topology* t, void* buf, size_t count, DType dt, int root, uint64_t seq) {
  const size_t bytes = count * dtype_size(dt);
  if (t->size == 1 || bytes == 0) co_return;
  if (flat(t)) {
    co_await algo::broadcast(c, &t->full, buf, bytes, root, seq, t->tuning);
    co_return;
  }
  const int lroot = local_root(t, root);
  if (!t->single_host()) {
    PeerView leaders = leaders_for_root(t, root);
    if (leaders.rank >= 0) {
      co_await algo::broadcast(c, &leaders, buf, bytes, t->host_of[static_cast<size_t>(root)], seq, t->tuning);
    }
  }
  if (t->local_size > 1) co_await host_broadcast(c, &t->host, buf, bytes, lroot);
}

Task group_reduce(OpCtx& c, Topology* t, const void* in, void* out, size_t count, DType dt, ReduceOp op, int root,
                  uint64_t seq) {
  const int64_t divisor = divisor_of(op, t->size);
  const size_t bytes = count * dtype_size(dt);
  if (t->size == 1 || count == 0) {
    if (t->rank == root) copy_bytes(out, in, bytes);
    co_return;
  }
  if (flat(t)) {
    co_await algo::reduce(c, &t->full, in, out, count, dt, op, divisor, root, seq, t->tuning);
    co_return;
  }
  const int lroot = local_root(t, root);
  if (t->single_host()) {
    co_await host_reduce(c, &t->host, in, out, count, dt, op, divisor, lroot);
    co_return;
  }
  if (widened(dt, op)) {
    // Note [Half sums across hosts]: both phases run in f32, rounded once
    // on the root.
    char* w = c.scratch(count * sizeof(float));
    kernels::half_to_f32(in, reinterpret_cast<float*>(w), count, dt);
    char* res = t->rank == root ? c.scratch(count * sizeof(float)) : nullptr;
    co_await hierarchical_reduce(c, t, w, res, count, DType::kF32, op, divisor, root, seq);
    if (res != nullptr) kernels::f32_to_half(reinterpret_cast<const float*>(res), out, count, dt);
    co_return;
  }
  co_await hierarchical_reduce(c, t, in, out, count, dt, op, divisor, root, seq);
}

Task group_all_to_all(OpCtx& c, Topology* t, const void* in, void* out, std::vector<size_t> send_counts,
                      std::vector<size_t> recv_counts, DType dt, uint64_t seq) {
  if (local_only(t)) {
    co_await host_all_to_all(c, &t->host, in, out, std::move(send_counts), std::move(recv_counts), dtype_size(dt));
    co_return;
  }
  co_await algo::all_to_all(c, &t->full, in, out, std::move(send_counts), std::move(recv_counts), dtype_size(dt),
                            seq, t->tuning);
}

Task group_barrier(OpCtx& c, Topology* t, uint64_t seq) {
  if (t->size == 1) co_return;
  if (flat(t)) {
    co_await algo::barrier(c, &t->full, seq);
    co_return;
  }
  if (t->local_size > 1) co_await host_barrier(c, &t->host);
  if (!t->single_host() && t->local_rank == 0) co_await algo::barrier(c, &t->leaders, seq);
  if (!t->single_host() && t->local_size > 1) co_await host_barrier(c, &t->host);
}

}  // namespace torus::comm::ofi
