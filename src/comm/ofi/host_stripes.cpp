// The staging-stripe paths of the host collectives (host_collectives.h):
// every op too large for one round that does not go zero-copy. A rank's
// staging area holds D rounds of slots (host_segment.h): an in-slot of L
// stripes, one per peer, and an out-slot of one. A sender copies a stripe
// into its own in-slot and signals `copied`; the reader combines or copies
// it from there straight into its user buffer and signals `consumed` (Note
// [Segment rounds] in host_rounds.h).
//
// host_pass is the pipeline of the reducing ops and the gathers, over one
// block per local rank: in each round the owner of a block puts one stripe
// of it into its out-slot, combined from every rank's in-slot when the op
// reduces, and when the op gathers the others copy it out (`reduced`). A
// rank copies in round t + 1 before it waits for the peers' results of
// round t (D >= 2). Ops of at least HostGroup::nt_bytes write their results
// with non-temporal stores (stream_copy.h). A broadcast streams the root's
// buffer through its in-slot, L stripes a round. An all_to_all stages each
// peer's block in its in-slot; its first round also agrees, through the
// mailboxes, on the number of rounds and on whether every rank can go
// zero-copy.
#include <cstring>

#include "comm/ofi/algo_step.h"
#include "comm/ofi/algorithms.h"
#include "comm/ofi/host_rounds.h"
#include "torus/comm/shared_host.h"

namespace torus::comm::ofi {

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

Task all_reduce_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                        int64_t divisor) {
  const size_t e = dtype_size(t);
  algo::Partition p = algo::balanced(count, h->local_size());
  HostPass a;
  a.dtype = t;
  a.op = op;
  a.divisor = divisor;
  a.len = p.len;
  a.in = static_cast<const char*>(in);
  a.in_off = p.off;
  a.my_dst = static_cast<char*>(out) + p.off[static_cast<size_t>(h->local_rank())] * e;
  a.gather = true;
  a.out = static_cast<char*>(out);
  a.out_off = p.off;
  return host_pass(c, h, std::move(a));
}

Task reduce_scatter_blocks_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, std::vector<size_t> len,
                                   std::vector<size_t> off, DType t, ReduceOp op) {
  const size_t me = static_cast<size_t>(h->local_rank());
  HostPass rs;
  rs.dtype = t;
  rs.op = op;
  rs.in = static_cast<const char*>(in);
  rs.my_dst = static_cast<char*>(out) + off[me] * dtype_size(t);
  rs.len = std::move(len);
  rs.in_off = std::move(off);
  return host_pass(c, h, std::move(rs));
}

Task all_gather_blocks_stripes(OpCtx& c, HostGroup* h, void* out_v, std::vector<size_t> len, std::vector<size_t> off,
                               DType t) {
  const size_t me = static_cast<size_t>(h->local_rank());
  char* out = static_cast<char*>(out_v);
  HostPass ag;
  ag.dtype = t;
  ag.my_src = out + off[me] * dtype_size(t);
  ag.gather = true;
  ag.out = out;
  ag.len = std::move(len);
  ag.out_off = std::move(off);
  return host_pass(c, h, std::move(ag));
}

Task reduce_scatter_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                            int64_t divisor) {
  const size_t L = static_cast<size_t>(h->local_size());
  HostPass a;
  a.dtype = t;
  a.op = op;
  a.divisor = divisor;
  a.len.assign(L, count);
  for (size_t i = 0; i < L; ++i) a.in_off.push_back(i * count);
  a.in = static_cast<const char*>(in);
  a.my_dst = static_cast<char*>(out);
  return host_pass(c, h, std::move(a));
}

Task all_gather_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt) {
  const size_t L = static_cast<size_t>(h->local_size());
  HostPass a;
  a.dtype = elt == 8 ? DType::kI64 : elt == 4 ? DType::kI32 : elt == 2 ? DType::kF16 : DType::kU8;
  a.len.assign(L, count);
  for (size_t i = 0; i < L; ++i) a.out_off.push_back(i * count);
  a.my_src = static_cast<const char*>(in);
  a.gather = true;
  a.out = static_cast<char*>(out);
  return host_pass(c, h, std::move(a));
}

Task reduce_stripes(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                    int64_t divisor, int root) {
  const size_t e = dtype_size(t);
  const bool is_root = h->local_rank() == root;
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
  return host_pass(c, h, std::move(a));
}

Task broadcast_stripes(OpCtx& c, HostGroup* h, void* buf_v, size_t bytes, int root) {
  const HostSegment& s = *h->seg;
  const int me = s.local_rank();
  char* buf = static_cast<char*>(buf_v);
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
    bool agreed = false;
    co_await all_to_all_zero_copy(c, h, in, sends, out, total, rdispl, recv_counts, elt, from, agreed);
    if (agreed) co_return;
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

}  // namespace torus::comm::ofi
