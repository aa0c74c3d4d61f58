// Private: collectives among the ranks of one group that share a host,
// through the group's HostSegment (host_segment.h) — no provider involved.
// host_collectives.cpp picks each op's path; host_one_round.cpp,
// host_zero_copy.cpp and host_stripes.cpp implement them.
//
// Data crosses between processes through cache-sized staging stripes: the
// sender copies a stripe into its own slot, the reader combines or copies it
// straight into its user buffer. With stripes small enough to stay in the
// shared last-level cache, the extra copy costs little and the DRAM traffic
// per rank stays close to reading its input and writing its output once.
//
//  * all_reduce <= eager bytes: one round; every rank reduces all slots in
//    rank order (identical bits everywhere); up to 56 bytes travel in the
//    peers' mailbox lines, one cache-line transfer per peer.
//  * all_reduce above: a pipelined reduce-scatter + all-gather. Local rank i
//    owns block i; per round it reduces one stripe of its block from every
//    rank's in-slot and publishes the result, which all others copy out.
//  * reduce_scatter, all_gather, reduce: the same pipeline with one half.
//  * all_to_all: every rank stages its block for each peer in its in-slot;
//    the peer copies it out.
//  * broadcast: the root streams stripes through its in-slot.
//  * barrier: one round of counters.
//
// Note [Zero-copy host ops]: all_reduce, reduce_scatter, reduce,
// all_gather, broadcast and all_to_all (equal or uneven blocks; its first
// round, which agrees on the number of rounds, also carries where each
// peer's block starts) of at least HostGroup::zero_copy_bytes first spend one mailbox round on
// whether every rank's input and output lie in shared host memory
// (torus/comm/shared_host.h). When they do, and every rank could map every
// peer's buffers (a second round says so), no data goes through the
// stripes: local rank i reduces block i straight from all the inputs and
// writes it into all the outputs (all_reduce), into its own output
// (reduce_scatter), into the root's output (reduce; only the root's output
// need be shared), or writes its input into block i of all the outputs
// (all_gather); in a broadcast every other rank copies the root's buffer,
// in an all_to_all every rank copies its block of every input;
// a last round says everyone is done with everyone's buffers.
// Each rank reads its share once and writes it once — the traffic of one
// memcpy — where the staging path copies every byte twice and makes it
// cross between cores' caches. Every rank decides from the same mailboxes,
// so all take the same path; otherwise the op continues on the stripes.
//
// Every function is collective over the local members, which must issue the
// same sequence of host collectives (the group's op order guarantees it).
// Waits fail with CommError when the segment is aborted or a member process
// has died (checked every 50 ms); deadlines are the engine's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/ofi/engine.h"
#include "comm/ofi/host_segment.h"
#include "comm/ofi/peer_mappings.h"
#include "comm/ofi/spin.h"
#include "torus/comm/types.h"
#include "torus/core/dtype.h"

