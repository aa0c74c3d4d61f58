// Host-segment collectives (host_collectives.h); what they are made of (Note
// [Segment rounds], the counters, signatures and waits) is in host_rounds.h.
#include "comm/ofi/host_collectives.h"

#include <immintrin.h>

#include <algorithm>
#include <span>
#include <string_view>
#include <type_traits>

#include "comm/ofi/algo_step.h"
#include "comm/ofi/algorithms.h"
#include "comm/ofi/host_rounds.h"
#include "torus/comm/shared_host.h"

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

// --- Note [Zero-copy host ops] ---------------------------------------------

// One rank's buffers of a zero-copy op, as published in its mailbox.
struct ZeroCopyRef {
  uint64_t in_off = 0, out_off = 0;
  uint64_t in_bytes = 0;             // the sizes check
  uint64_t in_inode = 0, out_inode = 0;
  uint32_t in_id = 0, out_id = 0;    // 0: not shared host memory
  int32_t in_fd = -1, out_fd = -1;
};
static_assert(sizeof(ZeroCopyRef) <= SegmentMailbox::kBytes);
static_assert(std::is_trivially_copyable_v<ZeroCopyRef>);

// Every local rank's buffers, in this process's address space.
struct ZeroCopyViews {
  std::vector<const char*> in;
  std::vector<char*> out;
};

ZeroCopyRef zero_copy_ref(const void* in, size_t in_bytes, const void* out, size_t out_bytes) {
  ZeroCopyRef ref;
  ref.in_bytes = in_bytes;
  if (auto i = find_shared_host(in, in_bytes)) {
    ref.in_id = i->id, ref.in_off = i->offset, ref.in_fd = i->fd, ref.in_inode = i->inode;
  }
  if (auto o = find_shared_host(out, out_bytes)) {
    ref.out_id = o->id, ref.out_off = o->offset, ref.out_fd = o->fd, ref.out_inode = o->inode;
  }
  return ref;
}

// Publishes one mailbox round's `bytes` from `data`, waits for every peer's,
// copies them into h->gathered (bytes each, rank order; this rank's too)
// and is done with the round.
Task exchange_mailboxes(OpCtx& c, HostGroup* h, const void* data, size_t bytes) {
  const HostSegment& s = *h->seg;
  const int L = s.local_size();
  const uint64_t r = ++h->round;
  co_await wait_mailbox_free(c, h, r);
  publish_mailbox(h, r, data, bytes);
  co_await wait_mailboxes(c, h, r);
  note_all_consumed(h, r);
  std::vector<char>& got = h->gathered;
  got.resize(static_cast<size_t>(L) * bytes);
  for (int q = 0; q < L; ++q) {
    const void* from = q == s.local_rank() ? data : static_cast<const void*>(s.mailbox(q, r).data);
    std::memcpy(got.data() + static_cast<size_t>(q) * bytes, from, bytes);
  }
  signal(h, Counter::kConsumed, r);
}

// Which of the peers' buffers an op reads or writes: only those must be
// shared host memory, and only those are mapped.
struct ZeroCopyNeeds {
  bool inputs = true;   // every rank's input (or only `only_input_of`'s)
  bool outputs = true;  // every rank's output (or only `only_output_of`'s)
  int only_input_of = -1;
  int only_output_of = -1;
  bool same_sizes = true;  // every rank's input has the same size (checked); false: an uneven all_to_all
  bool input(int q) const { return inputs && (only_input_of < 0 || q == only_input_of); }
  bool output(int q) const { return outputs && (only_output_of < 0 || q == only_output_of); }
};

