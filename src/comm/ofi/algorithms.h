// Private: collective algorithms over the provider (tagged messages), for
// any number of ranks. Each is a coroutine (task.h) on a PeerView; counts are
// in elements; buffers are host memory that outlives the op.
//
// Choice of algorithm (Tuning; defaults in ofi_options.h):
//  * all_reduce: recursive doubling when bytes <= rd_max_bytes (log2(n)
//    rounds; a non-power-of-two size folds the extra ranks into their
//    neighbours first and sends them the result last), else the pipelined
//    ring: reduce-scatter then all-gather, each step streamed in chunks of
//    chunk_bytes with `window` chunks in flight (bandwidth optimal:
//    2(n-1)/n of the data per rank).
//  * reduce_scatter / all_gather: pipelined ring.
//  * broadcast: binomial tree when bytes <= tree_max_bytes, else a pipelined
//    chain from the root.
//  * reduce: binomial tree when small, else ring reduce-scatter + gather of
//    the blocks at the root.
//  * all_to_all: pairwise exchange (step s: send to r+s, receive from r-s),
//    `window` steps in flight; equal and uneven counts.
//  * barrier: dissemination (ceil(log2 n) rounds of empty messages).
//
// Reductions (reduce_ops.h): kAvg is computed as a sum and the caller's
// `divisor` (0 = none) is applied once at the end; f16/bf16 are converted to
// f32 once, reduced in f32 and rounded once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/ofi/engine.h"
#include "torus/comm/types.h"
#include "torus/core/dtype.h"

namespace torus::comm::ofi::algo {

struct Tuning {
  size_t rd_max_bytes = size_t{32} << 10;
  size_t tree_max_bytes = size_t{256} << 10;
  size_t chunk_bytes = size_t{512} << 10;
  int window = 4;
};

Task all_reduce(OpCtx& c, const PeerView* v, const void* in, void* out, size_t count, DType t, ReduceOp op,
                int64_t divisor, uint64_t seq, Tuning tune);
// `in` holds size*count elements, `out` receives block rank (count elements).
Task reduce_scatter(OpCtx& c, const PeerView* v, const void* in, void* out, size_t count, DType t, ReduceOp op,
                    int64_t divisor, uint64_t seq, Tuning tune);
// `out` receives size blocks of count elements; block rank comes from `in`.
Task all_gather(OpCtx& c, const PeerView* v, const void* in, void* out, size_t count, size_t elt, uint64_t seq,
                Tuning tune);
Task broadcast(OpCtx& c, const PeerView* v, void* buf, size_t bytes, int root, uint64_t seq, Tuning tune);
// `out` is used on the root only.
Task reduce(OpCtx& c, const PeerView* v, const void* in, void* out, size_t count, DType t, ReduceOp op,
            int64_t divisor, int root, uint64_t seq, Tuning tune);
Task all_to_all(OpCtx& c, const PeerView* v, const void* in, void* out, std::vector<size_t> send_counts,
                std::vector<size_t> recv_counts, size_t elt, uint64_t seq, Tuning tune);
Task barrier(OpCtx& c, const PeerView* v, uint64_t seq);

// Point to point; messages above the provider's maximum are split the same
// way on both sides.
Task send(OpCtx& c, const PeerView* v, int peer, const void* buf, size_t bytes, uint64_t tag);
Task recv(OpCtx& c, const PeerView* v, int peer, void* buf, size_t bytes, uint64_t tag);

// Blocks of `count` elements split as evenly as possible over n ranks
// (the first count % n blocks one element longer).
struct Partition {
  std::vector<size_t> off, len;
};
Partition balanced(size_t count, int n);

}  // namespace torus::comm::ofi::algo
