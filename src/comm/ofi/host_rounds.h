// Private: what the host-segment collectives (host_collectives.h) are made
// of, shared by their three mechanisms: one round through the mailboxes or
// the in-slots (host_one_round.cpp), zero-copy (host_zero_copy.cpp) and the
// staging stripes (host_stripes.cpp); host_collectives.cpp picks one per op.
//
// Note [Segment rounds]: every host collective is a sequence of rounds, and
// every local rank numbers rounds identically (HostGroup::round counts them
// over the life of the group). In round r a rank may write its slots r % D
// only after every peer's `consumed` counter reached r - D, i.e. after all
// of them finished reading those slots in round r - D; its mailbox of
// round r (a ring of kMailboxes) only after r - kMailboxes
// (wait_mailbox_free). Within a round,
// `copied` and `reduced` say that a rank's in-slot and out-slot of round r
// are ready. Counters only grow, so a round never waits for a signal of an
// older op, and nothing needs resetting between ops.
//
// A one-round op (a mailbox or eager all_reduce) starts only after the
// rank's previous op has ended, so a peer's mailbox or `copied` signal of
// such a round r also says that it consumed every round before r. Waiters
// record that (note_consumed), which keeps the steady state of tiny
// all_reduces at one cache-line transfer per peer: the peers' `consumed`
// lines are never read.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "comm/ofi/host_collectives.h"
#include "comm/ofi/reduce_ops.h"
#include "comm/ofi/stream_copy.h"
#include "core/log.h"

