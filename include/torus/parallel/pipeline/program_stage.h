// torus/parallel/pipeline/program_stage.h — a pipeline stage made of
// precompiled programs (StageProgram, torus/device/stage_program.h), run by
// PipelineExecutor under any schedule.
//
// This is how a stage compiled elsewhere — on Trainium, NEFFs from
// neuronx-cc, since Torus runs no LibTorch module on NeuronCores
// (docs/neuron.md) — trains under Torus's schedules: ProgramStage is the
// StageCallbacks of such a rank. Each of its chunks is three programs on one
// device, bound by tensor name:
//   forward          inputs  "input"; on the last stage also "target" if it
//                            has one
//                    outputs "output" (the last stage: "loss", one f32)
//   backward_input   inputs  "input", "grad_output" (not on the last stage),
//                            "target" (last stage, if it has one)
//                    outputs "grad_input" (not on stage 0)
//   backward_weight  the inputs of backward_input; accumulates the chunk's
//                    weight gradients into buffers the caller bound
// Stage 0's "input" and the last stage's "target" are the micro-batch's data,
// from the caller's MicroInput; every other "input" is the activation the
// previous stage sent. Weights and weight gradients are bound by the caller;
// ProgramStage binds only the names above, per micro-batch, to device
// buffers it owns. A chunk without backward_weight computes its weight
// gradients in backward_input.
//
// Activations and gradients cross stages as host tensors (the executor's
// send/recv over a host backend): each program's device output is copied to
// host memory and each received tensor to the device. That is two copies per
// transfer more than a device backend with send/recv would need (the neuron
// backend has none yet). The edge tensors are 1-D f32 of the programs' byte
// sizes / 4; ExecutorOptions::edge_specs must say so (edge_spec()).
//
// Memory: one device copy of every live micro-batch's input and output
// gradient, freed after its weight gradient; program outputs are reused.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include "torus/core/dtype.h"
#include "torus/device/device.h"
#include "torus/device/stage_program.h"
#include "torus/parallel/pipeline/executor.h"

namespace torus::pp {

struct CompiledChunk {
  device::StageProgram* forward = nullptr;
  device::StageProgram* backward_input = nullptr;
  device::StageProgram* backward_weight = nullptr;  // optional
};

// The micro-batch's data: name is "input" (stage 0) or "target" (the last
// stage); a contiguous f32 CPU tensor of the program's size.
using MicroInput = std::function<at::Tensor(int micro, const std::string& name)>;

class ProgramStage final : public StageCallbacks {
 public:
  // `chunks[c]`: this rank's chunk c (stage c * p + rank). `first`/`last`:
  // whether this rank holds stage 0 / stage S-1 (in its first / last chunk).
  // Throws InvalidArgument when a program lacks a tensor its role needs, or
  // when neighbouring programs disagree on a size.
  ProgramStage(DeviceType device, std::vector<CompiledChunk> chunks, bool first, bool last, MicroInput data);
  ~ProgramStage() override;

  // The spec of the edge tensors a chunk of `bytes` activations carries.
  static TensorSpec edge_spec(size_t bytes);

  at::Tensor forward(int micro, int chunk, const at::Tensor& input) override;
  at::Tensor loss(int micro, const at::Tensor& output) override;
  at::Tensor backward_input(int micro, int chunk, const at::Tensor& grad_output) override;
  void backward_weight(int micro, int chunk) override;

  // Device bytes held for live micro-batches (inputs and output gradients).
  size_t live_bytes() const;

 private:
  struct Saved {
    device::DeviceBuffer input;
    device::DeviceBuffer target;
    device::DeviceBuffer grad_output;
  };
  void bind_saved(device::StageProgram* p, int chunk, Saved& s);
  bool is_first(int chunk) const { return first_ && chunk == 0; }
  bool is_last(int chunk) const { return last_ && chunk + 1 == static_cast<int>(chunks_.size()); }
  size_t bytes_of(device::StageProgram* p, const char* name) const;
  device::DeviceBuffer& scratch(int chunk, const char* name, size_t bytes);
  device::DeviceBuffer to_device(const at::Tensor& t, size_t bytes, const char* what) const;
  at::Tensor to_host(const device::DeviceBuffer& b, size_t bytes) const;

  DeviceType device_;
  std::vector<CompiledChunk> chunks_;
  bool first_, last_;
  MicroInput data_;
  std::map<std::pair<int, int>, Saved> saved_;  // (micro, chunk)
  std::map<std::pair<int, std::string>, device::DeviceBuffer> scratch_;  // (chunk, name): program outputs
};

}  // namespace torus::pp