// Two mailbox rounds: do the ranks' `in` (in_bytes) and `out` (out_bytes)
// that the op needs lie in shared host memory that every rank could map?
// Every rank reaches the same answer; when it is yes, `v` holds those
// buffers as this process sees them (and this rank's own).
Task zero_copy_agree(OpCtx& c, HostGroup* h, const void* in, size_t in_bytes, void* out, size_t out_bytes,
                     ZeroCopyNeeds needs, bool& agreed, ZeroCopyViews& v) {
  agreed = false;
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  h->peers->begin_op();
  const ZeroCopyRef mine = zero_copy_ref(in, in_bytes, out, out_bytes);
  co_await exchange_mailboxes(c, h, &mine, sizeof mine);
  std::vector<ZeroCopyRef> refs(static_cast<size_t>(L));
  std::memcpy(refs.data(), h->gathered.data(), refs.size() * sizeof(ZeroCopyRef));
  bool all_shared = true;
  for (int q = 0; q < L; ++q) {
    const ZeroCopyRef& ref = refs[static_cast<size_t>(q)];
    TORUS_CHECK(!needs.same_sizes || ref.in_bytes == in_bytes, InvalidArgument,
                "{}: local ranks disagree on the size: world rank {} has {} bytes per rank, world rank {} has {}",
                c.info().describe(), s.control(me).world_rank, in_bytes, s.control(q).world_rank, ref.in_bytes);
    all_shared = all_shared && (!needs.input(q) || ref.in_id != 0) && (!needs.output(q) || ref.out_id != 0);
  }
  if (!all_shared) co_return;
  // Map the peers' buffers; a second round agrees that all ranks could.
  v.in.assign(static_cast<size_t>(L), nullptr);
  v.out.assign(static_cast<size_t>(L), nullptr);
  char ok = 1;
  for (int q = 0; q < L && ok; ++q) {
    const ZeroCopyRef& ref = refs[static_cast<size_t>(q)];
    if (q == me) {
      v.in[static_cast<size_t>(q)] = static_cast<const char*>(in);
      v.out[static_cast<size_t>(q)] = static_cast<char*>(out);
      continue;
    }
    const int pid = s.control(q).pid;
    if (needs.input(q)) {
      char* i = h->peers->map(pid, ref.in_id, ref.in_fd, ref.in_inode, ref.in_off + ref.in_bytes, ref.in_off);
      ok = ok && i != nullptr;
      if (i != nullptr) v.in[static_cast<size_t>(q)] = i + ref.in_off;
    }
    if (needs.output(q) && ok) {
      char* o = h->peers->map(pid, ref.out_id, ref.out_fd, ref.out_inode, ref.out_off + out_bytes, ref.out_off);
      ok = ok && o != nullptr;
      if (o != nullptr) v.out[static_cast<size_t>(q)] = o + ref.out_off;
    }
  }
  co_await exchange_mailboxes(c, h, &ok, 1);
  agreed = std::all_of(h->gathered.begin(), h->gathered.end(), [](char x) { return x != 0; });
  if (agreed && !h->zero_copy_logged) {
    h->zero_copy_logged = true;
    TORUS_LOG_DEBUG("{}: every local rank's buffers are shared host memory: zero-copy host path",
                    c.info().describe());
  }
}

// The last round of a zero-copy op: every rank has finished reading the
// others' inputs and writing their outputs (its stores are fenced first).
std::atomic<uint64_t> zero_copy_count{0};

Task zero_copy_done(OpCtx& c, HostGroup* h) {
  _mm_sfence();
  zero_copy_count.fetch_add(1, std::memory_order_relaxed);
  const char done = 1;
  co_await exchange_mailboxes(c, h, &done, 1);
}

// Results go to the outputs with non-temporal stores from nt_bytes on,
// fenced once by zero_copy_done.
void zero_copy_put(const HostGroup* h, size_t total, char* dst, const char* src, size_t n) {
  put_output(dst, src, n, total >= h->nt_bytes, false);
}

// Block `q` of a zero-copy op: [first, first + len) elements, cut at
// multiples of 64 bytes from the buffers' start, so that no two ranks write
// one cache line when the buffers are 64-byte aligned.
std::pair<size_t, size_t> zero_copy_block(size_t count, size_t e, int L, int q) {
  const size_t unit = std::max<size_t>(1, 64 / e);
  const algo::Partition p = algo::balanced((count + unit - 1) / unit, L);
  const size_t uq = static_cast<size_t>(q);
  const size_t first = std::min(count, p.off[uq] * unit);
  return {first, std::min(count, (p.off[uq] + p.len[uq]) * unit) - first};
}

// The elements of one pass of a zero-copy combine: 16 KiB, in L1.
constexpr size_t kZeroCopyChunkBytes = 16 << 10;

