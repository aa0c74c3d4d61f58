// Opening the Neuron runtime at run time: dlopen, symbol resolution, the
// version check and the one nrt_init of the process (Note [One runtime per
// process] in nrt_api.h).
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/log.h"
#include "device/neuron/nrt_api.h"
#include "torus/core/params.h"

namespace torus::device::neuron {

std::string status_name(NRT_STATUS status) {
  const char* name = "unknown status";
  switch (status) {
    case NRT_SUCCESS: name = "NRT_SUCCESS"; break;
    case NRT_FAILURE: name = "NRT_FAILURE"; break;
    case NRT_INVALID: name = "NRT_INVALID"; break;
    case NRT_INVALID_HANDLE: name = "NRT_INVALID_HANDLE"; break;
    case NRT_RESOURCE: name = "NRT_RESOURCE (out of device memory or another resource)"; break;
    case NRT_TIMEOUT: name = "NRT_TIMEOUT"; break;
    case NRT_HW_ERROR: name = "NRT_HW_ERROR"; break;
    case NRT_UNINITIALIZED: name = "NRT_UNINITIALIZED"; break;
    case NRT_CLOSED: name = "NRT_CLOSED"; break;
    default: break;
  }
  return fmt::format("{} ({})", name, status);
}

void throw_nrt_error(NRT_STATUS status, const char* call, const char* file, int line) {
  throw Error(fmt::format("Neuron runtime: {} failed: {} at {}:{}", call, status_name(status), file, line));
}

struct NrtLoader {
  std::unique_ptr<NrtLibrary> library;
  std::string reason;

  static void close_at_exit();

  template <typename Fn>
  static bool resolve(void* handle, const char* name, Fn*& slot) {
    slot = reinterpret_cast<Fn*>(dlsym(handle, name));
    return slot != nullptr;
  }

  void load() {
    const std::string& configured = env_params().neuron_library;
    std::string path = configured.empty() ? "libnrt.so.1" : configured;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      reason = fmt::format("the Neuron runtime library '{}' could not be loaded ({}){}", path, e ? e : "unknown error",
                           configured.empty() ? "; install aws-neuronx-runtime-lib or set TORUS_NEURON_LIBRARY" : "");
      return;
    }
    auto lib = std::unique_ptr<NrtLibrary>(new NrtLibrary);
    lib->handle_ = handle;
    lib->path_ = path;
    NrtApi& a = lib->api_;
    std::vector<std::string> missing;
    auto need = [&](const char* name, auto*& slot) {
      if (!resolve(handle, name, slot)) missing.emplace_back(name);
    };
    need("nrt_init", a.nrt_init);
    need("nrt_close", a.nrt_close);
    need("nrt_get_version", a.nrt_get_version);
    need("nrt_get_total_nc_count", a.nrt_get_total_nc_count);
    need("nrt_get_visible_nc_count", a.nrt_get_visible_nc_count);
    need("nrt_tensor_allocate", a.nrt_tensor_allocate);
    need("nrt_tensor_free", a.nrt_tensor_free);
    need("nrt_tensor_read", a.nrt_tensor_read);
    need("nrt_tensor_write", a.nrt_tensor_write);
    need("nrt_tensor_copy", a.nrt_tensor_copy);
    need("nrt_tensor_get_size", a.nrt_tensor_get_size);
    if (!missing.empty()) {
      reason = fmt::format("'{}' is not a usable Neuron runtime: it lacks {}", path, fmt::join(missing, ", "));
      lib->handle_ = nullptr;  // never initialised: nothing to close
      dlclose(handle);
      return;
    }
    resolve(handle, "nrt_tensor_memset", a.nrt_tensor_memset);
    resolve(handle, "nrt_tensor_allocate_slice", a.nrt_tensor_allocate_slice);
    resolve(handle, "nrt_tensor_get_va", a.nrt_tensor_get_va);
    // Programs: all of these or none.
    bool programs = resolve(handle, "nrt_load", a.nrt_load);
    programs &= resolve(handle, "nrt_unload", a.nrt_unload);
    programs &= resolve(handle, "nrt_execute", a.nrt_execute);
    programs &= resolve(handle, "nrt_allocate_tensor_set", a.nrt_allocate_tensor_set);
    programs &= resolve(handle, "nrt_destroy_tensor_set", a.nrt_destroy_tensor_set);
    programs &= resolve(handle, "nrt_add_tensor_to_tensor_set", a.nrt_add_tensor_to_tensor_set);
    programs &= resolve(handle, "nrt_get_model_tensor_info", a.nrt_get_model_tensor_info);
    programs &= resolve(handle, "nrt_free_model_tensor_info", a.nrt_free_model_tensor_info);
    if (!programs) a.nrt_load = nullptr;
    bool collectives = resolve(handle, "nrt_cc_global_comm_init", a.nrt_cc_global_comm_init);
    collectives &= resolve(handle, "nrta_cc_prepare", a.nrta_cc_prepare);
    collectives &= resolve(handle, "nrta_cc_schedule", a.nrta_cc_schedule);
    collectives &= resolve(handle, "nrta_is_completed", a.nrta_is_completed);
    if (!collectives) a.nrt_cc_global_comm_init = nullptr;

