// Private: a ZeRO unit (zero.h) — the flat parameter and gradient buffers of
// the parameters that are gathered and reduced together — and the helpers the
// files of Zero share: zero.cpp (construction, queries), zero_grads.cpp (the
// reduce-scatter of gradients), zero_params.cpp (the gathers of parameters
// and the stage-3 block windows). Every Unit field is guarded by Zero::mu_.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/log.h"
#include "torus/parallel/data/zero.h"

namespace torus::dp {

using Clock = std::chrono::steady_clock;

// What runs when the gradient reaches an identity node in backward
// (zero_params.cpp: a block window re-opened before the block's backward,
// closed after it). Autograd contexts hold IValues only, so the node keeps
// the address of one of these, owned by its unit.
struct BackwardAction {
  std::function<void()> fn;
};

// Storage of a unit's flat parameter buffer: released and re-materialised
// in place, so that every view (autograd's saved ones included) follows.
inline void release_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));
  s->set_nbytes(0);
}

inline void materialise_storage(const at::Tensor& flat, size_t nbytes) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  if (s->nbytes() == nbytes && s->data() != nullptr) return;
  TORUS_CHECK(s->allocator() != nullptr, Error, "ZeRO: a parameter buffer has no allocator");
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

struct Zero::Unit {
  int index = 0;
  int64_t block = -1;
  bool keep_gathered = true;  // stages 1-2, and stage-3 units outside blocks
  comm::ProcessGroupPtr group;  // null: one rank
  int N = 1, r = 0;
  comm::ReduceOp op = comm::ReduceOp::kAvg;
  double post_scale = 1.0;
  c10::ScalarType pdtype = at::kFloat, gdtype = at::kFloat;
  std::vector<int> params;
  std::vector<int64_t> offsets;
  int64_t numel = 0, shard = 0;

  at::Tensor param_flat;   // [numel], pdtype; stage 3 blocks: storage released outside windows
  at::Tensor param_shard;  // [shard]: a view of param_flat (kept gathered) or its own tensor (stage 3)
  at::Tensor host_param;   // offload to the host from a device: the shard the optimizer updates
  at::Tensor grad_full;    // [numel], gdtype: stage 1 persistent, stages 2-3 transient
  at::Tensor grad_shard;   // [shard], gdtype
  at::Tensor host_grad;    // offload from a device: the reduced shard on the host

  // Per step.
  std::vector<char> fired;
  int fired_count = 0;
  bool dirty = false;        // grad_full holds contributions not yet reduced
  bool zero_pending = false; // stage 1: grad_full must be zeroed before the next contribution
  bool wrote_shard = false;  // grad_shard holds this step's reduced gradient
  comm::WorkPtr rs_work;     // in-flight reduce-scatter (in place in grad_full)

  // Stage 3.
  bool gathered = false;
  comm::WorkPtr ag_work;
  int holds = 0;  // forward windows and backward windows open on this unit
  bool prefetched = false;
  BackwardAction before_backward, after_backward;

  int64_t param_bytes() const { return numel * static_cast<int64_t>(c10::elementSize(pdtype)); }
  int64_t grad_bytes() const { return numel * static_cast<int64_t>(c10::elementSize(gdtype)); }
};

}  // namespace torus::dp
