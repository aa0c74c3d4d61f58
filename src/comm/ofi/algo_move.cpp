// Data-movement collectives over the provider: all_gather (ring), broadcast
// (binomial tree, pipelined chain), all_to_all (pairwise), barrier
// (dissemination) and point to point.
#include <algorithm>
#include <deque>

#include "comm/ofi/algo_step.h"
#include "comm/ofi/algorithms.h"
#include "comm/ofi/reduce_ops.h"
#include "core/log.h"

namespace torus::comm::ofi::algo {
namespace {

StepShape byte_shape(const Tuning& tune, uint64_t seq) {
  StepShape s;
  s.dtype = DType::kU8;
  s.chunk = std::max<size_t>(1, tune.chunk_bytes);
  s.window = std::max(1, tune.window);
  s.seq = seq;
  return s;
}

Task tree_broadcast(OpCtx& c, const PeerView* v, char* buf, size_t bytes, int root, uint64_t seq) {
  const int n = v->size();
  const int vr = mod(v->rank - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      Request* q = c.recv(*v, mod(vr - mask + root, n), buf, bytes, seq);
      co_await c.wait(q);
      c.finish(q);
      break;
    }
    mask <<= 1;
  }
  std::vector<Request*> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) sends.push_back(c.send(*v, mod(vr + mask + root, n), buf, bytes, seq));
  }
  co_await c.wait_all(sends);
  c.finish_all(sends);
}

// Root streams chunks down the chain root, root+1, ...; each rank forwards a
// chunk as soon as it has it. Sends are never gated on send completions
// (see stream_step); they are collected at the end.
Task chain_broadcast(OpCtx& c, const PeerView* v, char* buf, size_t bytes, int root, uint64_t seq, Tuning tune) {
  const int n = v->size();
  const int vr = mod(v->rank - root, n);
  const int prev = mod(v->rank - 1, n), next = mod(v->rank + 1, n);
  const bool has_next = vr + 1 < n;
  const size_t cb = std::max<size_t>(1, tune.chunk_bytes), W = static_cast<size_t>(std::max(1, tune.window));
  const size_t nch = chunks_of(bytes, cb);
  std::vector<Request*> recvs(W, nullptr), sends;
  size_t posted_r = 0;
  for (size_t k = 0; k < nch; ++k) {
    if (vr > 0) {
      while (posted_r < nch && posted_r < k + W) {
        recvs[posted_r % W] = c.recv(*v, prev, buf + posted_r * cb, chunk_len(bytes, cb, posted_r), seq);
        ++posted_r;
      }
      Request* q = recvs[k % W];
      co_await c.wait(q);
      c.finish(q);
    }
    if (has_next) sends.push_back(c.send(*v, next, buf + k * cb, chunk_len(bytes, cb, k), seq));
  }
  co_await c.wait_all(sends);
  c.finish_all(sends);
}

}  // namespace

Task all_gather(OpCtx& c, const PeerView* v, const void* in_v, void* out_v, size_t count, size_t elt, uint64_t seq,
                Tuning tune) {
  const int n = v->size(), r = v->rank;
  const size_t block = count * elt;
  char* out = static_cast<char*>(out_v);
  copy_bytes(out + static_cast<size_t>(r) * block, in_v, block);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  StepShape sh = byte_shape(tune, seq);
  for (int s = 0; s < n - 1; ++s) {
    size_t sb = static_cast<size_t>(mod(r - s, n)), rb = static_cast<size_t>(mod(r - s - 1, n));
    StepRecv rv{out + rb * block};
    co_await stream_step(c, v, right, out + sb * block, block, left, rv, block, sh);
  }
}

Task broadcast(OpCtx& c, const PeerView* v, void* buf, size_t bytes, int root, uint64_t seq, Tuning tune) {
  if (v->size() == 1) co_return;
  if (bytes <= tune.tree_max_bytes) {
    co_await tree_broadcast(c, v, static_cast<char*>(buf), bytes, root, seq);
  } else {
    co_await chain_broadcast(c, v, static_cast<char*>(buf), bytes, root, seq, tune);
  }
}

