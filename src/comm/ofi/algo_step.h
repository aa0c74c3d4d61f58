// Private: the streaming step every ring/chain algorithm is made of.
//
// One step sends `send_elems` elements to `to` and receives `recv_elems`
// from `from`, both cut in chunks of `chunk` elements with up to `window`
// chunks in flight each way. Received chunks either land in `dst` directly,
// or (reduce mode) land in `tmp` (window * chunk elements) and are combined
// into dst: dst = with (op) received when `with` is set (first touch of an
// out-of-place buffer), else dst (op)= received. The step returns when all
// its sends and receives have completed.
#pragma once

#include "comm/ofi/engine.h"
#include "torus/comm/types.h"
#include "torus/core/dtype.h"

namespace torus::comm::ofi::algo {

struct StepRecv {
  char* dst = nullptr;
  bool reduce = false;
  const char* with = nullptr;
  char* tmp = nullptr;
};

struct StepShape {
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  size_t chunk = 1;  // elements
  int window = 1;
  uint64_t seq = 0;
};

Task stream_step(OpCtx& c, const PeerView* v, int to, const char* send_buf, size_t send_elems, int from,
                 StepRecv rv, size_t recv_elems, StepShape shape);

inline int mod(int a, int n) { return ((a % n) + n) % n; }
inline size_t chunks_of(size_t elems, size_t chunk) { return (elems + chunk - 1) / chunk; }
inline size_t chunk_len(size_t elems, size_t chunk, size_t k) {
  size_t start = k * chunk;
  return start >= elems ? 0 : std::min(chunk, elems - start);
}

}  // namespace torus::comm::ofi::algo
