// Reducing collectives over the provider: all_reduce (recursive doubling,
// pipelined ring), reduce_scatter (ring), reduce (tree, ring + gather), and
// the streaming step they share (algo_step.h).
#include <algorithm>

#include "comm/ofi/algo_step.h"
#include "comm/ofi/algorithms.h"
#include "comm/ofi/reduce_ops.h"

namespace torus::comm::ofi::algo {

Partition balanced(size_t count, int n) {
  Partition p;
  p.off.resize(static_cast<size_t>(n));
  p.len.resize(static_cast<size_t>(n));
  size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n), off = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    p.off[i] = off;
    p.len[i] = base + (i < extra ? 1 : 0);
    off += p.len[i];
  }
  return p;
}

Task stream_step(OpCtx& c, const PeerView* v, int to, const char* send_buf, size_t send_elems, int from,
                 StepRecv rv, size_t recv_elems, StepShape shape) {
  const size_t e = dtype_size(shape.dtype), ce = shape.chunk;
  const size_t W = static_cast<size_t>(shape.window);
  const size_t ns = chunks_of(send_elems, ce), nr = chunks_of(recv_elems, ce);
  std::vector<Request*> sends, recvs(W, nullptr);
  sends.reserve(ns);
  size_t posted_s = 0, posted_r = 0, done_r = 0;
  auto post_sends = [&](size_t limit) {
    for (; posted_s < std::min(ns, limit); ++posted_s) {
      sends.push_back(c.send(*v, to, send_buf + posted_s * ce * e, chunk_len(send_elems, ce, posted_s) * e,
                             shape.seq));
    }
  };
  while (done_r < nr) {
    for (; posted_r < nr && posted_r - done_r < W; ++posted_r) {
      char* where = rv.reduce ? rv.tmp + (posted_r % W) * ce * e : rv.dst + posted_r * ce * e;
      recvs[posted_r % W] = c.recv(*v, from, where, chunk_len(recv_elems, ce, posted_r) * e, shape.seq);
    }
    // Sends run at most `window` chunks ahead of this rank's own receives and
    // are never gated on send completions: some providers (shm in libfabric
    // 1.17) report a send complete only after later traffic.
    post_sends(done_r + W);
    Request* rq = recvs[done_r % W];
    co_await c.wait(rq);
    c.finish(rq);
    if (rv.reduce) {
      size_t len = chunk_len(recv_elems, ce, done_r);
      char* d = rv.dst + done_r * ce * e;
      const char* got = rv.tmp + (done_r % W) * ce * e;
      if (rv.with != nullptr) {
        reduce_into(d, rv.with + done_r * ce * e, got, len, shape.dtype, shape.op);
      } else {
        reduce_inplace(d, got, len, shape.dtype, shape.op);
      }
    }
    ++done_r;
  }
  post_sends(ns);
  co_await c.wait_all(sends);
  c.finish_all(sends);
}

