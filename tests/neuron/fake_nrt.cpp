// A fake Neuron runtime: the subset of libnrt's C API that Torus calls
// (src/device/neuron/nrt_api.h), implemented on host memory, so that the
// Neuron backend's tests run on any machine. Torus opens it exactly as it
// opens the real runtime (TORUS_NEURON_LIBRARY=path/to/libtorus_fake_nrt.so).
//
// What it emulates (configured by the tests through TORUS_TEST_FAKE_NRT_*):
//   CORES=n          NeuronCores on the "host" (default 4); NEURON_RT_VISIBLE_CORES
//                    ("2", "0-1", "0,2") selects the visible ones, as the
//                    runtime does; a core outside the host fails nrt_init.
//   CORE_BYTES=n     device memory per core (default 1 GiB): allocations past
//                    it fail with NRT_RESOURCE.
//   VERSION=a.b.c    the version nrt_get_version reports (default 2.99.0).
//   FAIL_ALLOC_AFTER=n  every device allocation after the first n fails (NRT_RESOURCE).
//   READ_FAIL_BYTES=n   an nrt_tensor_read of exactly n bytes fails (NRT_HW_ERROR), on
//                    every rank or, with READ_FAIL_RANK=r, on MPI rank r only.
//   TRACE=path       appends "pid call" for every call to `path` (one per line),
//                    so tests can check which runtime calls a test exercises.
// Built a second time with TORUS_FAKE_NRT_NO_MEMSET (libtorus_fake_nrt_old.so):
// a runtime without nrt_tensor_memset, for Torus's fill fallback.
// Programs ("NEFFs") are a tiny declarative text format interpreted here —
// nothing read is executed:
//     torus-fake-neff 1
//     input  <name> <bytes>
//     output <name> <bytes>
//     op add|mul <out> <in0> <in1>     (f32 elementwise)
//     op scale <out> <in> <factor>     (f32)
//     op copy <out> <in>
//     sleep_ms <n>                     (execution time, for timing tests)
// Collectives (fake_nrt_cc.cpp) run over MPI between the test's ranks.
#include "fake_nrt.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>
#include <vector>

namespace fake {

// The fake's state is never destroyed: Torus closes the runtime from an exit
// handler, which may run after this library's static destructors would.
Config& config() {
  static Config& c = *new Config([] {
    Config c;
    auto num = [](const char* name, long long def) {
      const char* v = std::getenv(name);
      return (v != nullptr && *v != '\0') ? std::atoll(v) : def;
    };
    c.cores = static_cast<int>(num("TORUS_TEST_FAKE_NRT_CORES", 4));
    c.core_bytes = static_cast<size_t>(num("TORUS_TEST_FAKE_NRT_CORE_BYTES", 1ll << 30));
    c.fail_alloc_after = num("TORUS_TEST_FAKE_NRT_FAIL_ALLOC_AFTER", -1);
    c.read_fail_bytes = num("TORUS_TEST_FAKE_NRT_READ_FAIL_BYTES", -1);
    const long long fail_rank = num("TORUS_TEST_FAKE_NRT_READ_FAIL_RANK", -1);
    if (fail_rank >= 0 && fail_rank != num("OMPI_COMM_WORLD_RANK", 0)) c.read_fail_bytes = -1;
    if (const char* v = std::getenv("TORUS_TEST_FAKE_NRT_VERSION")) {
      std::sscanf(v, "%llu.%llu.%llu", &c.major, &c.minor, &c.patch);
    }
    if (const char* v = std::getenv("TORUS_TEST_FAKE_NRT_TRACE")) c.trace = v;
    return c;
  }());
  return c;
}

void trace(const char* call) {
  const Config& c = config();
  if (c.trace.empty()) return;
  static std::mutex& mu = *new std::mutex;
  std::lock_guard<std::mutex> lock(mu);
  if (FILE* f = std::fopen(c.trace.c_str(), "a")) {
    std::fprintf(f, "%d %s\n", static_cast<int>(getpid()), call);
    std::fclose(f);
  }
}

State& state() {
  static State& s = *new State;
  return s;
}

}  // namespace fake

