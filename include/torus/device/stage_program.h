// torus/device/stage_program.h — a precompiled program that runs one
// pipeline stage (or any fixed computation) on a device: load it, bind its
// named inputs and outputs to device memory, execute, time.
//
// This is the seam for stages compiled elsewhere: on Trainium, Torus does not
// run LibTorch modules on NeuronCores (docs/neuron.md); a stage's forward and
// backward are compiled ahead of time (neuronx-cc) into NEFF programs, and
// Torus's schedules drive them through this interface, moving activations
// and gradients between stages with the comm backends. The interface names
// no runtime type; load_neff() gives the Neuron implementation.
//
//   auto fwd = torus::device::neuron::load_neff("stage1_fwd.neff", /*core=*/0);
//   for (const auto& t : fwd->tensors()) ...        // names, sizes, inputs/outputs
//   fwd->bind("input0", act_in, bytes);             // Neuron device pointers
//   fwd->bind("output0", act_out, bytes);
//   fwd->execute();                                 // synchronous
//   fwd->stats().last_ms;
//
// Errors: a name the program does not have, a size that differs from the
// program's, host memory, or executing with a tensor unbound throw
// InvalidArgument before the runtime is called; a file that is missing or
// not a program, and a failed execution, throw Error naming the file and the
// runtime's status. The program's bytes are handed to the runtime, which
// validates them; Torus never interprets or runs them on the host.
// Thread safety: one program is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace torus::device {

struct ProgramTensor {
  std::string name;
  size_t bytes = 0;
  bool input = true;  // false: an output
};

struct ProgramStats {
  uint64_t executions = 0;
  double last_ms = 0;
  double total_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
};

class StageProgram {
 public:
  virtual ~StageProgram() = default;
  // Where it came from (a path, or "<memory>"), for messages.
  virtual const std::string& source() const = 0;
  // Inputs first, then outputs, in the program's order.
  virtual const std::vector<ProgramTensor>& tensors() const = 0;
  // Binds tensor `name` to `bytes` of device memory at `ptr` (exactly the
  // program's size). A later bind of the same name replaces it.
  virtual void bind(const std::string& name, void* ptr, size_t bytes) = 0;
  // Runs once with the bound tensors; returns when the outputs are written.
  virtual void execute() = 0;
  virtual ProgramStats stats() const = 0;
};

namespace neuron {

// A NEFF program loaded onto NeuronCore `core` (a logical core of this
// process, like the device index). Throws Error when the runtime is
// unavailable or lacks program support.
std::unique_ptr<StageProgram> load_neff(const std::string& path, int core);
std::unique_ptr<StageProgram> load_neff(std::span<const std::byte> bytes, int core);

}  // namespace neuron
}  // namespace torus::device
