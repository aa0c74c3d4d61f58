// Writing a rank's part of a sharded checkpoint from tensors (checkpoint.h):
// snapshot() copies the state off the device; write_rank() crops whole
// boxes to the global shape, brings the tensors to the host and hands them
// to write_rank_buffers (write_buffers.cpp), which writes this
// rank's safetensors file and its .done.json record. finalize()
// (publish.cpp) then publishes the checkpoint.
#include <ATen/Functions.h>

#include <algorithm>

#include "checkpoint/tensors.h"
#include "core/log.h"

namespace torus::ckpt {

ShardedState snapshot(const ShardedState& state) {
  ShardedState out;
  for (const auto& [name, s] : state) {
    TensorSlice c = s;
    if (s.tensor.defined()) {
      at::Tensor t = s.tensor.detach();
      if (t.is_cuda()) {
        at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
        host.copy_(t);
        c.tensor = host;
      } else {
        c.tensor = t.clone(at::MemoryFormat::Contiguous);
      }
    }
    out[name] = std::move(c);
  }
  return out;
}

RankWrite write_rank(const std::string& save_dir, int rank, const ShardedState& state, const RunInfo& info) {
  BufferState buffers;
  std::vector<at::Tensor> keep;  // the host tensors the buffers point into
  keep.reserve(state.size());
  for (const auto& [name, s] : state) {
    BufferSlice b;
    b.per_rank = s.per_rank;
    b.alias_of = s.alias_of;
    if (!s.alias_of.empty()) {
      buffers[name] = std::move(b);
      continue;
    }
    TORUS_CHECK(s.tensor.defined(), InvalidArgument, "checkpoint: '{}' has no tensor", name);
    Normal n = normalize(name, s);
    at::Tensor t = s.tensor.detach();
    if (n.fb < 0) {
      // Crop a whole box to the global shape (Note [Slices]: padding is not saved).
      bool empty = false;
      for (size_t d = 0; d < n.global.size(); ++d) {
        const int64_t keep_d = std::min(n.box[d], n.global[d] - n.off[d]);
        if (keep_d <= 0) {
          empty = true;
          break;
        }
        if (keep_d < n.box[d]) {
          t = t.narrow(static_cast<int64_t>(d), 0, keep_d);
          n.box[d] = keep_d;
        }
      }
      if (empty) continue;
    }
    if (!t.device().is_cpu()) t = t.cpu();
    t = t.contiguous();
    keep.push_back(t);
    b.data = t.data_ptr();
    b.dtype = dtype_code(t.scalar_type());
    b.shape = t.sizes().vec();
    b.global_shape = n.global;
    b.box_offset = n.off;
    b.box_shape = n.box;
    b.flat_begin = n.fb;
    b.flat_end = n.fe;
    buffers[name] = std::move(b);
  }
  return write_rank_buffers(save_dir, rank, buffers, info);
}

}  // namespace torus::ckpt
