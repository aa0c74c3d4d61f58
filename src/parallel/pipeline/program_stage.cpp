// ProgramStage (torus/parallel/pipeline/program_stage.h): StageCallbacks over
// precompiled programs, with activations staged through host tensors.
#include "torus/parallel/pipeline/program_stage.h"

#include <ATen/Functions.h>

#include "core/log.h"

namespace torus::pp {
namespace {

const device::ProgramTensor* find(const device::StageProgram* p, const char* name, bool input) {
  for (const auto& t : p->tensors()) {
    if (t.name == name && t.input == input) return &t;
  }
  return nullptr;
}

void need(const device::StageProgram* p, const char* name, bool input, const char* role, int chunk) {
  TORUS_CHECK(find(p, name, input) != nullptr, InvalidArgument,
              "ProgramStage: the {} program of chunk {} ('{}') has no {} '{}'", role, chunk, p->source(),
              input ? "input" : "output", name);
}

}  // namespace

ProgramStage::ProgramStage(DeviceType device, std::vector<CompiledChunk> chunks, bool first, bool last,
                           MicroInput data)
    : device_(device), chunks_(std::move(chunks)), first_(first), last_(last), data_(std::move(data)) {
  TORUS_CHECK(!chunks_.empty(), InvalidArgument, "ProgramStage: no chunks");
  TORUS_CHECK(!(first || last) || data_, InvalidArgument,
              "ProgramStage: the first and the last stage need the micro-batches' data (MicroInput)");
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
    const CompiledChunk& k = chunks_[static_cast<size_t>(c)];
    TORUS_CHECK(k.forward != nullptr && k.backward_input != nullptr, InvalidArgument,
                "ProgramStage: chunk {} needs a forward and a backward_input program", c);
    need(k.forward, "input", true, "forward", c);
    need(k.backward_input, "input", true, "backward_input", c);
    if (!is_first(c)) {
      need(k.backward_input, "grad_input", false, "backward_input", c);
      TORUS_CHECK(bytes_of(k.backward_input, "grad_input") == bytes_of(k.forward, "input"), InvalidArgument,
                  "ProgramStage: chunk {}: grad_input ({} bytes) and input ({} bytes) differ", c,
                  bytes_of(k.backward_input, "grad_input"), bytes_of(k.forward, "input"));
    }
    if (is_last(c)) {
      need(k.forward, "loss", false, "forward", c);
      TORUS_CHECK(bytes_of(k.forward, "loss") == sizeof(float), InvalidArgument,
                  "ProgramStage: the loss of chunk {} must be one f32", c);
    } else {
      need(k.forward, "output", false, "forward", c);
      need(k.backward_input, "grad_output", true, "backward_input", c);
    }
    if (k.backward_weight != nullptr) {
      need(k.backward_weight, "input", true, "backward_weight", c);
      if (!is_last(c)) need(k.backward_weight, "grad_output", true, "backward_weight", c);
    }
  }
}

ProgramStage::~ProgramStage() = default;

TensorSpec ProgramStage::edge_spec(size_t bytes) {
  TORUS_CHECK(bytes % sizeof(float) == 0, InvalidArgument, "ProgramStage: an edge of {} bytes is not f32", bytes);
  return TensorSpec{{static_cast<int64_t>(bytes / sizeof(float))}, c10::ScalarType::Float};
}

size_t ProgramStage::bytes_of(device::StageProgram* p, const char* name) const {
  for (const auto& t : p->tensors()) {
    if (t.name == name) return t.bytes;
  }
  return 0;
}

device::DeviceBuffer& ProgramStage::scratch(int chunk, const char* name, size_t bytes) {
  auto& b = scratch_[{chunk, name}];
  if (b.size() != bytes) b = device::DeviceBuffer(device_, bytes);
  return b;
}

device::DeviceBuffer ProgramStage::to_device(const at::Tensor& t, size_t bytes, const char* what) const {
  TORUS_CHECK(t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                  static_cast<size_t>(t.numel()) * sizeof(float) == bytes,
              InvalidArgument, "ProgramStage: the {} must be a contiguous f32 CPU tensor of {} bytes", what, bytes);
  device::DeviceBuffer b(device_, bytes);
  device::get_device(device_).copy(b.data(), t.data_ptr(), bytes);
  return b;
}

