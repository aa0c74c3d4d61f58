// torus/parallel/pipeline/executor.h — runs a pipeline schedule on tensors.
//
// PipelineExecutor executes one rank's list of a valid Schedule (schedule.h):
// compute actions call the rank's StageCallbacks; communication actions move
// activations and gradients to and from the neighbouring stages' ranks with
// ProcessGroup send/recv, exactly as Note [Communication semantics] states —
// sends are posted and not waited for until the end of the step, a receive
// blocks until its tensor has arrived. The executor knows nothing about the
// model: any module split into stages plugs in through StageCallbacks.
//
//   auto sched = torus::pp::make_schedule({ScheduleKind::k1F1B, pp->size(), m});
//   torus::pp::PipelineExecutor exec(pp);        // pp: the pipeline group
//   auto result = exec.run(sched, my_stage);     // my_stage: StageCallbacks
//   // rank holding the last stage: result.losses[micro]
//
// Note [Shape agreement]: every edge (stage s -> s+1) carries tensors of one
// shape and dtype: activations forward, their gradients backward. Either the
// caller declares them (ExecutorOptions::edge_specs), or they are agreed
// once per executor: the first activation an edge carries is preceded by a
// small header (dtype and sizes); later steps reuse the spec. A tensor that
// does not match its edge's spec is an InvalidArgument on the rank that
// produced it. Variable shapes per micro-batch are not supported.
//
// Note [Pipeline tags]: messages are told apart by tag, not by order: edge e
// header -> tag e; the activation (grad = 0) or gradient (grad = 1) of
// micro-batch b on edge e -> tag (S-1) + 2*(b*(S-1) + e) + grad, S = p*v
// stages. The executor therefore owns the point-to-point tags of its group;
// give it a group of its own (DeviceMesh's "pp" group).
//
// Threading: one run() at a time per executor; callbacks run on the caller's
// thread, in schedule order. Not thread safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "torus/comm/process_group.h"
#include "torus/parallel/pipeline/schedule.h"

namespace torus::pp {

// What one rank's chunks of the model do. `chunk` is the rank's local chunk
// index (stage = chunk * p + rank, Note [Stage layout]). A callback may keep
// whatever state its backward needs, keyed by (micro, chunk); every
// (micro, chunk) of a valid schedule sees forward, then either backward or
// backward_input followed (possibly much later) by backward_weight.
// Exceptions thrown by a callback propagate out of run().
class StageCallbacks {
 public:
  virtual ~StageCallbacks() = default;

  // `input`: the activation received from the previous stage; undefined on
  // stage 0, which reads its own micro-batch. Returns the chunk's output:
  // the activation for the next stage, or on the last stage the value loss()
  // turns into the micro-batch's loss.
  virtual at::Tensor forward(int micro, int chunk, const at::Tensor& input) = 0;

  // Last stage only, right after its forward: the micro-batch's loss, a
  // one-element tensor (the executor keeps it detached in StepResult).
  // Default: the output itself, for a forward that returns the loss.
  virtual at::Tensor loss(int micro, const at::Tensor& output);

  // The gradient with respect to the chunk's input given `grad_output`, the
  // gradient with respect to its output (undefined on the last stage:
  // differentiate the loss). The result is sent to the previous stage; on
  // stage 0 it is ignored and may be undefined. Weight gradients may be
  // computed here or left to backward_weight.
  virtual at::Tensor backward_input(int micro, int chunk, const at::Tensor& grad_output) = 0;

  // Accumulates the weight gradients of (micro, chunk) into the parameters'
  // gradients. Called once per (micro, chunk) after backward_input, by
  // schedules that split the backward (ZB-H1).
  virtual void backward_weight(int micro, int chunk) = 0;

  // A fused backward (schedules that do not split it). Default:
  // backward_input, then backward_weight.
  virtual at::Tensor backward(int micro, int chunk, const at::Tensor& grad_output);
};

struct TensorSpec {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

struct ExecutorOptions {
  // Note [Shape agreement]: empty: agreed on first use; one entry: every
  // edge; S-1 entries: edge by edge.
  std::vector<TensorSpec> edge_specs;
  // Where received tensors live (the ProcessGroup picks the backend by it).
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // Deadline of each send/recv; 0: the group's timeout.
  comm::Duration timeout{0};
  // How many upcoming receives are posted ahead of the action that waits
  // for them, so that transfers overlap compute (0: post at the receive).
  int recv_prefetch = 2;
  // Keep a timestamped record of every action in StepResult::trace.
  bool record_trace = false;
};

struct ActionRecord {
  Action action;
  double start = 0;  // seconds since run() began
  double end = 0;
};

struct StepResult {
  // Per micro-batch, on the rank holding the last stage; empty elsewhere.
  std::vector<at::Tensor> losses;
  // Steady-clock time of run()'s start, in seconds since the clock's epoch:
  // aligns the records of ranks on one host.
  double origin = 0;
  double wall = 0;  // seconds in run(), including the wait for the last sends
  double busy = 0;  // seconds inside compute callbacks
  // Max (micro, chunk) pairs forwarded and not yet through their weight
  // gradient, as RankStats::peak_live counts them.
  int peak_live = 0;
  std::vector<ActionRecord> trace;  // with ExecutorOptions::record_trace
};

class PipelineExecutor {
 public:
  // `group`: the pipeline group; its rank is the pipeline rank. Not
  // collective. Throws InvalidArgument on a null group or bad options.
  explicit PipelineExecutor(comm::ProcessGroupPtr group, ExecutorOptions options = {});
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  // Runs this rank's actions of `schedule`. Collective over the group: every
  // rank calls it with the same schedule. Validates the schedule first
  // (check_schedule) and throws InvalidArgument before any communication if
  // it is invalid or sized for another group — every rank reaches the same
  // verdict. Blocks until this rank's actions are done and every send it
  // posted has completed. Throws InvalidArgument for a tensor that breaks
  // Note [Shape agreement] or a callback result that is missing; the
  // TimeoutError or CommError of a failed transfer; whatever a callback
  // throws. After a throw the step is lost and peers may wait until their
  // deadline; build a new executor before the next step.
  StepResult run(const Schedule& schedule, StageCallbacks& callbacks);

  const comm::ProcessGroupPtr& group() const { return group_; }
  const ExecutorOptions& options() const { return options_; }

 private:
  struct EdgeState;
  comm::ProcessGroupPtr group_;
  ExecutorOptions options_;
  int num_stages_ = 0;            // stage count the edge states belong to
  std::vector<EdgeState> edges_;  // per edge, kept across steps
};

}  // namespace torus::pp