using fake::config;
using fake::state;
using fake::trace;

struct nrt_tensor {
  std::vector<unsigned char> owned;  // empty for a slice
  nrt_tensor* parent = nullptr;      // a slice's source
  size_t offset = 0;                 // within the parent
  size_t size = 0;
  int core = 0;
  bool device = true;
  unsigned char* data() { return parent != nullptr ? parent->data() + offset : owned.data(); }
};

struct nrt_tensor_set {
  std::map<std::string, nrt_tensor*> tensors;
};

struct FakeOp {
  std::string kind, out, in0, in1;
  float factor = 1;
};

struct nrt_model {
  std::vector<std::pair<std::string, size_t>> inputs, outputs;
  std::vector<FakeOp> ops;
  int sleep_ms = 0;
  int start_nc = 0;
};

namespace {

bool initialised() { return state().initialised; }

bool parse_cores(const char* spec, int total, std::vector<int>& out) {
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    int a = 0, b = 0;
    if (std::sscanf(part.c_str(), "%d-%d", &a, &b) == 2) {
    } else if (std::sscanf(part.c_str(), "%d", &a) == 1) {
      b = a;
    } else {
      return false;
    }
    if (a < 0 || b < a || b >= total) return false;
    for (int i = a; i <= b; ++i) out.push_back(i);
  }
  return !out.empty();
}

bool in_bounds(const nrt_tensor* t, size_t offset, size_t size) {
  return t != nullptr && offset <= t->size && size <= t->size - offset;
}

// Calls that moved bytes between host and device memory (read, write), for
// the tests (torus_fake_nrt_host_transfers; not a runtime call).
std::atomic<unsigned long long> g_host_transfers{0};

}  // namespace