at::Tensor ProgramStage::to_host(const device::DeviceBuffer& b, size_t bytes) const {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes / sizeof(float))}, at::kFloat);
  device::get_device(device_).copy(t.data_ptr(), b.data(), bytes);
  return t;
}

void ProgramStage::bind_saved(device::StageProgram* p, int chunk, Saved& s) {
  p->bind("input", s.input.data(), s.input.size());
  if (s.target.size() != 0 && find(p, "target", true) != nullptr) p->bind("target", s.target.data(), s.target.size());
  if (!is_last(chunk)) p->bind("grad_output", s.grad_output.data(), s.grad_output.size());
}

at::Tensor ProgramStage::forward(int micro, int chunk, const at::Tensor& input) {
  const CompiledChunk& k = chunks_.at(static_cast<size_t>(chunk));
  Saved& s = saved_[{micro, chunk}];
  const size_t in_bytes = bytes_of(k.forward, "input");
  s.input = is_first(chunk) ? to_device(data_(micro, "input"), in_bytes, "micro-batch input")
                            : to_device(input, in_bytes, "forward input");
  k.forward->bind("input", s.input.data(), in_bytes);
  if (is_last(chunk) && find(k.forward, "target", true) != nullptr) {
    const size_t t_bytes = bytes_of(k.forward, "target");
    s.target = to_device(data_(micro, "target"), t_bytes, "micro-batch target");
    k.forward->bind("target", s.target.data(), t_bytes);
  }
  const char* out_name = is_last(chunk) ? "loss" : "output";
  const size_t out_bytes = bytes_of(k.forward, out_name);
  device::DeviceBuffer& out = scratch(chunk, out_name, out_bytes);
  k.forward->bind(out_name, out.data(), out_bytes);
  k.forward->execute();
  return to_host(out, out_bytes);
}

at::Tensor ProgramStage::loss(int, const at::Tensor& output) { return output.reshape({}); }

at::Tensor ProgramStage::backward_input(int micro, int chunk, const at::Tensor& grad_output) {
  const CompiledChunk& k = chunks_.at(static_cast<size_t>(chunk));
  auto it = saved_.find({micro, chunk});
  TORUS_CHECK(it != saved_.end(), InvalidArgument, "ProgramStage: backward of micro-batch {} chunk {} before its forward",
              micro, chunk);
  Saved& s = it->second;
  if (!is_last(chunk)) {
    s.grad_output = to_device(grad_output, bytes_of(k.backward_input, "grad_output"), "output gradient");
  }
  bind_saved(k.backward_input, chunk, s);
  at::Tensor result;
  device::DeviceBuffer* gin = nullptr;
  size_t gin_bytes = 0;
  if (!is_first(chunk)) {
    gin_bytes = bytes_of(k.backward_input, "grad_input");
    gin = &scratch(chunk, "grad_input", gin_bytes);
    k.backward_input->bind("grad_input", gin->data(), gin_bytes);
  }
  k.backward_input->execute();
  if (gin != nullptr) result = to_host(*gin, gin_bytes);
  return result;
}

void ProgramStage::backward_weight(int micro, int chunk) {
  const CompiledChunk& k = chunks_.at(static_cast<size_t>(chunk));
  auto it = saved_.find({micro, chunk});
  TORUS_CHECK(it != saved_.end(), InvalidArgument,
              "ProgramStage: weight gradient of micro-batch {} chunk {} before its forward", micro, chunk);
  if (k.backward_weight != nullptr) {
    bind_saved(k.backward_weight, chunk, it->second);
    k.backward_weight->execute();
  }
  saved_.erase(it);
}

size_t ProgramStage::live_bytes() const {
  size_t n = 0;
  for (const auto& [key, s] : saved_) n += s.input.size() + s.target.size() + s.grad_output.size();
  return n;
}

}  // namespace torus::pp