namespace torus::comm::ofi {

// A group's segment and its round counter. Driver thread only.
struct HostGroup {
  HostSegment* seg = nullptr;
  uint64_t round = 0;  // the last round this rank started
  // The peers' counters as last read (they only grow): a wait already
  // satisfied by them needs no cache-line transfer. [kind][local rank]
  std::vector<uint64_t> seen[3];
  size_t nt_bytes = size_t{16} << 20;  // ops this large write results with non-temporal stores
  WaitPolicy inline_wait = wait_policy(Wait::kInline, false);  // the waits of host_*_inline (spin.h)
  size_t eager_bytes = 16 << 10;       // one-round ops through the in-slots up to this (OfiOptions)
  size_t zero_copy_bytes = 64 << 10;   // Note [Zero-copy host ops] from this many bytes per rank; 0: never
  std::unique_ptr<PeerMappings> peers = std::make_unique<PeerMappings>();  // the peers' shared buffers
  bool zero_copy_logged = false;       // the first zero-copy op of the group is logged (debug)
  std::vector<const char*> srcs;       // scratch: the sources of one combine
  std::vector<uint64_t> offsets;       // scratch: a zero-copy all_to_all's block offsets in the peers' inputs
  std::vector<float> acc;              // scratch: f32 accumulator of an inline half combine
  std::vector<char> gathered;          // scratch: every rank's mailbox data of one exchange
  Clock::time_point next_liveness_check{};
  // Note [Op signatures] (host_segment.h): the current host op's first
  // round and signature, and per peer the op whose signature was checked.
  uint64_t op_round = 0;
  uint64_t op_sig = 0;
  std::vector<uint64_t> sig_checked;
  int local_rank() const { return seg->local_rank(); }
  int local_size() const { return seg->local_size(); }
};

// One pipelined pass over blocks (one block per local rank, in elements).
// Reduce-scatter half: when `in` is set, local rank i combines block i from
// every rank's `in + in_off[i]` into `my_dst` (or only into its out-slot
// when my_dst is null). All-gather half: when `gather` is true, the owners
// publish their block (the reduced one, or `my_src` without a reduce half)
// and every rank — or only `gather_root` when >= 0 — copies block q to
// `out + out_off[q]`.
struct HostPass {
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int64_t divisor = 0;            // applied to reduced blocks (kAvg)
  std::vector<size_t> len;        // block length per local rank
  const char* in = nullptr;
  std::vector<size_t> in_off;
  char* my_dst = nullptr;
  const char* my_src = nullptr;
  bool gather = false;
  int gather_root = -1;
  char* out = nullptr;
  std::vector<size_t> out_off;
};

Task host_pass(OpCtx& c, HostGroup* h, HostPass pass);

// The host phases of the hierarchical all_reduce (group_ops.cpp), local
// block q being `len[q]` elements at `off[q]`: reduce-scatter (no divisor)
// of every local rank's `in` into this rank's block of `out`; all-gather of
// every rank's block of `out` into every rank's `out`. Zero-copy where the
// buffers are shared host memory (Note [Zero-copy host ops]), else a
// host_pass.
Task host_reduce_scatter_blocks(OpCtx& c, HostGroup* h, const void* in, void* out, std::vector<size_t> len,
                                std::vector<size_t> off, DType t, ReduceOp op);
Task host_all_gather_blocks(OpCtx& c, HostGroup* h, void* out, std::vector<size_t> len, std::vector<size_t> off,
                            DType t);

Task host_all_reduce(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                     int64_t divisor);
Task host_reduce_scatter(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                         int64_t divisor);
Task host_all_gather(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, size_t elt);
// `out` is used on `root` only (local rank).
Task host_reduce(OpCtx& c, HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                 int64_t divisor, int root);
Task host_broadcast(OpCtx& c, HostGroup* h, void* buf, size_t bytes, int root);
// Equal or uneven blocks (counts in elements of `elt` bytes, packed in rank
// order); one mailbox round agrees on the number of pipeline rounds.
Task host_all_to_all(OpCtx& c, HostGroup* h, const void* in, void* out, std::vector<size_t> send_counts,
                     std::vector<size_t> recv_counts, size_t elt);
Task host_barrier(OpCtx& c, HostGroup* h);

// Ops of this process that took the zero-copy path (Note [Zero-copy host
// ops]) so far, over all groups: for tests and diagnostics.
uint64_t host_zero_copy_ops();

// Note [Inline mailbox all_reduce]: an all_reduce small enough for one
// round (the mailboxes up to SegmentMailbox::kBytes, else the in-slots up
// to the eager size) on a group whose ranks all share the segment can run
// in the calling thread, without the engine: publish the data, spin briefly
// for the peers', combine. It is the same protocol, round
// for round, as the engine's mailbox path (host_all_reduce), so ranks may
// take either path for the same op. The caller must guarantee that no
// engine op of the group is queued or running (HostGroup is driver state).
// The spin is bounded: a peer that is late (busy, or issuing another
// group's op first) is waited for by the engine instead, so an op issued
// this way never blocks its caller for long and cannot deadlock ops of
// other groups.
enum class InlineOutcome {
  kNotStarted,  // nothing happened (the slots were not free in time): issue the op normally
  kPublished,   // this rank's mailbox of round h->round is out: finish with host_all_reduce_finish
  kDone,        // out holds the result
};
// The largest all_reduce (bytes) that runs inline: the mailbox, or one
// eager round through the in-slots (host_all_reduce's one-round paths).
size_t host_inline_max_bytes(const HostGroup* h);
InlineOutcome host_all_reduce_inline(HostGroup* h, const void* in, void* out, size_t count, DType t, ReduceOp op,
                                     int64_t divisor, std::chrono::nanoseconds spin);
// A broadcast of at most host_inline_max_bytes, the same way: the root
// publishes its mailbox (or fills one round of its in-slot) once it is
// free and is done; the others spin for it. kNotStarted also when the op
// is larger than one round or would try the zero-copy path. kPublished here means the round is taken and host_broadcast_finish
// completes it (a non-root whose root was late).
InlineOutcome host_broadcast_inline(HostGroup* h, void* buf, size_t bytes, int root, std::chrono::nanoseconds spin);
Task host_broadcast_finish(OpCtx& c, HostGroup* h, uint64_t round, void* buf, size_t bytes, int root);
// The rest of an op host_all_reduce_inline left kPublished, in round `round`.
Task host_all_reduce_finish(OpCtx& c, HostGroup* h, uint64_t round, const void* in, void* out, size_t count,
                            DType t, ReduceOp op, int64_t divisor);

}  // namespace torus::comm::ofi
