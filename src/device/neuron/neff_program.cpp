// StageProgram over the Neuron runtime's program API (nrt_load, tensor sets,
// nrt_execute). Bound device pointers are mapped to runtime tensors (or
// slices of them) with the address map of neuron_memory.h.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "core/log.h"
#include "device/neuron/neuron_memory.h"
#include "device/neuron/nrt_api.h"
#include "torus/device/stage_program.h"

namespace torus::device::neuron {
namespace {

class NeffProgram final : public StageProgram {
 public:
  NeffProgram(std::string source, std::span<const std::byte> bytes, int core)
      : lib_(NrtLibrary::require("a NEFF program")), source_(std::move(source)) {
    const NrtApi& api = lib_.api();
    TORUS_CHECK(api.has_programs(), Error, "{}: Neuron runtime {} ('{}') lacks the program API (nrt_load)", source_,
                lib_.version_string(), lib_.path());
    TORUS_CHECK(core >= 0 && core < lib_.visible_cores(), InvalidArgument,
                "{}: NeuronCore {} is not visible ({} visible)", source_, core, lib_.visible_cores());
    TORUS_CHECK(!bytes.empty(), InvalidArgument, "{}: the program is empty", source_);
    NRT_STATUS s = api.nrt_load(bytes.data(), bytes.size(), core, 1, &model_);
    TORUS_CHECK(s == NRT_SUCCESS && model_ != nullptr, Error,
                "{}: the Neuron runtime refused the program (nrt_load: {}); is it a NEFF compiled for this "
                "instance type and runtime?",
                source_, status_name(s));
    nrt_tensor_info_array_t* info = nullptr;
    s = api.nrt_get_model_tensor_info(model_, &info);
    if (s != NRT_SUCCESS || info == nullptr) {
      api.nrt_unload(model_);
      throw Error(fmt::format("{}: nrt_get_model_tensor_info failed: {}", source_, status_name(s)));
    }
    for (int pass = 0; pass < 2; ++pass) {  // inputs, then outputs
      for (uint64_t i = 0; i < info->tensor_count; ++i) {
        const nrt_tensor_info_t& t = info->tensor_array[i];
        bool input = t.usage == NRT_TENSOR_USAGE_INPUT;
        if (input != (pass == 0)) continue;
        tensors_.push_back(ProgramTensor{std::string(t.name), t.size, input});
      }
    }
    api.nrt_free_model_tensor_info(info);
  }

  ~NeffProgram() override {
    const NrtApi& api = lib_.api();
    for (auto& [name, b] : bound_) release(b);
    if (model_ != nullptr) api.nrt_unload(model_);
  }

  const std::string& source() const override { return source_; }
  const std::vector<ProgramTensor>& tensors() const override { return tensors_; }

  void bind(const std::string& name, void* ptr, size_t bytes) override {
    const ProgramTensor* t = find(name);
    TORUS_CHECK(t != nullptr, InvalidArgument, "{}: the program has no tensor '{}' (it has: {})", source_, name,
                names());
    TORUS_CHECK(bytes == t->bytes, InvalidArgument, "{}: tensor '{}' is {} bytes, the binding is {}", source_, name,
                t->bytes, bytes);
    NeuronMemory& mem = NeuronMemory::get();
    TORUS_CHECK(mem.is_device_address(ptr), InvalidArgument,
                "{}: tensor '{}' must be bound to Neuron device memory, not {}", source_, name, ptr);
    auto r = mem.resolve(ptr, bytes, "binding a program tensor");
    Bound b;
    const NrtApi& api = lib_.api();
    if (r.offset == 0 && api.nrt_tensor_get_size(r.tensor) == bytes) {
      b.tensor = r.tensor;
    } else {
      TORUS_CHECK(api.nrt_tensor_allocate_slice != nullptr, Unsupported,
                  "{}: tensor '{}' is part of an allocation, and this runtime lacks nrt_tensor_allocate_slice",
                  source_, name);
      TORUS_CHECK_NRT(api.nrt_tensor_allocate_slice(r.tensor, r.offset, bytes, name.c_str(), &b.slice));
      b.tensor = b.slice;
    }
    auto it = bound_.find(name);
    if (it != bound_.end()) release(it->second);
    bound_[name] = b;
  }

  void execute() override {
    const NrtApi& api = lib_.api();
    std::vector<std::string> missing;
    for (const ProgramTensor& t : tensors_) {
      if (bound_.count(t.name) == 0) missing.push_back(t.name);
    }
    TORUS_CHECK(missing.empty(), InvalidArgument, "{}: execute() with unbound tensors: {}", source_,
                fmt::join(missing, ", "));
    nrt_tensor_set* in = nullptr;
    nrt_tensor_set* out = nullptr;
    TORUS_CHECK_NRT(api.nrt_allocate_tensor_set(&in));
    NRT_STATUS s = api.nrt_allocate_tensor_set(&out);
    if (s != NRT_SUCCESS) {
      api.nrt_destroy_tensor_set(&in);
      throw_nrt_error(s, "nrt_allocate_tensor_set", __FILE__, __LINE__);
    }
    for (const ProgramTensor& t : tensors_) {
      if (s == NRT_SUCCESS) s = api.nrt_add_tensor_to_tensor_set(t.input ? in : out, t.name.c_str(), bound_[t.name].tensor);
    }
    auto start = std::chrono::steady_clock::now();
    if (s == NRT_SUCCESS) s = api.nrt_execute(model_, in, out);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    api.nrt_destroy_tensor_set(&in);
    api.nrt_destroy_tensor_set(&out);
    TORUS_CHECK(s == NRT_SUCCESS, Error, "{}: execution failed: {}", source_, status_name(s));
    stats_.min_ms = stats_.executions == 0 ? ms : std::min(stats_.min_ms, ms);
    stats_.max_ms = std::max(stats_.max_ms, ms);
    ++stats_.executions;
    stats_.last_ms = ms;
    stats_.total_ms += ms;
  }

  ProgramStats stats() const override { return stats_; }

 private:
  struct Bound {
    nrt_tensor* tensor = nullptr;
    nrt_tensor* slice = nullptr;  // owned when the binding is part of an allocation
  };

  void release(Bound& b) {
    if (b.slice != nullptr) lib_.api().nrt_tensor_free(&b.slice);
  }
  const ProgramTensor* find(const std::string& name) const {
    for (const ProgramTensor& t : tensors_) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  std::string names() const {
    std::vector<std::string> n;
    for (const ProgramTensor& t : tensors_) n.push_back(t.name);
    return fmt::format("{}", fmt::join(n, ", "));
  }

  const NrtLibrary& lib_;
  std::string source_;
  nrt_model* model_ = nullptr;
  std::vector<ProgramTensor> tensors_;
  std::map<std::string, Bound> bound_;
  ProgramStats stats_;
};

}  // namespace

std::unique_ptr<StageProgram> load_neff(std::span<const std::byte> bytes, int core) {
  return std::make_unique<NeffProgram>("<memory>", bytes, core);
}

std::unique_ptr<StageProgram> load_neff(const std::string& path, int core) {
  std::ifstream f(path, std::ios::binary);
  TORUS_CHECK(f.good(), Error, "NEFF program '{}' cannot be opened: {}", path, std::strerror(errno));
  std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  TORUS_CHECK(!f.bad(), Error, "NEFF program '{}': read failed", path);
  auto span = std::as_bytes(std::span<const char>(data.data(), data.size()));
  return std::make_unique<NeffProgram>(path, span, core);
}

}  // namespace torus::device::neuron
