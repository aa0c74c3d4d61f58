// Host-segment collectives (host_collectives.h): the path each op takes.
// One round when its data fits (the mailboxes, or the in-slots up to the
// eager size: host_one_round.cpp); else zero-copy when it is large enough
// and every local rank's buffers allow it (host_zero_copy.cpp); else the
// staging stripes (host_stripes.cpp). The all_to_all, whose first round
// makes that choice, lives with the stripes; the inline forms and the
// barrier with the one-round ops. What they share is in host_rounds.h.
#include "comm/ofi/host_collectives.h"

#include "comm/ofi/host_rounds.h"

namespace torus::comm::ofi {

std::string describe_signature(uint64_t sig) {
  const auto type = static_cast<OpType>(sig >> 60);
  const auto t = static_cast<DType>((sig >> 56) & 0xf);
  const auto op = static_cast<ReduceOp>((sig >> 52) & 0xf);
  const int root = static_cast<int>((sig >> 36) & 0xffff) - 1;
  const uint64_t count = sig & ((uint64_t{1} << 36) - 1);
  std::string s = t == kBytes ? fmt::format("{} of {} bytes", op_type_name(type), count)
                              : fmt::format("{} of {} {} elements", op_type_name(type), count, dtype_name(t));
  if (type == OpType::kAllReduce || type == OpType::kReduce || type == OpType::kReduceScatter) {
    s += fmt::format(" ({})", reduce_op_name(op));
  }
  if (root >= 0) s += fmt::format(" rooted at local rank {}", root);
  return s;
}

Task host_all_reduce(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                     int64_t divisor) {
  begin_op(h, op_signature(OpType::kAllReduce, t, op, -1, count));
  const size_t bytes = count * dtype_size(t);
  if (bytes <= SegmentMailbox::kBytes) {
    co_await all_reduce_mailbox(c, h, in, out, count, t, op, divisor);
    co_return;
  }
  if (bytes <= eager_limit(h)) {
    co_await all_reduce_eager(c, h, in, out, count, t, op, divisor);
    co_return;
  }
  if (zero_copy_wanted(h, bytes)) {
    bool agreed = false;
    co_await all_reduce_zero_copy(c, h, in, out, count, t, op, divisor, agreed);
    if (agreed) co_return;
  }
  co_await all_reduce_stripes(c, h, in, out, count, t, op, divisor);
}

Task host_reduce_scatter_blocks(OpCtx& c, HostGroup* h, const void* in, void* out, std::vector<size_t> len,
                                std::vector<size_t> off, DType t, ReduceOp op) {
  begin_op(h, op_signature(OpType::kReduceScatter, t, op, -1, off.back() + len.back()));
  if (zero_copy_wanted(h, (off.back() + len.back()) * dtype_size(t))) {
    bool agreed = false;
    co_await reduce_scatter_blocks_zero_copy(c, h, in, out, len, off, t, op, agreed);
    if (agreed) co_return;
  }
  co_await reduce_scatter_blocks_stripes(c, h, in, out, std::move(len), std::move(off), t, op);
}

Task host_all_gather_blocks(OpCtx& c, HostGroup* h, void* out, std::vector<size_t> len, std::vector<size_t> off,
                            DType t) {
  begin_op(h, op_signature(OpType::kAllGather, t, ReduceOp::kSum, -1, off.back() + len.back()));
  if (zero_copy_wanted(h, (off.back() + len.back()) * dtype_size(t))) {
    bool agreed = false;
    co_await all_gather_blocks_zero_copy(c, h, out, len, off, t, agreed);
    if (agreed) co_return;
  }
  co_await all_gather_blocks_stripes(c, h, out, std::move(len), std::move(off), t);
}

Task host_reduce_scatter(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                         int64_t divisor) {
  begin_op(h, op_signature(OpType::kReduceScatter, t, op, -1, count));
  const size_t L = static_cast<size_t>(h->local_size()), block = count * dtype_size(t);
  if (L * block <= SegmentMailbox::kBytes && count > 0) {
    co_await reduce_scatter_mailbox(c, h, in, out, count, t, op, divisor);
    co_return;
  }
  if (L * block <= eager_limit(h) && count > 0) {
    co_await reduce_scatter_eager(c, h, in, out, count, t, op, divisor);
    co_return;
  }
  if (zero_copy_wanted(h, L * block) && count > 0) {
    bool agreed = false;
    co_await reduce_scatter_zero_copy(c, h, in, out, count, t, op, divisor, agreed);
    if (agreed) co_return;
  }
  co_await reduce_scatter_stripes(c, h, in, out, count, t, op, divisor);
}

Task host_all_gather(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt) {
  begin_op(h, op_signature(OpType::kAllGather, kBytes, ReduceOp::kSum, -1, count * elt));
  const size_t L = static_cast<size_t>(h->local_size()), block = count * elt;
  if (block <= SegmentMailbox::kBytes && count > 0) {
    co_await all_gather_mailbox(c, h, in, out, count, elt);
    co_return;
  }
  if (L * block <= eager_limit(h) && count > 0) {
    co_await all_gather_eager(c, h, in, out, count, elt);
    co_return;
  }
  if (zero_copy_wanted(h, L * block) && count > 0) {
    bool agreed = false;
    co_await all_gather_zero_copy(c, h, in, out, count, elt, agreed);
    if (agreed) co_return;
  }
  co_await all_gather_stripes(c, h, in, out, count, elt);
}

Task host_reduce(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                 int64_t divisor, int root) {
  begin_op(h, op_signature(OpType::kReduce, t, op, root, count));
  const size_t bytes = count * dtype_size(t);
  if (bytes <= SegmentMailbox::kBytes && count > 0) {
    co_await reduce_mailbox(c, h, in, out, count, t, op, divisor, root);
    co_return;
  }
  if (zero_copy_wanted(h, bytes) && count > 0) {
    bool agreed = false;
    co_await reduce_zero_copy(c, h, in, out, count, t, op, divisor, root, agreed);
    if (agreed) co_return;
  }
  co_await reduce_stripes(c, h, in, out, count, t, op, divisor, root);
}

Task host_broadcast(OpCtx& c, HostGroup* h, void* buf, size_t bytes, int root) {
  begin_op(h, op_signature(OpType::kBroadcast, kBytes, ReduceOp::kSum, root, bytes));
  if (bytes <= SegmentMailbox::kBytes && bytes > 0) {
    co_await broadcast_mailbox(c, h, buf, bytes, root);
    co_return;
  }
  if (zero_copy_wanted(h, bytes)) {
    bool agreed = false;
    co_await broadcast_zero_copy(c, h, buf, bytes, root, agreed);
    if (agreed) co_return;
  }
  co_await broadcast_stripes(c, h, buf, bytes, root);
}

}  // namespace torus::comm::ofi