    NRT_STATUS s = a.nrt_get_version(&lib->version_, sizeof(nrt_version_t));
    if (s != NRT_SUCCESS) {
      reason = fmt::format("'{}': nrt_get_version failed: {}", path, status_name(s));
      return;
    }
    if (lib->version_.rt_major < kMinRuntimeMajor) {
      reason = fmt::format("'{}' is Neuron runtime {}; Torus needs {}.x or later", path, lib->version_string(),
                           kMinRuntimeMajor);
      return;
    }
    s = a.nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "");
    if (s != NRT_SUCCESS) {
      reason = fmt::format("Neuron runtime {} ('{}'): nrt_init failed: {} (are NeuronCores present and free? "
                           "NEURON_RT_VISIBLE_CORES selects them)",
                           lib->version_string(), path, status_name(s));
      return;
    }
    lib->initialised_ = true;
    // nrt_close at exit, before the runtime's own static state (built during
    // the calls above) is torn down, and after every Torus object holding
    // runtime memory (the caching allocator, constructed later) is gone.
    std::atexit(close_at_exit);
    uint32_t visible = 0, total = 0;
    if (a.nrt_get_visible_nc_count(&visible) == NRT_SUCCESS) lib->visible_cores_ = static_cast<int>(visible);
    if (a.nrt_get_total_nc_count(&total) == NRT_SUCCESS) lib->total_cores_ = static_cast<int>(total);
    TORUS_LOG_DEBUG("Neuron runtime {} loaded from '{}': {} of {} NeuronCores visible", lib->version_string(), path,
                    lib->visible_cores_, lib->total_cores_);
    library = std::move(lib);
  }
};

namespace {

NrtLoader& loader() {
  // Never destroyed before the objects that hold runtime memory: the caching
  // allocator (a function-local static constructed after this one, hence
  // destroyed before it) frees its tensors first.
  static NrtLoader l;
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      l.load();
    } catch (const std::exception& e) {  // env_params() may reject another variable
      l.reason = fmt::format("the Neuron runtime was not loaded: {}", e.what());
    }
  });
  return l;
}

}  // namespace

void NrtLoader::close_at_exit() {
  NrtLibrary* lib = loader().library.get();
  if (lib != nullptr && lib->initialised_) {
    lib->initialised_ = false;
    lib->api_.nrt_close();
  }
}

const NrtLibrary* NrtLibrary::get() noexcept { return loader().library.get(); }

const NrtLibrary& NrtLibrary::require(const char* what) {
  const NrtLibrary* lib = get();
  TORUS_CHECK(lib != nullptr, Error, "{} needs the Neuron runtime: {}", what, unavailable_reason());
  return *lib;
}

std::string NrtLibrary::unavailable_reason() { return loader().reason; }

std::string NrtLibrary::version_string() const {
  return fmt::format("{}.{}.{}.{}", version_.rt_major, version_.rt_minor, version_.rt_patch, version_.rt_maintenance);
}

NrtLibrary::~NrtLibrary() {
  // Closed at exit already (NrtLoader::close_at_exit). The runtime stays
  // mapped (no dlclose): its own exit handlers may still run.
  if (initialised_) api_.nrt_close();
}

}  // namespace torus::device::neuron