// The f32 sum with non-temporal results, fused: 64 bytes of every input
// summed in rank order (as combine does, so the bits are the same) and
// streamed to each output straight from the register. Every output must be
// 64-byte aligned at its first element. Against the chunked form below this
// keeps the reads and the writes in flight together: 14 against 11 GB/s of
// busbw for a 64 MiB all_reduce on 2 ranks here.
__attribute__((target("avx512f"))) void zero_copy_sum_f32_nt(const std::vector<const char*>& in,
                                                             const std::vector<char*>& out, size_t in_first,
                                                             size_t out_first, size_t n, int only) {
  const size_t L = in.size();
  auto src = [&](size_t q, size_t i) { return reinterpret_cast<const float*>(in[q]) + in_first + i; };
  auto dst = [&](size_t q, size_t i) { return reinterpret_cast<float*>(out[q]) + out_first + i; };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(src(0, i)), _mm512_loadu_ps(src(1, i)));
    for (size_t q = 2; q < L; ++q) v = _mm512_add_ps(v, _mm512_loadu_ps(src(q, i)));
    for (size_t q = 0; q < L; ++q) {
      if (only < 0 || q == static_cast<size_t>(only)) _mm512_stream_ps(dst(q, i), v);
    }
  }
  for (; i < n; ++i) {
    float v = *src(0, i) + *src(1, i);
    for (size_t q = 2; q < L; ++q) v += *src(q, i);
    for (size_t q = 0; q < L; ++q) {
      if (only < 0 || q == static_cast<size_t>(only)) *dst(q, i) = v;
    }
  }
}

bool cpu_has_avx512f() {
  static const bool yes = std::string_view(kernels::reduce_isa()) == "avx512";
  return yes;
}

// dst_q[out_first + i] for every output q (or only `only_output`'s, when it
// is a rank) = the reduction, in rank order, of src_q[in_first + i] over
// every input q, i < n; `total` is the op's size (for the store kind).
void zero_copy_reduce(OpCtx& c, HostGroup* h, const ZeroCopyViews& v, size_t in_first, size_t out_first, size_t n,
                      DType t, ReduceOp op, int64_t divisor, int only_output, size_t total) {
  const int L = h->local_size();
  const size_t e = dtype_size(t), ce = kZeroCopyChunkBytes / e;
  // kAvg without a divisor (the host phase of a hierarchical average) is a sum.
  const bool sum = op == ReduceOp::kSum || (op == ReduceOp::kAvg && divisor <= 1);
  if (t == DType::kF32 && sum && divisor <= 1 && total >= h->nt_bytes && cpu_has_avx512f()) {
    bool aligned = true;
    for (int q = 0; q < L; ++q) {
      if (only_output < 0 || q == only_output) {
        aligned = aligned && reinterpret_cast<uintptr_t>(v.out[static_cast<size_t>(q)] + out_first * e) % 64 == 0;
      }
    }
    if (aligned) {
      zero_copy_sum_f32_nt(v.in, v.out, in_first, out_first, n, only_output);
      return;
    }
  }
  char* chunk = c.scratch(kZeroCopyChunkBytes + (is_half(t) ? ce * sizeof(float) : 0));
  float* acc = is_half(t) ? reinterpret_cast<float*>(chunk + kZeroCopyChunkBytes) : nullptr;
  std::vector<const char*>& srcs = h->srcs;
  srcs.resize(static_cast<size_t>(L));
  for (size_t done = 0; done < n; done += ce) {
    const size_t m = std::min(ce, n - done);
    for (int q = 0; q < L; ++q) srcs[static_cast<size_t>(q)] = v.in[static_cast<size_t>(q)] + (in_first + done) * e;
    combine(chunk, srcs, m, t, op, divisor, acc);
    for (int q = 0; q < L; ++q) {
      if (only_output < 0 || q == only_output) {
        zero_copy_put(h, total, v.out[static_cast<size_t>(q)] + (out_first + done) * e, chunk, m * e);
      }
    }
  }
}

}  // namespace

size_t host_inline_max_bytes(const HostGroup* h) { return std::max(SegmentMailbox::kBytes, eager_limit(h)); }

uint64_t host_zero_copy_ops() { return zero_copy_count.load(std::memory_order_relaxed); }

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