Task all_to_all(OpCtx& c, const PeerView* v, const void* in_v, void* out_v, std::vector<size_t> send_counts,
                std::vector<size_t> recv_counts, size_t elt, uint64_t seq, Tuning tune) {
  const int n = v->size(), r = v->rank;
  const char* in = static_cast<const char*>(in_v);
  char* out = static_cast<char*>(out_v);
  std::vector<size_t> sdispl(static_cast<size_t>(n), 0), rdispl(static_cast<size_t>(n), 0);
  for (size_t i = 1; i < static_cast<size_t>(n); ++i) {
    sdispl[i] = sdispl[i - 1] + send_counts[i - 1];
    rdispl[i] = rdispl[i - 1] + recv_counts[i - 1];
  }
  const size_t ur = static_cast<size_t>(r);
  copy_bytes(out + rdispl[ur] * elt, in + sdispl[ur] * elt, std::min(send_counts[ur], recv_counts[ur]) * elt);
  const size_t max_msg = c.engine().fabric().max_msg_size();
  const size_t window = static_cast<size_t>(std::max(1, tune.window)) * 2;
  // Receives of up to `window` steps are in flight; sends are collected at
  // the end (never gated on send completions, see stream_step).
  std::deque<Request*> recvs;
  std::vector<Request*> sends;
  for (int s = 1; s < n; ++s) {
    size_t to = static_cast<size_t>(mod(r + s, n)), from = static_cast<size_t>(mod(r - s, n));
    for (size_t done = 0; done < recv_counts[from] * elt; done += max_msg) {
      size_t len = std::min(max_msg, recv_counts[from] * elt - done);
      recvs.push_back(c.recv(*v, static_cast<int>(from), out + rdispl[from] * elt + done, len, seq));
    }
    for (size_t done = 0; done < send_counts[to] * elt; done += max_msg) {
      size_t len = std::min(max_msg, send_counts[to] * elt - done);
      sends.push_back(c.send(*v, static_cast<int>(to), in + sdispl[to] * elt + done, len, seq));
    }
    while (recvs.size() > window) {
      Request* q = recvs.front();
      co_await c.wait(q);
      c.finish(q);
      recvs.pop_front();
    }
  }
  while (!recvs.empty()) {
    Request* q = recvs.front();
    co_await c.wait(q);
    c.finish(q);
    recvs.pop_front();
  }
  co_await c.wait_all(sends);
  c.finish_all(sends);
}

Task barrier(OpCtx& c, const PeerView* v, uint64_t seq) {
  const int n = v->size(), r = v->rank;
  std::vector<Request*> sends;
  for (int dist = 1; dist < n; dist <<= 1) {
    Request* q = c.recv(*v, mod(r - dist, n), nullptr, 0, seq);
    sends.push_back(c.send(*v, mod(r + dist, n), nullptr, 0, seq));
    co_await c.wait(q);
    c.finish(q);
  }
  co_await c.wait_all(sends);
  c.finish_all(sends);
}

Task send(OpCtx& c, const PeerView* v, int peer, const void* buf, size_t bytes, uint64_t tag) {
  const size_t max_msg = c.engine().fabric().max_msg_size();
  std::vector<Request*> rs;
  size_t done = 0;
  do {
    size_t len = std::min(max_msg, bytes - done);
    rs.push_back(c.send(*v, peer, static_cast<const char*>(buf) + done, len, tag));
    done += len;
  } while (done < bytes);
  co_await c.wait_all(rs);
  c.finish_all(rs);
}

Task recv(OpCtx& c, const PeerView* v, int peer, void* buf, size_t bytes, uint64_t tag) {
  const size_t max_msg = c.engine().fabric().max_msg_size();
  std::vector<Request*> rs;
  size_t done = 0;
  do {
    size_t len = std::min(max_msg, bytes - done);
    rs.push_back(c.recv(*v, peer, static_cast<char*>(buf) + done, len, tag));
    done += len;
  } while (done < bytes);
  co_await c.wait_all(rs);
  for (Request* r : rs) {
    if (r->state == Request::State::kDone && r->got != r->bytes) {
      throw CommError(fmt::format("{} failed: the message from world rank {} holds {} bytes, expected {}",
                                  c.info().describe(), r->peer, r->got, r->bytes));
    }
  }
  c.finish_all(rs);
}

}  // namespace torus::comm::ofi::algo
