// The zero-copy paths of the host collectives (Note [Zero-copy host ops] in
// host_collectives.h). zero_copy_agree is the agreement: in its first
// mailbox round each rank publishes where its buffers are (a ZeroCopyRef:
// the shared-memory object, offset and size; torus/comm/shared_host.h) and
// maps the peers' buffers that the op needs (peer_mappings.h); in the
// second each says whether that worked. Then each rank does its share, and
// zero_copy_done fences its stores and spends the last round.
//
// A reducing op cuts the elements into one block per local rank at
// multiples of 64 bytes, so that no two ranks write one cache line, and
// local rank i reduces block i from every input in rank order, 16 KiB at a
// time through scratch, into the outputs that need it; a large f32 sum with
// 64-byte aligned outputs on an AVX-512 machine instead streams each sum
// from the register to every output. Results go out with non-temporal
// stores from HostGroup::nt_bytes on, fenced once at the end.
#include <immintrin.h>

#include <algorithm>
#include <string_view>
#include <type_traits>

#include "comm/ofi/algorithms.h"
#include "comm/ofi/host_rounds.h"
#include "torus/comm/shared_host.h"

namespace torus::comm::ofi {
namespace {

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

uint64_t host_zero_copy_ops() { return zero_copy_count.load(std::memory_order_relaxed); }

Task all_reduce_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                          int64_t divisor, bool& agreed) {
  const size_t e = dtype_size(t), bytes = count * e;
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, in, bytes, out, bytes, {}, agreed, v);
  if (!agreed) co_return;
  auto [first, n] = zero_copy_block(count, e, h->local_size(), h->local_rank());
  zero_copy_reduce(c, h, v, first, first, n, t, op, divisor, -1, bytes);
  co_await zero_copy_done(c, h);
}

Task reduce_scatter_blocks_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, const std::vector<size_t>& len,
                                     const std::vector<size_t>& off, DType t, ReduceOp op, bool& agreed) {
  // Local rank i reduces its block straight from every rank's input.
  const size_t me = static_cast<size_t>(h->local_rank());
  const size_t bytes = (off.back() + len.back()) * dtype_size(t);
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, in, bytes, out, bytes, {.inputs = true, .outputs = false}, agreed, v);
  if (!agreed) co_return;
  zero_copy_reduce(c, h, v, off[me], off[me], len[me], t, op, 0, static_cast<int>(me), bytes);
  co_await zero_copy_done(c, h);
}

Task all_gather_blocks_zero_copy(OpCtx& c, HostGroup* h, void* out_v, const std::vector<size_t>& len,
                                 const std::vector<size_t>& off, DType t, bool& agreed) {
  // Local rank i writes its block into every rank's output.
  const size_t me = static_cast<size_t>(h->local_rank()), e = dtype_size(t);
  const size_t bytes = (off.back() + len.back()) * e;
  char* out = static_cast<char*>(out_v);
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, nullptr, 0, out, bytes, {.inputs = false, .outputs = true}, agreed, v);
  if (!agreed) co_return;
  for (size_t q = 0; q < v.out.size(); ++q) {
    if (q != me) zero_copy_put(h, bytes, v.out[q] + off[me] * e, out + off[me] * e, len[me] * e);
  }
  co_await zero_copy_done(c, h);
}

Task reduce_scatter_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                              int64_t divisor, bool& agreed) {
  const size_t L = static_cast<size_t>(h->local_size()), block = count * dtype_size(t);
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, in, L * block, out, block, {.inputs = true, .outputs = false}, agreed, v);
  if (!agreed) co_return;
  const size_t me = static_cast<size_t>(h->local_rank());
  zero_copy_reduce(c, h, v, me * count, 0, count, t, op, divisor, static_cast<int>(me), L * block);
  co_await zero_copy_done(c, h);
}

Task all_gather_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt, bool& agreed) {
  const size_t L = static_cast<size_t>(h->local_size()), block = count * elt;
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, in, block, out, L * block, {.inputs = false, .outputs = true}, agreed, v);
  if (!agreed) co_return;
  // This rank's block into every output, a chunk at a time (read once).
  const size_t me = static_cast<size_t>(h->local_rank());
  for (size_t done = 0; done < block; done += kZeroCopyChunkBytes) {
    const size_t m = std::min(kZeroCopyChunkBytes, block - done);
    for (size_t q = 0; q < L; ++q) {
      zero_copy_put(h, L * block, v.out[q] + me * block + done, static_cast<const char*>(in) + done, m);
    }
  }
  co_await zero_copy_done(c, h);
}

Task reduce_zero_copy(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                      int64_t divisor, int root, bool& agreed) {
  // Local rank i reduces block i from every input into the root's output.
  const size_t e = dtype_size(t);
  const bool is_root = h->local_rank() == root;
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, in, count * e, is_root ? out : nullptr, count * e,
                           {.inputs = true, .outputs = true, .only_output_of = root}, agreed, v);
  if (!agreed) co_return;
  auto [first, n] = zero_copy_block(count, e, h->local_size(), h->local_rank());
  zero_copy_reduce(c, h, v, first, first, n, t, op, divisor, root, count * e);
  co_await zero_copy_done(c, h);
}

Task broadcast_zero_copy(OpCtx& c, HostGroup* h, void* buf_v, size_t bytes, int root, bool& agreed) {
  char* buf = static_cast<char*>(buf_v);
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, buf, bytes, buf, bytes, {.inputs = true, .outputs = false, .only_input_of = root},
                           agreed, v);
  if (!agreed) co_return;
  // Every other rank copies the root's buffer; the root waits for them.
  if (h->local_rank() != root) zero_copy_put(h, bytes, buf, v.in[static_cast<size_t>(root)], bytes);
  co_await zero_copy_done(c, h);
}

Task all_to_all_zero_copy(OpCtx& c, HostGroup* h, const char* in, size_t sends, char* out, size_t total,
                          const std::vector<size_t>& rdispl, const std::vector<size_t>& recv_counts, size_t elt,
                          const std::vector<uint64_t>& from, bool& agreed) {
  // Every rank copies its block of every input into its own output.
  ZeroCopyViews v;
  co_await zero_copy_agree(c, h, in, sends, out, total, {.inputs = true, .outputs = false, .same_sizes = false}, agreed,
                           v);
  if (!agreed) co_return;
  for (size_t q = 0; q < static_cast<size_t>(h->local_size()); ++q) {
    zero_copy_put(h, total, out + rdispl[q], v.in[q] + from[q], recv_counts[q] * elt);
  }
  co_await zero_copy_done(c, h);
}

}  // namespace torus::comm::ofi