Task host_pass(OpCtx& c, HostGroup* h, HostPass a) {
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  const size_t e = dtype_size(a.dtype), stripe = s.stripe_bytes(), ce = stripe / e;
  const size_t um = static_cast<size_t>(me);
  size_t rounds = 0, total = 0;
  for (size_t l : a.len) {
    rounds = std::max(rounds, algo::chunks_of(l, ce));
    total += l * e;
  }
  const bool reduce = a.in != nullptr;
  const bool i_gather = a.gather && (a.gather_root < 0 || a.gather_root == me);
  auto put = [nt = total >= h->nt_bytes](char* dst, const char* src, size_t n) { put_output(dst, src, n, nt); };
  auto len = [&](int p, size_t t) { return algo::chunk_len(a.len[static_cast<size_t>(p)], ce, t); };
  // This rank's stripe t of every other block into its in-slot of round r.
  auto copy_in = [&](size_t t, uint64_t r) {
    char* slot = s.in_slot(me, r);
    for (int p = 0; p < L; ++p) {
      size_t n = len(p, t);
      if (p != me && n > 0) {
        std::memcpy(slot + static_cast<size_t>(p) * stripe, a.in + (a.in_off[static_cast<size_t>(p)] + t * ce) * e,
                    n * e);
      }
    }
    signal(h, Counter::kCopied, r);
  };
  float* acc = is_half(a.dtype) && reduce ? reinterpret_cast<float*>(c.scratch(ce * sizeof(float))) : nullptr;
  std::vector<const char*> srcs(static_cast<size_t>(L));
  const uint64_t base = h->round;
  h->round += rounds;
  // Software pipeline: the copy-in of round t+1 runs before this rank waits
  // for the peers' results of round t.
  if (reduce && rounds > 0) {
    co_await wait_slots_free(c, h, base + 1);
    copy_in(0, base + 1);
  }
  for (size_t t = 0; t < rounds; ++t) {
    const uint64_t r = base + t + 1;
    const size_t m = len(me, t);
    char* mine = s.out_slot(me, r);
    if (reduce) {
      co_await wait_for(c, h, Counter::kCopied, r);
      if (m > 0) {
        srcs[0] = a.in + (a.in_off[um] + t * ce) * e;
        for (int q = 0, i = 1; q < L; ++q) {
          if (q != me) srcs[static_cast<size_t>(i++)] = s.in_slot(q, r) + um * stripe;
        }
        combine(mine, srcs, m, a.dtype, a.op, a.divisor, acc);
        if (a.my_dst != nullptr) put(a.my_dst + t * ce * e, mine, m * e);
      }
    } else if (a.gather) {
      co_await wait_slots_free(c, h, r);
      const char* src = a.my_src + t * ce * e;
      std::memcpy(mine, src, m * e);
      if (a.out != nullptr) put(a.out + (a.out_off[um] + t * ce) * e, src, m * e);
    }
    if (a.gather) signal(h, Counter::kReduced, r);
    if (reduce && t + 1 < rounds) {
      co_await wait_slots_free(c, h, r + 1);
      copy_in(t + 1, r + 1);
    }
    if (i_gather) {
      co_await wait_for(c, h, Counter::kReduced, r);
      for (int q = 0; q < L; ++q) {
        if (q != me) put(a.out + (a.out_off[static_cast<size_t>(q)] + t * ce) * e, s.out_slot(q, r), len(q, t) * e);
      }
    }
    signal(h, Counter::kConsumed, r);
  }
}