namespace torus::comm::ofi {

enum class Counter { kCopied, kReduced, kConsumed };

constexpr const char* counter_name(Counter k) {
  return k == Counter::kCopied ? "copied" : k == Counter::kReduced ? "reduced" : "consumed";
}

inline std::atomic<uint64_t>& counter(const HostSegment& s, int local_rank, Counter k) {
  SegmentControl& c = s.control(local_rank);
  return k == Counter::kCopied ? c.copied.value : k == Counter::kReduced ? c.reduced.value : c.consumed.value;
}

inline void signal(HostGroup* h, Counter k, uint64_t round) {
  counter(*h->seg, h->local_rank(), k).store(round, std::memory_order_release);
}

// Throws when the segment is aborted or (checked at most every 50 ms) a
// member process has died.
inline void check_health(OpCtx& c, HostGroup* h, unsigned& spins) {
  const HostSegment& s = *h->seg;
  if (s.is_aborted()) {
    throw CommError(fmt::format("{} failed: the group was aborted by {}", c.info().describe(), s.aborted()));
  }
  if ((++spins & 255) != 0) return;
  auto now = Clock::now();
  if (now < h->next_liveness_check) return;
  h->next_liveness_check = now + std::chrono::milliseconds(50);
  int dead = s.find_dead_member();
  if (dead >= 0) {
    throw CommError(fmt::format("{} failed: peer world rank {} on this host exited (its process is gone)",
                                c.info().describe(), dead));
  }
}

// Ops that count bytes, not elements of a dtype, sign with this "dtype".
inline constexpr DType kBytes = static_cast<DType>(0xf);

// Note [Op signatures] (host_segment.h). What an op is, in one word: op
// type (4 bits), dtype (4), reduce op (4), root + 1 (16) and element count
// (36; larger counts saturate, and differ elsewhere too).
inline uint64_t op_signature(OpType type, DType t, ReduceOp op, int root, uint64_t count) {
  constexpr uint64_t kCountMask = (uint64_t{1} << 36) - 1;
  return (static_cast<uint64_t>(type) & 0xf) << 60 | (static_cast<uint64_t>(t) & 0xf) << 56 |
         (static_cast<uint64_t>(op) & 0xf) << 52 | (static_cast<uint64_t>(root + 1) & 0xffff) << 36 |
         std::min(count, kCountMask);
}

// What a signature says, for error messages (host_collectives.cpp).
std::string describe_signature(uint64_t sig);

// Publishes this rank's signature of the op that starts with the next round.
inline void begin_op(HostGroup* h, uint64_t sig) {
  h->op_round = h->round + 1;
  h->op_sig = sig;
  auto& e = h->seg->control(h->local_rank()).sigs.ring[h->op_round % SegmentOpSigs::kRing];
  // A seqlock write: readers that see the same round before and after
  // reading `what` read this op's word (plain stores on x86).
  e.round.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.what.store(sig, std::memory_order_relaxed);
  e.round.store(h->op_round, std::memory_order_release);
}

// Whether local rank q's signature of the current op does not contradict
// this rank's: false only once q has published a different one. After q's
// entry was seen to match, it is not read again for this op. An entry that
// q has already reused for a later op is taken as a match: the ranks
// agreed up to there, and q's own check covers this op. Ranks that
// disagree on sizes may also disagree on the protocol (a mailbox round
// against staging slots) and wait on signals the other never gives, so
// waits look at the entries of the peers they wait for, too.
inline bool signature_agrees(HostGroup* h, int q) {
  if (h->op_round == 0) return true;
  if (h->sig_checked.size() != static_cast<size_t>(h->local_size())) {
    h->sig_checked.assign(static_cast<size_t>(h->local_size()), 0);
  }
  uint64_t& checked = h->sig_checked[static_cast<size_t>(q)];
  if (checked == h->op_round) return true;
  const auto& e = h->seg->control(q).sigs.ring[h->op_round % SegmentOpSigs::kRing];
  const uint64_t before = e.round.load(std::memory_order_acquire);
  if (before < h->op_round) return true;  // not published yet (or being rewritten)
  const uint64_t theirs = e.what.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  const bool whole = e.round.load(std::memory_order_relaxed) == before;
  if (before == h->op_round && whole && theirs != h->op_sig) return false;
  checked = h->op_round;
  return true;
}

// As signature_agrees(), throwing InvalidArgument that names both calls.
inline void check_signature(const OpCtx& c, HostGroup* h, int q) {
  if (signature_agrees(h, q)) return;
  const uint64_t theirs =
      h->seg->control(q).sigs.ring[h->op_round % SegmentOpSigs::kRing].what.load(std::memory_order_relaxed);
  throw InvalidArgument(fmt::format(
      "{} failed: the ranks disagree on this collective: world rank {} called {}, this rank (world rank {}) "
      "called {}; every rank of the group must pass the same sizes",
      c.info().describe(), h->seg->control(q).world_rank, describe_signature(theirs),
      h->seg->control(h->local_rank()).world_rank, describe_signature(h->op_sig)));
}

// Suspends until counter k of every other local rank (or of `only`) reaches
// `target`. Values already seen satisfy it without touching the peer's line.
inline auto wait_for(OpCtx& c, HostGroup* h, Counter k, uint64_t target, int only = -1) {
  auto ready = [&c, h, k, target, only, spins = 0u]() mutable {
    const HostSegment& s = *h->seg;
    std::vector<uint64_t>& seen = h->seen[static_cast<int>(k)];
    bool ok = true;
    for (int q = 0; q < s.local_size() && ok; ++q) {
      if (q == s.local_rank() || (only >= 0 && q != only)) continue;
      uint64_t& v = seen[static_cast<size_t>(q)];
      if (v < target) v = counter(s, q, k).load(std::memory_order_acquire);
      ok = v >= target;
      if (!ok || v >= h->op_round) check_signature(c, h, q);
    }
    if (!ok) check_health(c, h, spins);
    return ok;
  };
  auto describe = [h, k, target, only] {
    const HostSegment& s = *h->seg;
    std::vector<std::string> lag;
    for (int q = 0; q < s.local_size(); ++q) {
      if (q == s.local_rank() || (only >= 0 && q != only)) continue;
      uint64_t v = counter(s, q, k).load(std::memory_order_acquire);
      if (v < target) lag.push_back(fmt::format("world rank {} ({} {} < {})", s.control(q).world_rank,
                                                counter_name(k), v, target));
    }
    return fmt::format("same-host peers in shared memory: {}", fmt::join(lag, ", "));
  };
  return c.until(std::move(ready), std::move(describe));
}

// A peer's signal of one-round op round r was seen: it consumed r - 1.
inline void note_consumed(HostGroup* h, int q, uint64_t r) {
  uint64_t& v = h->seen[static_cast<int>(Counter::kConsumed)][static_cast<size_t>(q)];
  v = std::max(v, r - 1);
}
inline void note_all_consumed(HostGroup* h, uint64_t r) {
  for (int q = 0; q < h->local_size(); ++q) {
    if (q != h->local_rank()) note_consumed(h, q, r);
  }
}

// Suspends until every other local rank's mailbox of `round` (or only that
// of `only`) is filled.
inline auto wait_mailboxes(OpCtx& c, HostGroup* h, uint64_t round, int only = -1) {
  auto ready = [&c, h, round, only, spins = 0u]() mutable {
    const HostSegment& s = *h->seg;
    for (int q = 0; q < s.local_size(); ++q) {
      if (q == s.local_rank() || (only >= 0 && q != only)) continue;
      if (s.mailbox(q, round).round.load(std::memory_order_acquire) < round) {
        check_signature(c, h, q);
        check_health(c, h, spins);
        return false;
      }
    }
    if (round >= h->op_round) {
      for (int q = 0; q < s.local_size(); ++q) {
        if (q != s.local_rank() && (only < 0 || q == only)) check_signature(c, h, q);
      }
    }
    return true;
  };
  auto describe = [h, round, only] {
    const HostSegment& s = *h->seg;
    std::vector<std::string> lag;
    for (int q = 0; q < s.local_size(); ++q) {
      uint64_t v = s.mailbox(q, round).round.load(std::memory_order_acquire);
      if (q != s.local_rank() && (only < 0 || q == only) && v < round) {
        lag.push_back(fmt::format("world rank {} (mailbox round {} < {})", s.control(q).world_rank, v, round));
      }
    }
    return fmt::format("same-host peers in shared memory: {}", fmt::join(lag, ", "));
  };
  return c.until(std::move(ready), std::move(describe));
}

// A rank's mailboxes form a ring of K = kMailboxes: its mailbox of round r
// may be rewritten once every peer consumed round r - K. Ops where every
// rank waits for every other keep the ranks within one round of each other,
// but a rank that waits for nobody (the root of a broadcast, a non-root of
// a reduce) can run ahead, and a peer still reading round r - K would read
// round r's data. With K rounds of slack such a rank reads its peers'
// `consumed` lines only once every few ops.
inline uint64_t mailbox_free_after(uint64_t r) {
  constexpr uint64_t k = SegmentControl::kMailboxes;
  return r > k ? r - k : 0;
}
inline auto wait_mailbox_free(OpCtx& c, HostGroup* h, uint64_t r) {
  return wait_for(c, h, Counter::kConsumed, mailbox_free_after(r));
}

// The most data of a one-round op through the in-slots: the eager size,
// and what one rank's in-slot holds.
inline size_t eager_limit(const HostGroup* h) {
  return std::min(h->eager_bytes, static_cast<size_t>(h->local_size()) * h->seg->stripe_bytes());
}

// Slots of round r may be rewritten once every peer consumed round r - D.
inline auto wait_slots_free(OpCtx& c, HostGroup* h, uint64_t r) {
  uint64_t need = r > static_cast<uint64_t>(h->seg->depth()) ? r - static_cast<uint64_t>(h->seg->depth()) : 0;
  return wait_for(c, h, Counter::kConsumed, need);
}

// dst = reduction of srcs[0..] (srcs[0] may alias dst), n elements; halves
// are accumulated in f32 (`acc`, n floats) and rounded once.
inline void combine(char* dst, std::span<const char* const> srcs, size_t n, DType t, ReduceOp op, int64_t divisor,
                    float* acc) {
  if (n == 0) return;
  if (is_half(t)) {
    kernels::half_to_f32(srcs[0], acc, n, t);
    for (size_t i = 1; i < srcs.size(); ++i) kernels::reduce_half_into_f32(acc, srcs[i], n, t, carried(op));
    divide(acc, n, DType::kF32, divisor);
    kernels::f32_to_half(acc, dst, n, t);
    return;
  }
  reduce_into(dst, srcs[0], srcs[1], n, t, op);
  for (size_t i = 2; i < srcs.size(); ++i) reduce_inplace(dst, srcs[i], n, t, op);
  divide(dst, n, t, divisor);
}

// A result into user memory: with non-temporal stores for large ops (`nt`;
// they would only evict the caches), fenced unless the caller fences once
// after many pieces (each fence waits for the previous piece to reach
// memory).
inline void put_output(char* dst, const char* src, size_t n, bool nt, bool fence = true) {
  if (n == 0 || dst == src) return;
  if (!nt) {
    std::memcpy(dst, src, n);
  } else if (fence) {
    stream_copy(dst, src, n);
  } else {
    stream_copy_unfenced(dst, src, n);
  }
}

inline void publish_mailbox(HostGroup* h, uint64_t r, const void* in, size_t bytes) {
  SegmentMailbox& mine = h->seg->mailbox(h->local_rank(), r);
  std::memcpy(mine.data, in, bytes);
  mine.round.store(r, std::memory_order_release);
}

// Whether an op of `bytes` per rank first tries the zero-copy path (Note
// [Zero-copy host ops]).
inline bool zero_copy_wanted(const HostGroup* h, size_t bytes) {
  return h->zero_copy_bytes > 0 && bytes >= h->zero_copy_bytes && h->local_size() > 1;
}

// --- The forms of each op, by mechanism ---------------------------------------
// The op's entry point (host_collectives.h) has begun it (begin_op) and
// checked that the form applies; each form is the whole op. A zero-copy form
// first agrees with the peers (Note [Zero-copy host ops]): it sets `agreed`
// when it did the op, and otherwise leaves the op to the stripes. Arguments
// as in host_collectives.h.

// One round (host_one_round.cpp): through the mailboxes, up to
// SegmentMailbox::kBytes per rank, or through the in-slots ("eager"), up to
// eager_limit().
Task all_reduce_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                        int64_t divisor);
Task all_reduce_eager(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                      int64_t divisor);
Task reduce_scatter_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                            int64_t divisor);
Task reduce_scatter_eager(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                          int64_t divisor);
Task all_gather_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt);
Task all_gather_eager(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt);
Task reduce_mailbox(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                    int64_t divisor, int root);
Task broadcast_mailbox(OpCtx& c, HostGroup* h, void* buf, size_t bytes, int root);

