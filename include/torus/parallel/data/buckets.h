// torus/parallel/data/buckets.h — gradient buckets: which parameters share a
// flat buffer, and the collective step that reduces one.
//
// The data-parallel wrapper (ddp.h) packs gradients into flat buffers and
// makes every parameter's .grad a view into its bucket, so backward
// accumulates straight into the buffer that is communicated (no copies).
// The step "bucket -> flat buffer -> collective" sits behind BucketReducer:
// plain data parallelism all-reduces each bucket; a ZeRO-2 reducer can
// reduce-scatter the same buffers into this rank's shard instead (the planner
// pads buckets to a multiple of the shard count for that).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "torus/comm/process_group.h"

namespace torus::dp {

// --- planning (pure) --------------------------------------------------------------

struct BucketPlanOptions {
  int64_t cap_bytes = 25LL << 20;       // a bucket closes once it holds at least this much
  int64_t first_cap_bytes = 1LL << 20;  // smaller first bucket: communication starts early in backward
  int64_t pad_to_multiple = 1;          // bucket numel rounded up to a multiple of this (ZeRO shards)
};

struct ParamDesc {
  int64_t numel = 0;
  int64_t element_size = 4;  // bytes
  int key = 0;               // parameters share a bucket only with equal keys (dtype, device, group)
};

struct BucketPlan {
  int key = 0;
  std::vector<int> params;       // indices into the planner's input, in input order
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat buffer
  int64_t numel = 0;             // padded size of the flat buffer
};

// Assigns parameters, given in the order their gradients are expected to be
// ready (reverse of registration for a usual model), to buckets: each key
// fills its own open bucket in that order, closing it at the cap. Buckets are
// returned ordered by their first parameter, the order they are reduced in.
// Throws InvalidArgument for non-positive caps or multiples.
std::vector<BucketPlan> plan_buckets(const std::vector<ParamDesc>& params, const BucketPlanOptions& options);

// --- buckets and their collective -------------------------------------------------

struct BucketSlot {
  std::string name;
  at::Tensor param;  // the parameter; param.grad() is a view of flat[offset : offset + numel]
  int64_t offset = 0;
  int64_t numel = 0;
  // The bucket holds another dtype than the parameter (f32 main gradients of
  // a half-precision parameter): param.grad() is not a view; each gradient
  // autograd produces is added into flat[offset : offset + numel] and
  // param.grad() is reset.
  bool separate = false;
};

struct Bucket {
  int index = 0;
  at::Tensor flat;  // the flat gradient buffer
  std::vector<BucketSlot> slots;
  comm::ProcessGroupPtr group;  // the ranks the gradients are reduced over; null: kept local (never reduced)
  comm::ReduceOp op = comm::ReduceOp::kAvg;
  double post_scale = 1.0;  // multiplies the result after the collective (1: none)

  // Per-iteration state, owned by the wrapper.
  int pending = 0;     // gradients not yet produced in this backward
  comm::WorkPtr work;  // in-flight collective, if started
};

// The collective step of a bucket. start() is called once per bucket per
// synchronisation, in bucket order, identically on every rank of the bucket's
// group; it must not block on peers. finish() is called after the returned
// Work completed and makes the result visible through the gradient views.
// Implementations must be safe to call from the autograd engine's thread.
class BucketReducer {
 public:
  virtual ~BucketReducer() = default;
  virtual comm::WorkPtr start(Bucket& bucket) = 0;
  virtual void finish(Bucket& bucket) = 0;
};

// All-reduce of the whole flat buffer with bucket.op, then bucket.post_scale.
class AllReduceReducer : public BucketReducer {
 public:
  comm::WorkPtr start(Bucket& bucket) override;
  void finish(Bucket& bucket) override;
};

}  // namespace torus::dp
