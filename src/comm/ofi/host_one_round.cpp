// The one-round paths of the host collectives (host_collectives.h): ops
// whose data fits one round. Up to SegmentMailbox::kBytes per rank it goes
// through the mailboxes: a rank writes its data and the round number into
// one cache line of its own, so that a peer's read of that line is the
// whole transfer. Larger ones, up to eager_limit(), take one round of the
// in-slots and the `copied` signal. A rank reads its own contribution from
// its input where it can (own_source).
//
// The all_reduce and the broadcast also run in the caller's thread, without
// the engine (Note [Inline mailbox all_reduce] in host_collectives.h): the
// same round, its waits spinning for at most a budget (spin.h). A rank
// whose peers are late leaves its round published, and host_*_finish
// completes it in the engine. The barrier is one round of `copied` signals.
#include <cstring>

#include "comm/ofi/host_rounds.h"

namespace torus::comm::ofi {
namespace {

// This rank's own contribution to a one-round combine is read from its
// input, not from the copy it just published: that line is still on its
// way to exclusive ownership (the peers held it), and reading it back would
// wait for that, a cross-core round trip per op. The input holds the same
// bits. Only srcs[0] and srcs[1] may alias the output (combine reduces
// element by element into it), so an in-place input of a rank past the
// second is read from its copy.
const char* own_source(const HostGroup* h, const void* in, const void* out, const char* published) {
  return in != out || h->local_rank() < 2 ? static_cast<const char*>(in) : published;
}

// Every mailbox of round r is in: out = the reduction, in rank order (the
// same bits on every rank), of the `count` elements at byte `offset` of
// each (this rank's own from `in`); then this rank is done with round r.
void combine_mailboxes(HostGroup* h, uint64_t r, const void* in, void* out, size_t count, DType t, ReduceOp op,
                       int64_t divisor, size_t offset = 0) {
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  std::vector<const char*>& srcs = h->srcs;
  srcs.resize(static_cast<size_t>(L));
  for (int q = 0; q < L; ++q) {
    srcs[static_cast<size_t>(q)] = s.mailbox(q, r).data + offset;
  }
  srcs[static_cast<size_t>(me)] = own_source(h, in, out, srcs[static_cast<size_t>(me)]);
  float acc[SegmentMailbox::kBytes / 2];
  combine(static_cast<char*>(out), srcs, count, t, op, divisor, acc);
  signal(h, Counter::kConsumed, r);
}

// Every in-slot of round r is full: out = the reduction, in rank order, of
// the `count` elements at byte `offset` of each (this rank's own from
// `in`); then this rank is done with round r. Halves accumulate in the op's
// scratch, or in the group's when there is no op (`c` null: inline).
void combine_slots(HostGroup* h, uint64_t r, const void* in, void* out, size_t count, DType t, ReduceOp op,
                   int64_t divisor, OpCtx* c, size_t offset = 0) {
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  std::vector<const char*>& srcs = h->srcs;
  srcs.resize(static_cast<size_t>(L));
  for (int q = 0; q < L; ++q) srcs[static_cast<size_t>(q)] = s.in_slot(q, r) + offset;
  srcs[static_cast<size_t>(me)] = own_source(h, in, out, srcs[static_cast<size_t>(me)]);
  float* acc = nullptr;
  if (is_half(t)) {
    if (c != nullptr) {
      acc = reinterpret_cast<float*>(c->scratch(count * sizeof(float)));
    } else {
      if (h->acc.size() < count) h->acc.resize(count);
      acc = h->acc.data();
    }
  }
  combine(static_cast<char*>(out), srcs, count, t, op, divisor, acc);
  signal(h, Counter::kConsumed, r);
}

// This rank's data of a one-round op of round r: in its mailbox, or in its
// in-slot with the `copied` signal.
void publish_one_round(HostGroup* h, uint64_t r, const void* data, size_t bytes, bool mailbox) {
  if (mailbox) {
    publish_mailbox(h, r, data, bytes);
  } else {
    std::memcpy(h->seg->in_slot(h->local_rank(), r), data, bytes);
    signal(h, Counter::kCopied, r);
  }
}

// Whether this rank may write its mailbox (`mailbox`) or its slots of
// round r now (Note [Segment rounds]): one look at each peer's `consumed`
// line it has not yet seen far enough.
bool one_round_free(HostGroup* h, uint64_t r, bool mailbox) {
  const HostSegment& s = *h->seg;
  const uint64_t depth = static_cast<uint64_t>(s.depth());
  const uint64_t need = mailbox ? mailbox_free_after(r) : r > depth ? r - depth : 0;
  std::vector<uint64_t>& consumed = h->seen[static_cast<int>(Counter::kConsumed)];
  for (int q = 0; q < s.local_size(); ++q) {
    uint64_t& v = consumed[static_cast<size_t>(q)];
    if (q != s.local_rank() && v < need) {
      v = counter(s, q, Counter::kConsumed).load(std::memory_order_acquire);
      if (v < need) return false;
    }
  }
  return true;
}

}  // namespace

size_t host_inline_max_bytes(const HostGroup* h) { return std::max(SegmentMailbox::kBytes, eager_limit(h)); }

Task all_reduce_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                        int64_t divisor) {
  const uint64_t r = ++h->round;
  co_await wait_mailbox_free(c, h, r);
  publish_mailbox(h, r, in, count * dtype_size(t));
  co_await wait_mailboxes(c, h, r);
  note_all_consumed(h, r);
  combine_mailboxes(h, r, in, out, count, t, op, divisor);
}