Task host_all_reduce(OpCtx& c, HostGroup* h, const void* in_v, void* out_v, size_t count, DType t, ReduceOp op,
                     int64_t divisor) {
  begin_op(h, op_signature(OpType::kAllReduce, t, op, -1, count));
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  const size_t e = dtype_size(t), bytes = count * e;
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  if (bytes <= SegmentMailbox::kBytes) {
    const uint64_t r = ++h->round;
    co_await wait_mailbox_free(c, h, r);
    publish_mailbox(h, r, in, bytes);
    co_await wait_mailboxes(c, h, r);
    note_all_consumed(h, r);
    combine_mailboxes(h, r, in, out, count, t, op, divisor);
    co_return;
  }
  if (bytes <= eager_limit(h)) {
    const uint64_t r = ++h->round;
    co_await wait_slots_free(c, h, r);
    std::memcpy(s.in_slot(me, r), in, bytes);
    signal(h, Counter::kCopied, r);
    co_await wait_for(c, h, Counter::kCopied, r);
    note_all_consumed(h, r);
    combine_slots(h, r, in, out, count, t, op, divisor, &c);
    co_return;
  }
  if (zero_copy_wanted(h, bytes)) {
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, in, bytes, out, bytes, {}, agreed, v);
    if (agreed) {
      auto [first, n] = zero_copy_block(count, e, L, me);
      zero_copy_reduce(c, h, v, first, first, n, t, op, divisor, -1, bytes);
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  algo::Partition p = algo::balanced(count, L);
  HostPass a;
  a.dtype = t;
  a.op = op;
  a.divisor = divisor;
  a.len = p.len;
  a.in = in;
  a.in_off = p.off;
  a.my_dst = out + p.off[static_cast<size_t>(me)] * e;
  a.gather = true;
  a.out = out;
  a.out_off = p.off;
  co_await host_pass(c, h, std::move(a));
}

Task host_reduce_scatter_blocks(OpCtx& c, HostGroup* h, const void* in, void* out_v, std::vector<size_t> len,
                                std::vector<size_t> off, DType t, ReduceOp op) {
  begin_op(h, op_signature(OpType::kReduceScatter, t, op, -1, off.back() + len.back()));
  const size_t me = static_cast<size_t>(h->local_rank()), e = dtype_size(t);
  const size_t bytes = (off.back() + len.back()) * e;
  char* out = static_cast<char*>(out_v);
  if (zero_copy_wanted(h, bytes)) {
    // Local rank i reduces its block straight from every rank's input.
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, in, bytes, out, bytes, {.inputs = true, .outputs = false}, agreed, v);
    if (agreed) {
      zero_copy_reduce(c, h, v, off[me], off[me], len[me], t, op, 0, static_cast<int>(me), bytes);
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  HostPass rs;
  rs.dtype = t;
  rs.op = op;
  rs.in = static_cast<const char*>(in);
  rs.my_dst = out + off[me] * e;
  rs.len = std::move(len);
  rs.in_off = std::move(off);
  co_await host_pass(c, h, std::move(rs));
}

Task host_all_gather_blocks(OpCtx& c, HostGroup* h, void* out_v, std::vector<size_t> len, std::vector<size_t> off,
                            DType t) {
  begin_op(h, op_signature(OpType::kAllGather, t, ReduceOp::kSum, -1, off.back() + len.back()));
  const size_t me = static_cast<size_t>(h->local_rank()), e = dtype_size(t);
  const size_t bytes = (off.back() + len.back()) * e;
  char* out = static_cast<char*>(out_v);
  if (zero_copy_wanted(h, bytes)) {
    // Local rank i writes its block into every rank's output.
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, nullptr, 0, out, bytes, {.inputs = false, .outputs = true}, agreed, v);
    if (agreed) {
      for (size_t q = 0; q < v.out.size(); ++q) {
        if (q != me) zero_copy_put(h, bytes, v.out[q] + off[me] * e, out + off[me] * e, len[me] * e);
      }
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  HostPass ag;
  ag.dtype = t;
  ag.my_src = out + off[me] * e;
  ag.gather = true;
  ag.out = out;
  ag.len = std::move(len);
  ag.out_off = std::move(off);
  co_await host_pass(c, h, std::move(ag));
}

Task host_reduce_scatter(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                         int64_t divisor) {
  begin_op(h, op_signature(OpType::kReduceScatter, t, op, -1, count));
  const size_t L = static_cast<size_t>(h->local_size());
  if (const size_t block = count * dtype_size(t); L * block <= SegmentMailbox::kBytes && count > 0) {
    // One mailbox round: every rank publishes its whole input and reduces
    // its own block from all of them, in rank order.
    const HostSegment& s = *h->seg;
    const size_t me = static_cast<size_t>(s.local_rank());
    const uint64_t r = ++h->round;
    co_await wait_mailbox_free(c, h, r);
    publish_mailbox(h, r, in, L * block);
    co_await wait_mailboxes(c, h, r);
    note_all_consumed(h, r);
    combine_mailboxes(h, r, static_cast<const char*>(in) + me * block, out, count, t, op, divisor, me * block);
    co_return;
  }
  if (const size_t block = count * dtype_size(t); L * block <= eager_limit(h) && count > 0) {
    // One round through the in-slots, as the eager all_reduce.
    const HostSegment& s = *h->seg;
    const size_t me = static_cast<size_t>(s.local_rank());
    const uint64_t r = ++h->round;
    co_await wait_slots_free(c, h, r);
    std::memcpy(s.in_slot(static_cast<int>(me), r), in, L * block);
    signal(h, Counter::kCopied, r);
    co_await wait_for(c, h, Counter::kCopied, r);
    note_all_consumed(h, r);
    combine_slots(h, r, static_cast<const char*>(in) + me * block, out, count, t, op, divisor, &c, me * block);
    co_return;
  }
  HostPass a;
  a.dtype = t;
  a.op = op;
  a.divisor = divisor;
  if (const size_t block = count * dtype_size(t); zero_copy_wanted(h, L * block) && count > 0) {
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, in, L * block, out, block, {.inputs = true, .outputs = false}, agreed, v);
    if (agreed) {
      const size_t me = static_cast<size_t>(h->local_rank());
      zero_copy_reduce(c, h, v, me * count, 0, count, t, op, divisor, static_cast<int>(me), L * block);
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  a.len.assign(L, count);
  for (size_t i = 0; i < L; ++i) a.in_off.push_back(i * count);
  a.in = static_cast<const char*>(in);
  a.my_dst = static_cast<char*>(out);
  co_await host_pass(c, h, std::move(a));
}

Task host_all_gather(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt) {
  begin_op(h, op_signature(OpType::kAllGather, kBytes, ReduceOp::kSum, -1, count * elt));
  const size_t L = static_cast<size_t>(h->local_size());
  if (const size_t block = count * elt; block <= SegmentMailbox::kBytes && count > 0) {
    // One mailbox round; this rank's own block comes from its input.
    const HostSegment& s = *h->seg;
    const size_t me = static_cast<size_t>(s.local_rank());
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
    co_return;
  }
  if (const size_t block = count * elt; L * block <= eager_limit(h) && count > 0) {
    // One round through the in-slots: every rank stages its block, all copy
    // all of them out.
    const HostSegment& s = *h->seg;
    const size_t me = static_cast<size_t>(s.local_rank());
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
    co_return;
  }
  if (const size_t block = count * elt; zero_copy_wanted(h, L * block) && count > 0) {
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, in, block, out, L * block, {.inputs = false, .outputs = true}, agreed, v);
    if (agreed) {
      // This rank's block into every output, a chunk at a time (read once).
      const size_t me = static_cast<size_t>(h->local_rank());
      for (size_t done = 0; done < block; done += kZeroCopyChunkBytes) {
        const size_t m = std::min(kZeroCopyChunkBytes, block - done);
        for (size_t q = 0; q < L; ++q) {
          zero_copy_put(h, L * block, v.out[q] + me * block + done, static_cast<const char*>(in) + done, m);
        }
      }
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  HostPass a;
  a.dtype = elt == 8 ? DType::kI64 : elt == 4 ? DType::kI32 : elt == 2 ? DType::kF16 : DType::kU8;
  a.len.assign(L, count);
  for (size_t i = 0; i < L; ++i) a.out_off.push_back(i * count);
  a.my_src = static_cast<const char*>(in);
  a.gather = true;
  a.out = static_cast<char*>(out);
  co_await host_pass(c, h, std::move(a));
}

Task host_reduce(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                 int64_t divisor, int root) {
  begin_op(h, op_signature(OpType::kReduce, t, op, root, count));
  const size_t e = dtype_size(t);
  if (count * e <= SegmentMailbox::kBytes && count > 0) {
    // One mailbox round; only the root waits (the others may run ahead:
    // wait_mailbox_free keeps them from overwriting what it has not read).
    const HostSegment& s = *h->seg;
    const int me = s.local_rank();
    const uint64_t r = ++h->round;
    co_await wait_mailbox_free(c, h, r);
    publish_mailbox(h, r, in, count * e);
    if (me == root) {
      co_await wait_mailboxes(c, h, r);
      note_all_consumed(h, r);
      combine_mailboxes(h, r, in, out, count, t, op, divisor);
    } else {
      signal(h, Counter::kConsumed, r);
    }
    co_return;
  }
  const bool is_root = h->local_rank() == root;
  if (zero_copy_wanted(h, count * e) && count > 0) {
    // Local rank i reduces block i from every input into the root's output.
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, in, count * e, is_root ? out : nullptr, count * e,
                             {.inputs = true, .outputs = true, .only_output_of = root}, agreed, v);
    if (agreed) {
      auto [first, n] = zero_copy_block(count, e, h->local_size(), h->local_rank());
      zero_copy_reduce(c, h, v, first, first, n, t, op, divisor, root, count * e);
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  algo::Partition p = algo::balanced(count, h->local_size());
  HostPass a;
  a.dtype = t;
  a.op = op;
  a.divisor = divisor;
  a.len = p.len;
  a.in = static_cast<const char*>(in);
  a.in_off = p.off;
  a.my_dst = is_root ? static_cast<char*>(out) + p.off[static_cast<size_t>(root)] * e : nullptr;
  a.gather = true;
  a.gather_root = root;
  a.out = is_root ? static_cast<char*>(out) : nullptr;
  a.out_off = p.off;
  co_await host_pass(c, h, std::move(a));
}

Task host_broadcast(OpCtx& c, HostGroup* h, void* buf_v, size_t bytes, int root) {
  begin_op(h, op_signature(OpType::kBroadcast, kBytes, ReduceOp::kSum, root, bytes));
  const HostSegment& s = *h->seg;
  const int me = s.local_rank();
  char* buf = static_cast<char*>(buf_v);
  if (bytes <= SegmentMailbox::kBytes && bytes > 0) {
    // One mailbox round: the root publishes and goes on; the others copy.
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
    co_return;
  }
  if (zero_copy_wanted(h, bytes)) {
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, buf, bytes, buf, bytes, {.inputs = true, .outputs = false, .only_input_of = root},
                             agreed, v);
    if (agreed) {
      // Every other rank copies the root's buffer; the root waits for them.
      if (me != root) zero_copy_put(h, bytes, buf, v.in[static_cast<size_t>(root)], bytes);
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  const size_t S = static_cast<size_t>(s.local_size()) * s.stripe_bytes();
  const size_t rounds = algo::chunks_of(bytes, S);
  for (size_t t = 0; t < rounds; ++t) {
    const uint64_t r = ++h->round;
    const size_t n = algo::chunk_len(bytes, S, t);
    if (me == root) {
      co_await wait_slots_free(c, h, r);
      std::memcpy(s.in_slot(me, r), buf + t * S, n);
      signal(h, Counter::kCopied, r);
    } else {
      co_await wait_for(c, h, Counter::kCopied, r, root);
      std::memcpy(buf + t * S, s.in_slot(root, r), n);
    }
    signal(h, Counter::kConsumed, r);
  }
}

Task host_all_to_all(OpCtx& c, HostGroup* h, const void* in_v, void* out_v, std::vector<size_t> send_counts,
                     std::vector<size_t> recv_counts, size_t elt) {
  begin_op(h, op_signature(OpType::kAllToAll, kBytes, ReduceOp::kSum, -1, elt));
  const HostSegment& s = *h->seg;
  const int L = s.local_size(), me = s.local_rank();
  const size_t stripe = s.stripe_bytes(), um = static_cast<size_t>(me);
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  std::vector<size_t> sdispl(static_cast<size_t>(L), 0), rdispl(static_cast<size_t>(L), 0);
  size_t largest = 0, total = 0;
  for (size_t q = 0; q < static_cast<size_t>(L); ++q) {
    if (q > 0) {
      sdispl[q] = sdispl[q - 1] + send_counts[q - 1] * elt;
      rdispl[q] = rdispl[q - 1] + recv_counts[q - 1] * elt;
    }
    if (q != um) largest = std::max({largest, send_counts[q] * elt, recv_counts[q] * elt});
    total += recv_counts[q] * elt;
  }
  // Only the pairs know their block sizes, so the ranks agree on the number
  // of rounds, and on whether every rank's input is large enough and in
  // shared host memory (the zero-copy path, equal blocks or not), through
  // their mailboxes. That first round also carries the first stripe of
  // every block in the in-slots, from each rank that does not offer
  // zero-copy: a small all_to_all is one round.
  const bool nt = total >= h->nt_bytes;
  auto copy_in = [&](size_t t, uint64_t r) {
    char* slot = s.in_slot(me, r);
    for (size_t q = 0; q < static_cast<size_t>(L); ++q) {
      size_t n = algo::chunk_len(send_counts[q] * elt, stripe, t);
      if (q != um && n > 0) std::memcpy(slot + q * stripe, in + sdispl[q] + t * stripe, n);
    }
  };
  auto copy_out = [&](size_t t, uint64_t r) {
    for (size_t q = 0; q < static_cast<size_t>(L); ++q) {
      size_t n = algo::chunk_len(recv_counts[q] * elt, stripe, t);
      if (q == um || n == 0) continue;
      put_output(out + rdispl[q] + t * stripe, s.in_slot(static_cast<int>(q), r) + um * stripe, n, nt);
    }
  };
  static_assert(sizeof(size_t) == sizeof(uint64_t));  // sdispl travels as it is
  const size_t sends = sdispl[static_cast<size_t>(L) - 1] + send_counts[static_cast<size_t>(L) - 1] * elt;
  uint64_t most = largest;
  bool all_zero_copy = true, any_zero_copy = false;
  std::vector<uint64_t>& from = h->offsets;  // zero-copy: where this rank's block starts in each peer's input
  {
    // A rank that offers zero-copy carries, instead of data, where each
    // peer's block starts in its input (the peers cannot know: uneven).
    const bool eligible = sends > 0 && zero_copy_wanted(h, std::max(sends, total)) && is_shared_host(in, sends);
    const uint64_t r = ++h->round;
    co_await wait_mailbox_free(c, h, r);
    co_await wait_slots_free(c, h, r);
    if (eligible) {
      // Block q is [sdispl[q], end) with end = sdispl[q + 1], or `sends`.
      char* slot = s.in_slot(me, r);
      std::memcpy(slot, sdispl.data(), static_cast<size_t>(L) * sizeof(uint64_t));
      const uint64_t end = sends;
      std::memcpy(slot + static_cast<size_t>(L) * sizeof(uint64_t), &end, sizeof(end));
    } else {
      copy_in(0, r);
    }
    const uint64_t mine[2] = {largest, eligible ? 1u : 0u};
    publish_mailbox(h, r, mine, sizeof(mine));  // after the slot: a peer that sees it sees the slot
    co_await wait_mailboxes(c, h, r);
    note_all_consumed(h, r);
    for (int q = 0; q < L; ++q) {
      uint64_t v[2];
      std::memcpy(v, q == me ? static_cast<const void*>(mine) : s.mailbox(q, r).data, sizeof(v));
      most = std::max(most, v[0]);
      all_zero_copy = all_zero_copy && v[1] != 0;
      any_zero_copy = any_zero_copy || v[1] != 0;
    }
    int disagrees = -1;  // a peer whose block for this rank is not the size this rank expects
    uint64_t theirs = 0;
    if (all_zero_copy) {
      from.resize(static_cast<size_t>(L));
      for (size_t q = 0; q < static_cast<size_t>(L); ++q) {
        uint64_t range[2];
        std::memcpy(range, s.in_slot(static_cast<int>(q), r) + um * sizeof(uint64_t), sizeof(range));
        from[q] = range[0];
        if (range[1] - range[0] != recv_counts[q] * elt && disagrees < 0) {
          disagrees = static_cast<int>(q);
          theirs = range[1] - range[0];
        }
      }
    }
    if (!any_zero_copy) copy_out(0, r);  // every rank carried its first stripe
    signal(h, Counter::kConsumed, r);
    // Reading past a peer's block would read its other memory: refuse.
    TORUS_CHECK(disagrees < 0, InvalidArgument,
                "{}: world rank {} sends {} bytes to this rank, which expects {} (the ranks' all_to_all counts "
                "disagree)",
                c.info().describe(), s.control(disagrees < 0 ? 0 : disagrees).world_rank, theirs,
                disagrees < 0 ? 0 : recv_counts[static_cast<size_t>(disagrees)] * elt);
  }
  if (all_zero_copy) {
    // Every rank copies its block of every input into its own output.
    bool agreed = false;
    ZeroCopyViews v;
    co_await zero_copy_agree(c, h, in, sends, out, total, {.inputs = true, .outputs = false, .same_sizes = false},
                             agreed, v);
    if (agreed) {
      for (size_t q = 0; q < static_cast<size_t>(L); ++q) {
        zero_copy_put(h, total, out + rdispl[q], v.in[q] + from[q], recv_counts[q] * elt);
      }
      co_await zero_copy_done(c, h);
      co_return;
    }
  }
  copy_bytes(out + rdispl[um], in + sdispl[um], send_counts[um] * elt);
  // The stripes that remain: all of them where a rank offered zero-copy
  // (it carried none), else all but the first.
  const size_t chunks = algo::chunks_of(most, stripe);
  const size_t first = any_zero_copy ? 0 : 1;
  const size_t rounds = chunks > first ? chunks - first : 0;
  const uint64_t base = h->round;
  h->round += rounds;
  if (rounds > 0) {
    co_await wait_slots_free(c, h, base + 1);
    copy_in(first, base + 1);
    signal(h, Counter::kCopied, base + 1);
  }
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t r = base + k + 1;
    co_await wait_for(c, h, Counter::kCopied, r);
    copy_out(first + k, r);
    signal(h, Counter::kConsumed, r);
    if (k + 1 < rounds) {
      co_await wait_slots_free(c, h, r + 1);
      copy_in(first + k + 1, r + 1);
      signal(h, Counter::kCopied, r + 1);
    }
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