extern "C" {

unsigned long long torus_fake_nrt_host_transfers() { return g_host_transfers.load(); }

NRT_STATUS nrt_get_version(nrt_version_t* v, size_t size) {
  trace("nrt_get_version");
  if (v == nullptr || size < sizeof(nrt_version_t)) return NRT_INVALID;
  std::memset(v, 0, sizeof(*v));
  v->rt_major = config().major;
  v->rt_minor = config().minor;
  v->rt_patch = config().patch;
  std::snprintf(v->rt_detail, sizeof(v->rt_detail), "torus fake runtime");
  std::snprintf(v->git_hash, sizeof(v->git_hash), "fake");
  return NRT_SUCCESS;
}

NRT_STATUS nrt_init(int framework, const char*, const char*) {
  trace("nrt_init");
  fake::State& s = state();
  if (s.initialised) return NRT_FAILURE;  // the real runtime refuses a second init
  s.visible.clear();
  const char* spec = std::getenv("NEURON_RT_VISIBLE_CORES");
  if (spec != nullptr && *spec != '\0') {
    if (!parse_cores(spec, config().cores, s.visible)) return NRT_INVALID;
  } else {
    for (int i = 0; i < config().cores; ++i) s.visible.push_back(i);
  }
  s.used.assign(s.visible.size(), 0);
  s.initialised = true;
  (void)framework;
  return NRT_SUCCESS;
}

void nrt_close() {
  trace("nrt_close");
  fake::shutdown_collectives();
  fake::State& s = state();
  s.initialised = false;
  s.closed = true;
  if (s.live_tensors != 0) {
    // The real runtime leaks them; the fake says so, for the shutdown test.
    std::fprintf(stderr, "fake nrt: nrt_close with %lld live tensor(s)\n", static_cast<long long>(s.live_tensors));
  }
}

NRT_STATUS nrt_get_total_nc_count(uint32_t* count) {
  trace("nrt_get_total_nc_count");
  if (count == nullptr) return NRT_INVALID;
  *count = static_cast<uint32_t>(config().cores);
  return NRT_SUCCESS;
}

NRT_STATUS nrt_get_visible_nc_count(uint32_t* count) {
  trace("nrt_get_visible_nc_count");
  if (!initialised()) return NRT_UNINITIALIZED;
  if (count == nullptr) return NRT_INVALID;
  *count = static_cast<uint32_t>(state().visible.size());
  return NRT_SUCCESS;
}

NRT_STATUS nrt_tensor_allocate(int placement, int nc, size_t size, const char*, nrt_tensor** tensor) {
  trace("nrt_tensor_allocate");
  fake::State& s = state();
  if (!s.initialised) return NRT_UNINITIALIZED;
  if (tensor == nullptr || size == 0) return NRT_INVALID;
  if (nc < 0 || nc >= static_cast<int>(s.visible.size())) return NRT_INVALID;
  std::lock_guard<std::mutex> lock(s.mu);
  bool device = placement == NRT_TENSOR_PLACEMENT_DEVICE;
  if (device) {
    if (config().fail_alloc_after >= 0 && s.device_allocations >= config().fail_alloc_after) return NRT_RESOURCE;
    if (s.used[static_cast<size_t>(nc)] + size > config().core_bytes) return NRT_RESOURCE;
    ++s.device_allocations;
    s.used[static_cast<size_t>(nc)] += size;
  }
  auto* t = new nrt_tensor;
  t->owned.assign(size, 0xA5);  // not zeroed: device memory is not
  t->size = size;
  t->core = nc;
  t->device = device;
  ++s.live_tensors;
  *tensor = t;
  return NRT_SUCCESS;
}

NRT_STATUS nrt_tensor_allocate_slice(const nrt_tensor* source, size_t offset, size_t size, const char*,
                                     nrt_tensor** slice) {
  trace("nrt_tensor_allocate_slice");
  if (!initialised()) return NRT_UNINITIALIZED;
  if (slice == nullptr || !in_bounds(source, offset, size)) return NRT_INVALID;
  auto* t = new nrt_tensor;
  t->parent = const_cast<nrt_tensor*>(source);
  t->offset = offset;
  t->size = size;
  t->core = source->core;
  t->device = source->device;
  std::lock_guard<std::mutex> lock(state().mu);
  ++state().live_tensors;
  *slice = t;
  return NRT_SUCCESS;
}

void nrt_tensor_free(nrt_tensor** tensor) {
  trace("nrt_tensor_free");
  if (tensor == nullptr || *tensor == nullptr) return;
  fake::State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  nrt_tensor* t = *tensor;
  if (t->device && t->parent == nullptr && static_cast<size_t>(t->core) < s.used.size()) {
    s.used[static_cast<size_t>(t->core)] -= t->size;
  }
  --s.live_tensors;
  delete t;
  *tensor = nullptr;
}

size_t nrt_tensor_get_size(const nrt_tensor* tensor) {
  trace("nrt_tensor_get_size");
  return tensor != nullptr ? tensor->size : 0;
}

// The fake's device memory is host memory: its "device address" is the host
// address of the bytes (what a real runtime's would be to its NIC driver).
void* nrt_tensor_get_va(const nrt_tensor* tensor) {
  trace("nrt_tensor_get_va");
  if (!initialised() || tensor == nullptr) return nullptr;
  return const_cast<nrt_tensor*>(tensor)->data();
}

NRT_STATUS nrt_tensor_read(const nrt_tensor* tensor, void* buf, size_t offset, size_t size) {
  trace("nrt_tensor_read");
  g_host_transfers.fetch_add(1);
  if (!initialised()) return NRT_UNINITIALIZED;
  if (static_cast<long long>(size) == config().read_fail_bytes) return torus::device::neuron::NRT_HW_ERROR;
  if (!in_bounds(tensor, offset, size) || (buf == nullptr && size != 0)) return NRT_INVALID;
  std::memcpy(buf, const_cast<nrt_tensor*>(tensor)->data() + offset, size);
  return NRT_SUCCESS;
}

NRT_STATUS nrt_tensor_write(nrt_tensor* tensor, const void* buf, size_t offset, size_t size) {
  trace("nrt_tensor_write");
  g_host_transfers.fetch_add(1);
  if (!initialised()) return NRT_UNINITIALIZED;
  if (!in_bounds(tensor, offset, size) || (buf == nullptr && size != 0)) return NRT_INVALID;
  std::memcpy(tensor->data() + offset, buf, size);
  return NRT_SUCCESS;
}

NRT_STATUS nrt_tensor_copy(const nrt_tensor* src, size_t src_offset, nrt_tensor* dst, size_t dst_offset,
                           size_t size) {
  trace("nrt_tensor_copy");
  if (!initialised()) return NRT_UNINITIALIZED;
  if (!in_bounds(src, src_offset, size) || !in_bounds(dst, dst_offset, size)) return NRT_INVALID;
  std::memmove(dst->data() + dst_offset, const_cast<nrt_tensor*>(src)->data() + src_offset, size);
  return NRT_SUCCESS;
}

#ifndef TORUS_FAKE_NRT_NO_MEMSET
NRT_STATUS nrt_tensor_memset(nrt_tensor* tensor, uint64_t offset, int value, size_t size) {
  trace("nrt_tensor_memset");
  if (!initialised()) return NRT_UNINITIALIZED;
  if (!in_bounds(tensor, offset, size)) return NRT_INVALID;
  std::memset(tensor->data() + offset, value, size);
  return NRT_SUCCESS;
}
#endif

// --- programs --------------------------------------------------------------------

NRT_STATUS nrt_load(const void* neff, size_t size, int32_t start_nc, int32_t nc_count, nrt_model** model) {
  trace("nrt_load");
  if (!initialised()) return NRT_UNINITIALIZED;
  if (neff == nullptr || model == nullptr) return NRT_INVALID;
  if (start_nc < 0 || nc_count < 1 || start_nc + nc_count > static_cast<int>(state().visible.size())) {
    return NRT_INVALID;
  }
  std::stringstream in(std::string(static_cast<const char*>(neff), size));
  std::string line;
  if (!std::getline(in, line) || line != "torus-fake-neff 1") return NRT_INVALID;  // not a (fake) NEFF
  auto m = std::make_unique<nrt_model>();
  m->start_nc = start_nc;
  while (std::getline(in, line)) {
    std::stringstream ls(line);
    std::string word;
    if (!(ls >> word) || word[0] == '#') continue;
    if (word == "input" || word == "output") {
      std::string name;
      size_t bytes = 0;
      if (!(ls >> name >> bytes)) return NRT_INVALID;
      (word == "input" ? m->inputs : m->outputs).emplace_back(name, bytes);
    } else if (word == "op") {
      FakeOp op;
      if (!(ls >> op.kind >> op.out >> op.in0)) return NRT_INVALID;
      if (op.kind == "add" || op.kind == "mul") {
        if (!(ls >> op.in1)) return NRT_INVALID;
      } else if (op.kind == "scale") {
        if (!(ls >> op.factor)) return NRT_INVALID;
      } else if (op.kind != "copy") {
        return NRT_INVALID;
      }
      m->ops.push_back(op);
    } else if (word == "sleep_ms") {
      if (!(ls >> m->sleep_ms)) return NRT_INVALID;
    } else {
      return NRT_INVALID;
    }
  }
  *model = m.release();
  return NRT_SUCCESS;
}

NRT_STATUS nrt_unload(nrt_model* model) {
  trace("nrt_unload");
  delete model;
  return NRT_SUCCESS;
}

NRT_STATUS nrt_allocate_tensor_set(nrt_tensor_set** set) {
  trace("nrt_allocate_tensor_set");
  if (set == nullptr) return NRT_INVALID;
  *set = new nrt_tensor_set;
  return NRT_SUCCESS;
}

void nrt_destroy_tensor_set(nrt_tensor_set** set) {
  trace("nrt_destroy_tensor_set");
  if (set == nullptr) return;
  delete *set;
  *set = nullptr;
}

NRT_STATUS nrt_add_tensor_to_tensor_set(nrt_tensor_set* set, const char* name, nrt_tensor* tensor) {
  trace("nrt_add_tensor_to_tensor_set");
  if (set == nullptr || name == nullptr || tensor == nullptr) return NRT_INVALID;
  set->tensors[name] = tensor;
  return NRT_SUCCESS;
}

NRT_STATUS nrt_get_model_tensor_info(nrt_model* model, nrt_tensor_info_array_t** info) {
  trace("nrt_get_model_tensor_info");
  if (model == nullptr || info == nullptr) return NRT_INVALID;
  size_t n = model->inputs.size() + model->outputs.size();
  size_t bytes = sizeof(nrt_tensor_info_array_t) + n * sizeof(nrt_tensor_info_t);
  auto* a = static_cast<nrt_tensor_info_array_t*>(std::calloc(1, bytes));
  a->tensor_count = n;
  size_t i = 0;
  for (int usage = 0; usage < 2; ++usage) {
    for (const auto& [name, size] : usage == 0 ? model->inputs : model->outputs) {
      nrt_tensor_info_t& t = a->tensor_array[i++];
      std::snprintf(t.name, sizeof(t.name), "%s", name.c_str());
      t.usage = usage == 0 ? NRT_TENSOR_USAGE_INPUT : NRT_TENSOR_USAGE_OUTPUT;
      t.size = size;
      t.dtype = 0;
      t.shape = nullptr;
      t.ndim = 0;
    }
  }
  *info = a;
  return NRT_SUCCESS;
}

NRT_STATUS nrt_free_model_tensor_info(nrt_tensor_info_array_t* info) {
  trace("nrt_free_model_tensor_info");
  std::free(info);
  return NRT_SUCCESS;
}

NRT_STATUS nrt_execute(nrt_model* model, const nrt_tensor_set* inputs, nrt_tensor_set* outputs) {
  trace("nrt_execute");
  if (!initialised()) return NRT_UNINITIALIZED;
  if (model == nullptr || inputs == nullptr || outputs == nullptr) return NRT_INVALID;
  auto find = [&](const std::string& name) -> nrt_tensor* {
    auto it = inputs->tensors.find(name);
    if (it != inputs->tensors.end()) return it->second;
    auto jt = outputs->tensors.find(name);
    return jt != outputs->tensors.end() ? jt->second : nullptr;
  };
  for (const auto& [name, size] : model->inputs) {
    auto it = inputs->tensors.find(name);
    if (it == inputs->tensors.end() || it->second->size != size) return NRT_INVALID;
  }
  for (const auto& [name, size] : model->outputs) {
    auto it = outputs->tensors.find(name);
    if (it == outputs->tensors.end() || it->second->size != size) return NRT_INVALID;
  }
  if (model->sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(model->sleep_ms));
  for (const FakeOp& op : model->ops) {
    nrt_tensor* out = find(op.out);
    nrt_tensor* a = find(op.in0);
    nrt_tensor* b = op.in1.empty() ? nullptr : find(op.in1);
    if (out == nullptr || a == nullptr || (!op.in1.empty() && b == nullptr)) return NRT_INVALID;
    size_t n = std::min(out->size, a->size) / sizeof(float);
    auto* o = reinterpret_cast<float*>(out->data());
    auto* x = reinterpret_cast<const float*>(a->data());
    auto* y = b != nullptr ? reinterpret_cast<const float*>(b->data()) : nullptr;
    for (size_t i = 0; i < n; ++i) {
      if (op.kind == "add") o[i] = x[i] + y[i];
      else if (op.kind == "mul") o[i] = x[i] * y[i];
      else if (op.kind == "scale") o[i] = x[i] * op.factor;
      else o[i] = x[i];
    }
  }
  return NRT_SUCCESS;
}

}  // extern "C"

namespace fake {
unsigned char* tensor_data(nrt_tensor* t) { return t->data(); }
size_t tensor_size(const nrt_tensor* t) { return t->size; }
}  // namespace fake
