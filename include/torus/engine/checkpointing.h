// torus/engine/checkpointing.h — checkpoints of a training run: the engine's
// state as sharded slices (checkpoint/checkpoint.h), the save policy
// (--save-every, --keep-last, --async-save), and resuming (--resume) or
// starting from a plain safetensors file (--init-from). docs/checkpoint.md.
//
// The engine's state (Trainer::state_dict) maps onto slices of global
// tensors (Note [Slices] in checkpoint.h):
//   * a parameter, or its optimizer state, split over TP is the box of its
//     TP shard along the split dimension (the vocabulary's padding cut off);
//     a replicated one is the whole tensor;
//   * under ZeRO, a rank's segment of it is the flat range [flat_offset,
//     flat_offset + numel) of that box;
//   * a tied copy (the output layer of the last stage) is not saved and is
//     loaded from the parameter it copies;
//   * dropout streams (rng.*) are per rank: restored only in the same layout;
//   * every piece is written once: a tensor replicated over dp by one dp rank
//     (the dp ranks share them by bytes, Note [Balanced writers]; TP rank 0
//     when it is replicated over TP too), ZeRO segments by their owner.
// Loading fills this rank's slices from whatever pieces cover them, so a
// checkpoint of any layout (tp, pp, dp, ZeRO stage) loads into any other.
//
// Note [Save consistency]: a save is taken between steps, on the main
// thread. Synchronous: every rank writes, rank 0 completes the checkpoint,
// then one all-reduce of a success flag over the world tells every rank that
// it is complete (or that it failed, and where). Asynchronous: the small
// tensors (dropout streams, counters, the loss scaler) are copied at once;
// a background thread copies the parameters and optimizer state to host
// memory (checkpoint::snapshot) while the next step's forward and backward
// run — they change neither — and the trainer holds that step's update
// until the copy is done (Trainer::set_before_update); then the thread
// writes and, on rank 0, completes the checkpoint, using only the file
// system, never a collective. The stall is the main thread's part plus the
// time the update waited. The next save (and the end of the run) first
// waits for it and agrees on its success over the world, on the main
// thread. A failed save throws CheckpointError on every rank (the failing
// rank's message names the file and errno); the previous checkpoint stays
// the newest good one. keep-last deletes older checkpoints only after a
// newer one is complete.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torus/checkpoint/checkpoint.h"
#include "torus/comm/process_group.h"
#include "torus/engine/trainer.h"