// Zero-copy (host_zero_copy.cpp). `from`: where this rank's block starts in
// each peer's input (the all_to_all's first round).
Task all_reduce_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                          int64_t divisor, bool& agreed);
Task reduce_scatter_blocks_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, const std::vector<size_t>& len,
                                     const std::vector<size_t>& off, DType t, ReduceOp op, bool& agreed);
Task all_gather_blocks_zero_copy(OpCtx& c, HostGroup* h, void* out, const std::vector<size_t>& len,
                                 const std::vector<size_t>& off, DType t, bool& agreed);
Task reduce_scatter_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                              int64_t divisor, bool& agreed);
Task all_gather_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt, bool& agreed);
Task reduce_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                      int64_t divisor, int root, bool& agreed);
Task broadcast_zero_copy(OpCtx& c, HostGroup* h, void* buf, size_t bytes, int root, bool& agreed);
Task all_to_all_zero_copy(OpCtx& c, HostGroup* h, const char* in, size_t sends, char* out, size_t total,
                          const std::vector<size_t>& rdispl, const std::vector<size_t>& recv_counts, size_t elt,
                          const std::vector<uint64_t>& from, bool& agreed);

// The staging stripes (host_stripes.cpp): host_pass over one block per
// local rank, or (broadcast) the root's buffer through its in-slot.
Task all_reduce_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                        int64_t divisor);
Task reduce_scatter_blocks_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, std::vector<size_t> len,
                                   std::vector<size_t> off, DType t, ReduceOp op);
Task all_gather_blocks_stripes(OpCtx& c, HostGroup* h, void* out, std::vector<size_t> len, std::vector<size_t> off,
                               DType t);
Task reduce_scatter_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                            int64_t divisor);
Task all_gather_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt);
Task reduce_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                    int64_t divisor, int root);
Task broadcast_stripes(OpCtx& c, HostGroup* h, void* buf, size_t bytes, int root);

}  // namespace torus::comm::ofi