Task all_reduce_eager(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                      int64_t divisor) {
  const HostSegment& s = *h->seg;
  const uint64_t r = ++h->round;
  co_await wait_slots_free(c, h, r);
  std::memcpy(s.in_slot(s.local_rank(), r), in, count * dtype_size(t));
  signal(h, Counter::kCopied, r);
  co_await wait_for(c, h, Counter::kCopied, r);
  note_all_consumed(h, r);
  combine_slots(h, r, in, out, count, t, op, divisor, &c);
}

Task reduce_scatter_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                            int64_t divisor) {
  // Every rank publishes its whole input and reduces its own block from all
  // of them, in rank order.
  const HostSegment& s = *h->seg;
  const size_t L = static_cast<size_t>(s.local_size()), me = static_cast<size_t>(s.local_rank());
  const size_t block = count * dtype_size(t);
  const uint64_t r = ++h->round;
  co_await wait_mailbox_free(c, h, r);
  publish_mailbox(h, r, in, L * block);
  co_await wait_mailboxes(c, h, r);
  note_all_consumed(h, r);
  combine_mailboxes(h, r, static_cast<const char*>(in) + me * block, out, count, t, op, divisor, me * block);
}

Task reduce_scatter_eager(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                          int64_t divisor) {
  // As the eager all_reduce, each rank reducing only its own block.
  const HostSegment& s = *h->seg;
  const size_t L = static_cast<size_t>(s.local_size()), me = static_cast<size_t>(s.local_rank());
  const size_t block = count * dtype_size(t);
  const uint64_t r = ++h->round;
  co_await wait_slots_free(c, h, r);
  std::memcpy(s.in_slot(static_cast<int>(me), r), in, L * block);
  signal(h, Counter::kCopied, r);
  co_await wait_for(c, h, Counter::kCopied, r);
  note_all_consumed(h, r);
  combine_slots(h, r, static_cast<const char*>(in) + me * block, out, count, t, op, divisor, &c, me * block);
}

Task all_gather_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt) {
  // This rank's own block comes from its input.
  const HostSegment& s = *h->seg;
  const size_t L = static_cast<size_t>(s.local_size()), me = static_cast<size_t>(s.local_rank());
  const size_t block = count * elt;
  const uint64_t r = ++h->round;
  co_await wait_mailbox_free(c, h, r);
  publish_mailbox(h, r, in, block);
  co_await wait_mailboxes(c, h, r);
  note_all_consumed(h, r);
  char* o = static_cast<char*>(out);
  for (size_t q = 0; q < L; ++q) {
    if (q != me) std::memcpy(o + q * block, s.mailbox(static_cast<int>(q), r).data, block);
  }
  copy_bytes(o + me * block, in, block);
  signal(h, Counter::kConsumed, r);
}

