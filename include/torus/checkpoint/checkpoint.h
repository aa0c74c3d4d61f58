// torus/checkpoint/checkpoint.h — saved training state: sharded safetensors
// files plus a JSON manifest, written atomically, verified on load, and
// loadable into any other parallel layout (docs/checkpoint.md).
//
// This header is the format over LibTorch tensors; the same format over
// host buffers, free of LibTorch, is buffers.h (RunInfo,
// write_rank_buffers, finalize), which this one comes down to.
//
// The layer knows tensors and slices, not models or trainers: the training
// engine describes its state as a ShardedState (every tensor under its
// global name with the slice of the global tensor this rank holds), and
// this layer writes, verifies, lists and reads it back into any other
// ShardedState. The policy (when to save, what to keep, resuming a run)
// is the training loop's (engine/checkpointing.h).
//
// A checkpoint is a directory:
//   step-00000100/
//     rank-00000.safetensors ... rank-0000N.safetensors   each rank's slices
//     rank-00000.done.json ...                            each rank's index (written after its file)
//     manifest.json     the index of every file and tensor, the run's description
//     COMPLETE          written last: the manifest's SHA-256; without it the checkpoint does not exist
//
// Note [Slices]: a tensor of global shape G is held as pieces. A piece is a
// box — offset and shape per dimension, in global coordinates — and either
// the whole box (tensor shape = box shape) or a range [flat_begin, flat_end)
// of the box's row-major flattening (a 1-D tensor). A TP shard is a box
// (the block of the split dimension); a ZeRO segment is a flat range of a
// TP shard's box. A box may extend past G along a padded dimension (a
// vocabulary padded to a multiple of the TP size): elements outside G are
// padding, never read, and zero-filled in the target. Whole-box pieces are
// cropped to G before they are written, so an unsharded layout's files hold
// the tensor unpadded.
//
// Note [Atomic save]: every rank writes its file and then its .done.json
// into <dir>/step-N.tmp-<run id>, each fsynced; rank 0 waits for every
// rank's .done.json (the file system is the only channel: no collective, so
// a background writer may do this), writes manifest.json, fsyncs the
// directory, renames it to <dir>/step-N, fsyncs <dir>, then writes COMPLETE
// and fsyncs again. Every write, fsync, close and rename is checked and an
// error names the file and errno; a rank whose write fails leaves
// rank-N.failed with its error, and rank 0 stops waiting. A killed job
// leaves at most a .tmp directory or a step directory without COMPLETE,
// which no loader reads and the next run removes.
//
// Errors: CheckpointError (safetensors.h) naming the file and the problem.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torus/checkpoint/buffers.h"
#include "torus/checkpoint/safetensors.h"

namespace torus::ckpt {

// One piece of a global tensor (Note [Slices]).
struct TensorSlice {
  at::Tensor tensor;                  // the data (any device; contiguous or not)
  std::vector<int64_t> global_shape;  // the unpadded global tensor
  std::vector<int64_t> box_offset;    // empty: zeros (the whole tensor)
  std::vector<int64_t> box_shape;     // empty: global_shape
  int64_t flat_begin = -1;            // >= 0: `tensor` is [flat_begin, flat_end) of the flattened box
  int64_t flat_end = -1;
  // Rank-specific state (a dropout stream that differs per TP rank): read
  // back only by the same rank of the same layout.
  bool per_rank = false;
  // Not saved: a copy of the tensor named here (a tied embedding's copy on
  // the last pipeline stage); loaded from that name.
  std::string alias_of;
};
using ShardedState = std::map<std::string, TensorSlice>;

// Writes this rank's slices into <save_dir>/step-N.tmp-<run id> (creating
// it) and its .done.json. Tensors are read as they are: call on a snapshot
// (snapshot()) when training goes on meanwhile. Throws CheckpointError.
// Whole boxes are cropped to the global shape (Note [Slices]) and copied to
// the host; write_rank_buffers (buffers.h) writes them. Rank 0
// then publishes the checkpoint with finalize() (buffers.h).
RankWrite write_rank(const std::string& save_dir, int rank, const ShardedState& state, const RunInfo& info);

// A copy of `state` that training may not change: every tensor copied to
// host memory (pinned when it lives on a CUDA device), contiguous.
ShardedState snapshot(const ShardedState& state);

// ---------------------------------------------------------------------------
// Reading

// An opened, structurally checked checkpoint. open() reads COMPLETE and the
// manifest and checks: the manifest's SHA-256 against COMPLETE, its format
// version, that every file it names exists with its recorded size, and that
// every tensor's pieces lie inside its global shape. File checksums are
// checked when a file is first read (or all at once by verify()).
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const std::string& path() const;
  const RunInfo& info() const;
  // Every file's SHA-256 and safetensors header, and every rank file's run id
  // and step against the manifest. Throws CheckpointError naming the first
  // bad file.
  void verify() const;
  // The same for the files i with i % parts == part (the ranks of a job
  // share the hashing: resume() has each verify its part).
  void verify_files(int part, int parts) const;
  // Whether load_into/read_full hash the files they read (default on). A
  // collective loader that has every file verified by some rank
  // (verify_files) and agrees on the result before applying turns it off.
  void set_hash_reads(bool on);
  // Names of the global tensors, with their shape and dtype.
  struct TensorInfo {
    std::vector<int64_t> shape;
    c10::ScalarType dtype;
    int pieces = 0;
  };
  const std::map<std::string, TensorInfo>& tensors() const;
  uint64_t total_bytes() const;

  // Fills the slices of `target` (their tensors are written in place, with
  // dtype conversion) from the pieces that cover them. Keys the checkpoint
  // lacks are returned, not filled. A key that is present but not fully
  // covered, or of another global shape, throws CheckpointError naming it.
  // per_rank keys are filled only from `rank`'s file and only when
  // `same_layout`; otherwise they are reported as missing.
  std::vector<std::string> load_into(ShardedState& target, int rank, bool same_layout) const;

  // The whole tensor `name` (assembled from its pieces, unpadded, on the CPU).
  at::Tensor read_full(const std::string& name) const;

 private:
  struct Impl;
  explicit Checkpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One entry of a save directory.
struct Listed {
  std::string path;
  int64_t step = -1;
  bool complete = false;  // COMPLETE present and the manifest opened
  std::string problem;    // why it is not usable (empty when complete)
};
// The checkpoints under `save_dir` (step-N directories and leftover .tmp
// ones), oldest first. Checks structure (Checkpoint::open), not checksums.
std::vector<Listed> list_checkpoints(const std::string& save_dir);

// Writes the model tensors (names starting with `prefix`, which is stripped)
// of a checkpoint as one consolidated safetensors file of full, unpadded
// tensors, atomically (a temporary name, fsync, rename). Returns the count.
int64_t export_safetensors(const Checkpoint& ckpt, const std::string& out_path, const std::string& prefix = "model.");

// A plain safetensors file (any writer: PyTorch's safetensors, Hugging Face)
// read as full tensors on the CPU, validated (safetensors.h).
std::map<std::string, at::Tensor> read_safetensors(const std::string& path);
// Writes full tensors as a plain safetensors file (atomic as above).
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// safetensors dtype code <-> LibTorch dtype; CheckpointError when unknown.
std::string dtype_code(c10::ScalarType dtype);
c10::ScalarType dtype_from_code(const std::string& code);

}  // namespace torus::ckpt