namespace {

StepShape shape_of(DType t, ReduceOp op, const Tuning& tune, uint64_t seq) {
  StepShape s;
  s.dtype = t;
  s.op = op;
  s.chunk = std::max<size_t>(1, tune.chunk_bytes / dtype_size(t));
  s.window = std::max(1, tune.window);
  s.seq = seq;
  return s;
}

// Ring all_reduce on a non-half dtype; out may alias in.
Task ring_all_reduce(OpCtx& c, const PeerView* v, const char* in, char* out, size_t count, DType t, ReduceOp op,
                     uint64_t seq, Tuning tune) {
  const int n = v->size(), r = v->rank;
  const size_t e = dtype_size(t);
  const Partition p = balanced(count, n);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  StepShape sh = shape_of(t, op, tune, seq);
  char* tmp = c.scratch(static_cast<size_t>(sh.window) * sh.chunk * e);
  for (int s = 0; s < n - 1; ++s) {  // reduce-scatter: rank r ends owning block r+1
    size_t sb = static_cast<size_t>(mod(r - s, n)), rb = static_cast<size_t>(mod(r - s - 1, n));
    const char* src = (s == 0 ? in : out) + p.off[sb] * e;
    // Each block arrives once: add this rank's own input to the partial sum.
    StepRecv rv{out + p.off[rb] * e, true, in + p.off[rb] * e, tmp};
    co_await stream_step(c, v, right, src, p.len[sb], left, rv, p.len[rb], sh);
  }
  for (int s = 0; s < n - 1; ++s) {  // all-gather
    size_t sb = static_cast<size_t>(mod(r + 1 - s, n)), rb = static_cast<size_t>(mod(r - s, n));
    StepRecv rv{out + p.off[rb] * e};
    co_await stream_step(c, v, right, out + p.off[sb] * e, p.len[sb], left, rv, p.len[rb], sh);
  }
}

// Recursive doubling on a non-half dtype, in place on `buf`. Every round
// reduces into a fresh buffer so a buffer is never written while a send
// from it may be in flight; sends are collected at the end.
Task rd_all_reduce(OpCtx& c, const PeerView* v, char* buf, size_t count, DType t, ReduceOp op, uint64_t seq) {
  const int n = v->size(), r = v->rank;
  const size_t bytes = count * dtype_size(t);
  int pof2 = 1, rounds = 0;
  while (pof2 * 2 <= n) {
    pof2 *= 2;
    ++rounds;
  }
  const int rem = n - pof2;
  const size_t slot = (bytes + 63) / 64 * 64;
  char* work = c.scratch(slot * static_cast<size_t>(2 * rounds + 2));
  size_t used = 0;
  auto fresh = [&] { return work + slot * used++; };
  std::vector<Request*> sends;
  char* cur = buf;
  int vr;  // rank among the pof2 participants, -1 when folded out
  if (r < 2 * rem && r % 2 == 0) {
    sends.push_back(c.send(*v, r + 1, cur, bytes, seq));
    vr = -1;
  } else if (r < 2 * rem) {
    char* tmp = fresh();
    Request* q = c.recv(*v, r - 1, tmp, bytes, seq);
    co_await c.wait(q);
    c.finish(q);
    reduce_inplace(cur, tmp, count, t, op);  // nothing is sent from buf yet
    vr = r / 2;
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      int vp = vr ^ mask;
      int peer = vp < rem ? vp * 2 + 1 : vp + rem;
      char* tmp = fresh();
      Request* q = c.recv(*v, peer, tmp, bytes, seq);
      sends.push_back(c.send(*v, peer, cur, bytes, seq));
      co_await c.wait(q);
      c.finish(q);
      char* next = fresh();
      reduce_into(next, cur, tmp, count, t, op);  // commutative: both partners get the same bits
      cur = next;
    }
    if (r < 2 * rem) sends.push_back(c.send(*v, r - 1, cur, bytes, seq));
  } else {
    char* res = fresh();
    Request* q = c.recv(*v, r + 1, res, bytes, seq);
    co_await c.wait(q);
    c.finish(q);
    cur = res;
  }
  co_await c.wait_all(sends);
  c.finish_all(sends);
  copy_bytes(buf, cur, bytes);
}

// Ring reduce-scatter over partition p: `dst` receives block r. in is not
// modified; dst may alias in's block r.
Task ring_reduce_scatter(OpCtx& c, const PeerView* v, const char* in, char* dst, Partition p, DType t, ReduceOp op,
                         uint64_t seq, Tuning tune) {
  const int n = v->size(), r = v->rank;
  const size_t e = dtype_size(t);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  StepShape sh = shape_of(t, op, tune, seq);
  size_t maxlen = *std::max_element(p.len.begin(), p.len.end());
  char* tmp = c.scratch(static_cast<size_t>(sh.window) * sh.chunk * e);
  char* acc[2] = {nullptr, nullptr};
  if (n > 2) {
    acc[0] = c.scratch(maxlen * e);
    acc[1] = c.scratch(maxlen * e);
  }
  for (int s = 0; s < n - 1; ++s) {  // step s: send block r-s-1, receive block r-s-2; the last one is r
    size_t sb = static_cast<size_t>(mod(r - s - 1, n)), rb = static_cast<size_t>(mod(r - s - 2, n));
    const char* src = s == 0 ? in + p.off[sb] * e : acc[(s - 1) % 2];
    char* into = s == n - 2 ? dst : acc[s % 2];
    StepRecv rv{into, true, in + p.off[rb] * e, tmp};
    co_await stream_step(c, v, right, src, p.len[sb], left, rv, p.len[rb], sh);
  }
}

// Binomial-tree reduce to `root` into acc (count elements, holding this
// rank's contribution on entry).
Task tree_reduce(OpCtx& c, const PeerView* v, char* acc, size_t count, DType t, ReduceOp op, int root, uint64_t seq) {
  const int n = v->size();
  const int vr = mod(v->rank - root, n);
  const size_t bytes = count * dtype_size(t);
  char* tmp = c.scratch(bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if ((vr & mask) == 0) {
      int src = vr | mask;
      if (src < n) {
        Request* q = c.recv(*v, mod(src + root, n), tmp, bytes, seq);
        co_await c.wait(q);
        c.finish(q);
        reduce_inplace(acc, tmp, count, t, op);
      }
    } else {
      Request* s = c.send(*v, mod((vr & ~mask) + root, n), acc, bytes, seq);
      co_await c.wait(s);
      c.finish(s);
      break;
    }
  }
}

