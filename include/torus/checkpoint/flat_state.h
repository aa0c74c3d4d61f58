// torus/checkpoint/flat_state.h — the flat state of a buffer-level
// optimizer (optim/flat_state.h: HostOffloadAdam, the Neuron host
// optimizer) saved into and loaded from the Torus checkpoint format, over a
// comm group, free of LibTorch.
//
//   ckpt::RunInfo info;  info.run_id = "run-7";  info.step = opt.steps();
//   const std::string path = ckpt::save_flat_state(dp, "ckpts", opt.state_dict(), info);
//   ...
//   opt.load_state_dict(ckpt::read_flat_state(dp, path, opt.state_dict()).state());
//
// A flat state is an ordinary checkpoint (checkpoint.h, docs/checkpoint.md):
// every FlatTensor is a global 1-D tensor under its name, each rank's range
// [offset, offset + numel) a flat piece of its box (Note [Slices]) in the
// rank's file, a replicated tensor written once, by rank 0; the state's meta
// is the manifest's "state" object. It is written with write_rank_buffers()
// and finalize() (buffers.h: COMPLETE last, every file's SHA-256 in the
// manifest), and torus-ckpt lists, verifies and exports it like any other.
//
// Note [Flat state agreement]: both calls are collective over `group` and
// fail on every rank or on none. Saving: every rank writes its file; the
// ranks agree (comm/agree.h) that all of them did; only then does rank 0
// publish the checkpoint, and they agree again. A failure anywhere throws
// CheckpointError on every rank (the failing rank's message names the file
// and errno) and publishes nothing: an interrupted save leaves no COMPLETE,
// so it is never taken for a checkpoint (rank 0 removes the temporary
// directory of a failed one). Loading: every rank opens the checkpoint,
// compares its meta, names, dtypes and global sizes with `like`'s, reads
// its ranges (from whichever pieces hold them: any dp size) into host
// memory of its own and verifies the SHA-256 of a share of the files (file
// i by rank i % size); the ranks agree that all of them succeeded, and only
// then does any caller see the data. Nothing of the optimizer changes on a
// failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "torus/checkpoint/buffers.h"
#include "torus/comm/types.h"
#include "torus/optim/flat_state.h"

namespace torus::comm {
class Backend;
}

namespace torus::ckpt {

struct FlatSaveOptions {
  SaveOptions save;  // rank 0's wait for the other ranks' files
  comm::Duration timeout = std::chrono::minutes(10);  // of each agreement
};

// Saves `state` (this rank's part) as the checkpoint <save_dir>/step-N,
// N = info.step; info.world_size and info.state are set here (the group's
// size, the state's meta). Collective over `group` (Note [Flat state
// agreement]); returns the checkpoint's path on every rank. Throws
// CheckpointError, or InvalidArgument for a malformed state or run id.
std::string save_flat_state(comm::Backend& group, const std::string& save_dir, const optim::FlatState& state,
                            RunInfo info, const FlatSaveOptions& options = {});

// A flat state read from a checkpoint: host buffers of its own, shaped as
// the `like` state it was read for.
class LoadedFlatState {
 public:
  const optim::FlatState& state() const { return state_; }
  const RunInfo& info() const { return info_; }

 private:
  friend LoadedFlatState read_flat_state(comm::Backend&, const std::string&, const optim::FlatState&,
                                         comm::Duration);
  optim::FlatState state_;
  std::vector<std::vector<uint8_t>> storage_;
  RunInfo info_;
};

// Reads from the checkpoint at `path` the ranges `like` (this rank's
// state_dict()) describes. Collective over `group` (Note [Flat state
// agreement]). Throws CheckpointError on every rank when the checkpoint is
// incomplete or corrupt on any rank, or its state differs from `like`'s in
// meta, names, dtypes or global sizes.
LoadedFlatState read_flat_state(comm::Backend& group, const std::string& path, const optim::FlatState& like,
                                comm::Duration timeout = std::chrono::minutes(10));

}  // namespace torus::ckpt
