// torus/checkpoint/buffers.h — the checkpoint format (checkpoint.h,
// docs/checkpoint.md) over host buffers, free of LibTorch: what a rank
// writes, how rank 0 publishes a checkpoint, what the manifest says about
// the run. The tensor API of checkpoint.h comes down to this (its
// write_rank crops and copies tensors to the host and calls
// write_rank_buffers),
// and so do the flat states of buffer-level optimizers (flat_state.h), so
// there is one writer and one publisher of the format.
//
// A BufferSlice is a TensorSlice (Note [Slices] in checkpoint.h) whose data
// is a host pointer, a safetensors dtype code and a shape: the whole box
// (shape = box shape, which must lie inside the global shape: nothing is
// cropped here) or a flat range [flat_begin, flat_end) of the box's
// row-major flattening (a 1-D shape of flat_end - flat_begin elements).
//
// Errors: InvalidArgument for a malformed slice or run; CheckpointError
// (safetensors.h) for anything on disk, naming the file and errno.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "torus/checkpoint/safetensors.h"
#include "torus/core/dtype.h"

namespace torus::ckpt {

inline constexpr int kFormatVersion = 1;

// What the manifest says about the run, besides the tensors.
struct RunInfo {
  std::string run_id;     // the run that wrote it (every rank file carries it)
  int64_t step = 0;       // optimizer steps taken
  // JSON objects, as text (compared on load by the training loop):
  std::string layout = "{}";   // tp, pp, dp, ep, zero, precision, schedule, ...
  std::string model = "{}";    // the model's configuration
  std::string data = "{}";     // source, sha256, position
  std::string metrics = "{}";  // what continuing the plots needs
  std::string options = "{}";  // every option of the run (for the record)
  // What a saved state must match to be loaded into a target (a flat
  // state's meta, flat_state.h: the parameters' dtype of a host optimizer);
  // "{}" for the engine's state. Absent from older manifests: read as "{}".
  std::string state = "{}";
  int world_size = 1;
};

struct SaveOptions {
  double peer_timeout_s = 600;  // rank 0: how long to wait for the other ranks' files
};

// Where a rank's save stands after write_rank_buffers() or write_rank()
// (Note [Atomic save]).
struct RankWrite {
  std::string tmp_dir;
  std::string final_dir;
  std::string file;        // this rank's safetensors file
  uint64_t bytes = 0;
  std::string sha256;
};

// One piece of a global tensor in host memory (Note [Slices]).
struct BufferSlice {
  const void* data = nullptr;         // contiguous host memory holding `shape` elements of `dtype`
  std::string dtype;                  // safetensors code: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;         // of the data
  std::vector<int64_t> global_shape;  // the unpadded global tensor
  std::vector<int64_t> box_offset;    // empty: zeros (the whole tensor)
  std::vector<int64_t> box_shape;     // empty: global_shape
  int64_t flat_begin = -1;            // >= 0: the data is [flat_begin, flat_end) of the flattened box
  int64_t flat_end = -1;
  bool per_rank = false;              // as TensorSlice::per_rank
  std::string alias_of;               // as TensorSlice::alias_of (data unused)
};
using BufferState = std::map<std::string, BufferSlice>;

// The safetensors code of a buffer-level dtype ("F32", "BF16", ...).
std::string dtype_code(DType dtype);

// Writes this rank's slices into <save_dir>/step-N.tmp-<run id> (creating
// it) and its .done.json (Note [Atomic save]). The buffers are read as they
// are: nothing may change them meanwhile. Throws CheckpointError (disk) or
// InvalidArgument (a slice that does not fit its box or global shape).
RankWrite write_rank_buffers(const std::string& save_dir, int rank, const BufferState& state,
                             const RunInfo& info);

// Rank 0, after its own write_rank_buffers() (or write_rank()): waits for every rank's .done.json,
// writes the manifest, renames the directory into place and writes
// COMPLETE. Returns the checkpoint's path. No collective.
std::string finalize(const RankWrite& mine, const RunInfo& info, const SaveOptions& options = {});

// Deletes a checkpoint so that it can never look complete half-way:
// COMPLETE first (and the directory fsynced), then the rest.
void remove_checkpoint(const std::string& path);

}  // namespace torus::ckpt