namespace torus::engine {

// This rank's state as slices of global tensors. for_save: only the pieces
// this rank writes (each piece once over the job); otherwise every slice the
// rank holds (the target of a load). Tensors alias the live state.
ckpt::ShardedState sharded_state(const Trainer& trainer, bool for_save);

// The layout of a trainer as the manifest records it (JSON object text):
// tp, pp, dp, ep, zero, chunks, stage cut, world size, precision, schedule.
std::string layout_json(const Trainer& trainer, const std::string& precision);

struct LoadReport {
  std::string path;
  int64_t step = 0;
  bool same_layout = false;
  std::vector<std::string> kept;  // keys kept at their current value (not in the checkpoint or not applicable)
};

// Loads a checkpoint into `trainer` (not collective): this rank's slices of
// every model and optimizer tensor, the step counts, the loss scaler and,
// in the same layout, the dropout streams. model_only: parameters only
// (optimizer state and counters keep their values). Throws CheckpointError
// for a corrupt or incomplete checkpoint or a tensor it lacks or shapes
// differently, naming it; nothing changes in the trainer then.
LoadReport load_checkpoint(Trainer& trainer, const ckpt::Checkpoint& ckpt, const std::string& current_layout_json,
                           bool model_only = false);

// ---- model weights from elsewhere (--init-from) ----------------------------
//
// Note [Weight sources]: a WeightSource answers, for a model parameter's bare
// global name ("blocks.0.qkv.weight"), the full tensor in the global layout
// (unpadded, on the CPU, any dtype) or "absent". The tensor is described by
// its shape and a function that reads any box of it: a source over a
// memory map returns strided views (a transpose, a narrow), or gathers just
// the rows the box needs when the global layout is a permutation of the
// source's, so that each rank copies — and touches the pages of — only its
// slices. load_weights() fills every slice this rank holds: the box (zero
// padding past the global shape), then the ZeRO flat range, converting the
// dtype on the copy; a tied copy (alias_of) is read under the name it
// copies, a half-precision run's fp32 master under its parameter's name.
struct SourceTensor {
  std::vector<int64_t> shape;  // the global shape it answers
  std::string origin;          // where it comes from, for messages ("h.0.attn.c_attn.weight, transposed")
  // The box [offset, offset + size) (inside `shape`): any dtype and strides.
  std::function<at::Tensor(const std::vector<int64_t>& offset, const std::vector<int64_t>& size)> read;
  // A source tensor over a whole tensor (a view or not): boxes are narrows of it.
  static SourceTensor of(at::Tensor full, std::string origin);
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The tensor behind parameter `name`, or nullopt when the source lacks it.
  // May throw CheckpointError (a source tensor of an impossible shape,
  // naming it). Called from the loading thread only.
  virtual std::optional<SourceTensor> find(const std::string& name) const = 0;
  // The source, for messages ("model.safetensors", "Hugging Face gpt2 in DIR").
  virtual std::string describe() const = 0;
  // What the source looked for behind `name`, for the message of an absent one.
  virtual std::string expected(const std::string& name) const { return "'" + name + "'"; }
};

// Fills this rank's slices of every model parameter (and fp32 master) from
// `source` (Note [Weight sources]); optimizer state and counters are kept.
// Every parameter must be found with its global shape: CheckpointError
// naming the parameter and what the source holds (or looked for) for the
// first that is not, before anything in the trainer changes. Not collective.
void load_weights(Trainer& trainer, const WeightSource& source);

// Model parameters from a plain safetensors file of full tensors under the
// model's global names ("blocks.0.attn.qkv.weight"; a "model." prefix is
// accepted): each rank takes its slices, read through a memory map
// (load_weights over the file). Every parameter must be present with its
// global shape (CheckpointError naming the first that is not).
void load_safetensors_weights(Trainer& trainer, const std::string& path);

struct CheckpointPolicy {
  std::string dir;
  int64_t every = 0;   // steps between saves (0: none)
  bool final = false;  // save at the end
  int keep_last = 0;   // 0: keep all
  bool async = false;
  double peer_timeout_s = 600;
};

// What the manifest describes besides the tensors (RunInfo, less the step).
struct RunDescription {
  std::string layout = "{}";
  std::string model = "{}";
  std::string data = "{}";
  std::string options = "{}";
  // Where the data stream stands after `step` steps (JSON object text, e.g.
  // {"epoch": 1, "sample_in_epoch": 40, ...}), merged into the manifest's
  // data record of the checkpoint of that step; unset: only the step.
  std::function<std::string(int64_t step)> data_position;
};

// Saves a run's checkpoints by a policy (Note [Save consistency]).
class Checkpointer {
 public:
  // Collective over `world` (agrees on the run id); rank 0 removes the
  // temporary directories earlier runs left in policy.dir.
  Checkpointer(comm::ProcessGroupPtr world, Trainer& trainer, CheckpointPolicy policy, RunDescription run);
  ~Checkpointer();  // waits for a background save; never throws (logs a failure)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // After step `step` (1-based count of steps taken) with the metrics that
  // continuing the plots needs (JSON object text): saves when the policy
  // says so (every N, or last with final). Collective. Returns whether it
  // saved (or started an asynchronous save).
  bool after_step(int64_t step, bool last, const std::string& metrics_json);
  // Saves now. Collective.
  void save(int64_t step, const std::string& metrics_json);
  // Waits for a background save and agrees on its success (collective);
  // throws CheckpointError on every rank when it failed.
  void wait();

  // Seconds the last save held the main thread (the training stall: for an
  // asynchronous save, save() itself plus the time the next update waited
  // for the snapshot), and the last save's total wall time (for async: until
  // written and complete).
  double last_stall_s() const;
  double last_save_s() const;
  const std::string& last_path() const;
  const std::string& run_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --resume, collective over `world`. `spec` is "auto" (the newest complete
// checkpoint in `dir` that loads on every rank: the ones skipped are logged
// with the reason, e.g. a file whose checksum fails) or a path (that one,
// or CheckpointError on every rank). `check` is called with each candidate
// before it is read (the training loop refuses another model or other data
// there, InvalidArgument naming the difference: not skipped, thrown). The
// state is applied only after every rank has read and verified its slices.
// Returns the report; an empty path when "auto" finds nothing to resume.
LoadReport resume(const comm::ProcessGroupPtr& world, Trainer& trainer, const std::string& spec, const std::string& dir,
                  const std::string& current_layout_json,
                  const std::function<void(const ckpt::Checkpoint&)>& check = {});

}  // namespace torus::engine