// Reduce on a non-half dtype; `out` is the root's result buffer (unused
// elsewhere).
Task reduce_plain(OpCtx& c, const PeerView* v, const char* in, char* out, size_t count, DType t, ReduceOp op,
                  int root, uint64_t seq, Tuning tune) {
  const int n = v->size(), r = v->rank;
  const size_t e = dtype_size(t);
  if (count * e <= tune.tree_max_bytes || count < static_cast<size_t>(n)) {
    char* acc = r == root ? out : c.scratch(count * e);
    copy_bytes(acc, in, count * e);
    co_await tree_reduce(c, v, acc, count, t, op, root, seq);
    co_return;
  }
  Partition p = balanced(count, n);
  char* mine = r == root ? out + p.off[static_cast<size_t>(r)] * e : c.scratch(p.len[static_cast<size_t>(r)] * e);
  co_await ring_reduce_scatter(c, v, in, mine, p, t, op, seq, tune);
  if (r != root) {
    Request* s = c.send(*v, root, mine, p.len[static_cast<size_t>(r)] * e, seq);
    co_await c.wait(s);
    c.finish(s);
    co_return;
  }
  std::vector<Request*> rs;
  for (int q = 0; q < n; ++q) {
    if (q != root) rs.push_back(c.recv(*v, q, out + p.off[static_cast<size_t>(q)] * e, p.len[static_cast<size_t>(q)] * e, seq));
  }
  co_await c.wait_all(rs);
  c.finish_all(rs);
}

}  // namespace

Task all_reduce(OpCtx& c, const PeerView* v, const void* in_v, void* out_v, size_t count, DType t, ReduceOp op,
                int64_t divisor, uint64_t seq, Tuning tune) {
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  const bool half = is_half(t);
  const DType wt = half ? DType::kF32 : t;  // the type the algorithm runs in
  char* buf = out;
  if (half) {
    buf = c.scratch(count * sizeof(float));
    kernels::half_to_f32(in, reinterpret_cast<float*>(buf), count, t);
  }
  if (v->size() == 1) {
    if (!half) copy_bytes(out, in, count * dtype_size(t));
  } else if (count * dtype_size(t) <= tune.rd_max_bytes || count < static_cast<size_t>(v->size())) {
    if (!half) copy_bytes(buf, in, count * dtype_size(t));
    co_await rd_all_reduce(c, v, buf, count, wt, op, seq);
  } else {
    co_await ring_all_reduce(c, v, half ? buf : in, buf, count, wt, op, seq, tune);
  }
  divide(buf, count, wt, divisor);
  if (half) kernels::f32_to_half(reinterpret_cast<const float*>(buf), out, count, t);
}

Task reduce_scatter(OpCtx& c, const PeerView* v, const void* in_v, void* out_v, size_t count, DType t, ReduceOp op,
                    int64_t divisor, uint64_t seq, Tuning tune) {
  const int n = v->size();
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  const bool half = is_half(t);
  const DType wt = half ? DType::kF32 : t;
  Partition p;
  for (int i = 0; i < n; ++i) {
    p.off.push_back(static_cast<size_t>(i) * count);
    p.len.push_back(count);
  }
  const char* src = in;
  char* dst = out;
  if (half) {
    char* s = c.scratch(static_cast<size_t>(n) * count * sizeof(float));
    kernels::half_to_f32(in, reinterpret_cast<float*>(s), static_cast<size_t>(n) * count, t);
    src = s;
    dst = c.scratch(count * sizeof(float));
  }
  if (n == 1) {
    copy_bytes(dst, src, count * dtype_size(wt));
  } else {
    co_await ring_reduce_scatter(c, v, src, dst, p, wt, op, seq, tune);
  }
  divide(dst, count, wt, divisor);
  if (half) kernels::f32_to_half(reinterpret_cast<const float*>(dst), out, count, t);
}

Task reduce(OpCtx& c, const PeerView* v, const void* in_v, void* out_v, size_t count, DType t, ReduceOp op,
            int64_t divisor, int root, uint64_t seq, Tuning tune) {
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  const bool is_root = v->rank == root;
  if (!is_half(t)) {
    co_await reduce_plain(c, v, in, out, count, t, op, root, seq, tune);
    if (is_root) divide(out, count, t, divisor);
    co_return;
  }
  char* s = c.scratch(count * sizeof(float));
  kernels::half_to_f32(in, reinterpret_cast<float*>(s), count, t);
  char* res = is_root ? c.scratch(count * sizeof(float)) : nullptr;
  co_await reduce_plain(c, v, s, res, count, DType::kF32, op, root, seq, tune);
  if (is_root) {
    divide(res, count, DType::kF32, divisor);
    kernels::f32_to_half(reinterpret_cast<const float*>(res), out, count, t);
  }
}

}  // namespace torus::comm::ofi::algo