Task all_gather_eager(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt) {
  // Every rank stages its block, all copy all of them out.
  const HostSegment& s = *h->seg;
  const size_t L = static_cast<size_t>(s.local_size()), me = static_cast<size_t>(s.local_rank());
  const size_t block = count * elt;
  const uint64_t r = ++h->round;
  co_await wait_slots_free(c, h, r);
  std::memcpy(s.in_slot(static_cast<int>(me), r), in, block);
  signal(h, Counter::kCopied, r);
  co_await wait_for(c, h, Counter::kCopied, r);
  note_all_consumed(h, r);
  char* o = static_cast<char*>(out);
  for (size_t q = 0; q < L; ++q) {
    if (q != me) std::memcpy(o + q * block, s.in_slot(static_cast<int>(q), r), block);
  }
  copy_bytes(o + me * block, in, block);
  signal(h, Counter::kConsumed, r);
}

Task reduce_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                    int64_t divisor, int root) {
  // Only the root waits (the others may run ahead: wait_mailbox_free keeps
  // them from overwriting what it has not read).
  const HostSegment& s = *h->seg;
  const int me = s.local_rank();
  const uint64_t r = ++h->round;
  co_await wait_mailbox_free(c, h, r);
  publish_mailbox(h, r, in, count * dtype_size(t));
  if (me == root) {
    co_await wait_mailboxes(c, h, r);
    note_all_consumed(h, r);
    combine_mailboxes(h, r, in, out, count, t, op, divisor);
  } else {
    signal(h, Counter::kConsumed, r);
  }
}

Task broadcast_mailbox(OpCtx& c, HostGroup* h, void* buf, size_t bytes, int root) {
  // The root publishes and goes on; the others copy.
  const HostSegment& s = *h->seg;
  const int me = s.local_rank();
  const uint64_t r = ++h->round;
  if (me == root) {
    co_await wait_mailbox_free(c, h, r);
    publish_mailbox(h, r, buf, bytes);
  } else {
    co_await wait_mailboxes(c, h, r, root);
    note_consumed(h, root, r);
    std::memcpy(buf, s.mailbox(root, r).data, bytes);
  }
  signal(h, Counter::kConsumed, r);
}

InlineOutcome host_all_reduce_inline(HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                                     int64_t divisor, std::chrono::nanoseconds spin) {
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  const size_t bytes = count * dtype_size(t);
  TORUS_CHECK(bytes <= host_inline_max_bytes(h), InvalidArgument, "inline all_reduce of {} bytes; at most {}", bytes,
              host_inline_max_bytes(h));
  if (s.is_aborted()) return InlineOutcome::kNotStarted;
  const bool mailbox = bytes <= SegmentMailbox::kBytes;
  const uint64_t r = h->round + 1;
  // The waits (spin.h) give up when `spin` has passed or the segment is aborted.
  auto aborted = [&s] { return s.is_aborted(); };
  auto writable = [&] { return one_round_free(h, r, mailbox); };
  if (!spin_politely(h->inline_wait, spin, writable, aborted)) return InlineOutcome::kNotStarted;
  begin_op(h, op_signature(OpType::kAllReduce, t, op, -1, count));
  h->round = r;
  publish_one_round(h, r, in, bytes, mailbox);
  std::vector<uint64_t>& copied = h->seen[static_cast<int>(Counter::kCopied)];
  auto all_in = [&] {
    for (int q = 0; q < L; ++q) {
      if (q == me) continue;
      if (mailbox) {
        if (s.mailbox(q, r).round.load(std::memory_order_acquire) < r) return false;
      } else {
        uint64_t& v = copied[static_cast<size_t>(q)];
        if (v < r) v = counter(s, q, Counter::kCopied).load(std::memory_order_acquire);
        if (v < r) return false;
      }
    }
    return true;
  };
  if (!spin_politely(h->inline_wait, spin, all_in, aborted)) return InlineOutcome::kPublished;
  // A disagreeing peer: the engine's finish names it (check_signature).
  for (int q = 0; q < L; ++q) {
    if (q != me && !signature_agrees(h, q)) return InlineOutcome::kPublished;
  }
  note_all_consumed(h, r);
  if (mailbox) {
    combine_mailboxes(h, r, in, out, count, t, op, divisor);
  } else {
    combine_slots(h, r, in, out, count, t, op, divisor, nullptr);
  }
  return InlineOutcome::kDone;
}

InlineOutcome host_broadcast_inline(HostGroup* h, void* buf, size_t bytes, int root, std::chrono::nanoseconds spin) {
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  TORUS_CHECK(bytes > 0 && bytes <= host_inline_max_bytes(h), InvalidArgument,
              "inline broadcast of {} bytes; 1 to {}", bytes, host_inline_max_bytes(h));
  // host_broadcast's one-round forms: the mailbox, or one round of the
  // root's in-slot when the op would not try the zero-copy path first.
  const bool mailbox = bytes <= SegmentMailbox::kBytes;
  if (!mailbox && (zero_copy_wanted(h, bytes) || bytes > static_cast<size_t>(L) * s.stripe_bytes())) {
    return InlineOutcome::kNotStarted;
  }
  if (s.is_aborted()) return InlineOutcome::kNotStarted;
  const uint64_t r = h->round + 1;
  const uint64_t sig = op_signature(OpType::kBroadcast, kBytes, ReduceOp::kSum, root, bytes);
  // The waits (spin.h) give up when `spin` has passed or the segment is aborted.
  auto aborted = [&s] { return s.is_aborted(); };
  if (me == root) {
    auto writable = [&] { return one_round_free(h, r, mailbox); };
    if (!spin_politely(h->inline_wait, spin, writable, aborted)) return InlineOutcome::kNotStarted;
    begin_op(h, sig);
    h->round = r;
    publish_one_round(h, r, buf, bytes, mailbox);
    signal(h, Counter::kConsumed, r);
    return InlineOutcome::kDone;
  }
  begin_op(h, sig);
  h->round = r;
  uint64_t& seen = h->seen[static_cast<int>(Counter::kCopied)][static_cast<size_t>(root)];
  auto arrived = [&] {
    if (mailbox) return s.mailbox(root, r).round.load(std::memory_order_acquire) >= r;
    if (seen < r) seen = counter(s, root, Counter::kCopied).load(std::memory_order_acquire);
    return seen >= r;
  };
  if (!spin_politely(h->inline_wait, spin, arrived, aborted) || !signature_agrees(h, root)) {
    return InlineOutcome::kPublished;
  }
  if (mailbox) {
    note_consumed(h, root, r);
    std::memcpy(buf, s.mailbox(root, r).data, bytes);
  } else {
    std::memcpy(buf, s.in_slot(root, r), bytes);
  }
  signal(h, Counter::kConsumed, r);
  return InlineOutcome::kDone;
}

Task host_broadcast_finish(OpCtx& c, HostGroup* h, uint64_t round, void* buf, size_t bytes, int root) {
  if (bytes <= SegmentMailbox::kBytes) {
    co_await wait_mailboxes(c, h, round, root);
    note_consumed(h, root, round);
    std::memcpy(buf, h->seg->mailbox(root, round).data, bytes);
  } else {
    co_await wait_for(c, h, Counter::kCopied, round, root);
    std::memcpy(buf, h->seg->in_slot(root, round), bytes);
  }
  signal(h, Counter::kConsumed, round);
}

Task host_all_reduce_finish(OpCtx& c, HostGroup* h, uint64_t round, const void* in, void* out, size_t count,
                            DType t, ReduceOp op, int64_t divisor) {
  if (count * dtype_size(t) <= SegmentMailbox::kBytes) {
    co_await wait_mailboxes(c, h, round);
  } else {
    co_await wait_for(c, h, Counter::kCopied, round);
  }
  note_all_consumed(h, round);
  if (count * dtype_size(t) <= SegmentMailbox::kBytes) {
    combine_mailboxes(h, round, in, out, count, t, op, divisor);
  } else {
    combine_slots(h, round, in, out, count, t, op, divisor, &c);
  }
}

Task host_barrier(OpCtx& c, HostGroup* h) {
  begin_op(h, op_signature(OpType::kBarrier, kBytes, ReduceOp::kSum, -1, 0));
  const uint64_t r = ++h->round;
  signal(h, Counter::kCopied, r);
  co_await wait_for(c, h, Counter::kCopied, r);
  signal(h, Counter::kConsumed, r);
}

}  // namespace torus::comm::ofi
