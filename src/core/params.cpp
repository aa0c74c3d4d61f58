// The one place where Torus reads its environment (Note [One reader of the
// environment] in torus/core/params.h).
#include "torus/core/params.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/log.h"

extern char** environ;

namespace torus {

std::optional<std::string> env_lookup(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::optional<std::string> env_string(const char* name) {
  auto v = env_lookup(name);
  if (!v || v->empty()) return std::nullopt;
  return v;
}

std::optional<int64_t> env_int(const char* name) {
  auto s = env_string(name);
  if (!s) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s->c_str(), &end, 10);
  TORUS_CHECK(errno == 0 && end != nullptr && *end == '\0', InvalidArgument,
              "environment variable {}='{}' is not an integer", name, *s);
  return static_cast<int64_t>(v);
}

std::optional<bool> env_bool(const char* name) {
  auto s = env_string(name);
  if (!s) return std::nullopt;
  std::string v = *s;
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw InvalidArgument(fmt::format("environment variable {}='{}' is not a boolean (use 1/0, true/false)", name, *s));
}

LogLevel initial_log_level_from_env() noexcept {
  try {
    if (auto v = env_string("TORUS_LOG_LEVEL")) return parse_log_level(*v);
  } catch (...) {
  }
  return LogLevel::kInfo;
}

namespace {

std::optional<int> env_int32(const char* name, int64_t min_value) {
  auto v = env_int(name);
  if (!v) return std::nullopt;
  TORUS_CHECK(*v >= min_value && *v <= INT32_MAX, InvalidArgument,
              "environment variable {}={} is out of range (must be >= {})", name, *v, min_value);
  return static_cast<int>(*v);
}

std::optional<size_t> env_size(const char* name, int64_t min_value) {
  auto v = env_int(name);
  if (!v) return std::nullopt;
  TORUS_CHECK(*v >= min_value, InvalidArgument, "environment variable {}={} must be >= {}", name, *v, min_value);
  return static_cast<size_t>(*v);
}

// Every TORUS_* variable of the library, each parsed in EnvParams::from_env
// below, and those read only by the build scripts and tests.
const std::set<std::string, std::less<>>& known_variables() {
  static const std::set<std::string, std::less<>> known = {
      "TORUS_LOG_LEVEL", "TORUS_TIMEOUT_MS", "TORUS_DEBUG_COLLECTIVES", "TORUS_BACKEND",
      // bootstrap
      "TORUS_RANK", "TORUS_WORLD_SIZE", "TORUS_LOCAL_RANK", "TORUS_LOCAL_SIZE", "TORUS_MASTER_ADDR",
      "TORUS_MASTER_PORT", "TORUS_SOCKET_IFNAME", "TORUS_JOB_TOKEN", "TORUS_STORE_TIMEOUT_MS", "TORUS_RUNTIME_DIR",
      // ofi backend (docs/ofi.md)
      "TORUS_OFI_PROVIDER", "TORUS_OFI_HOST_SHM", "TORUS_OFI_SHM_CHUNK_BYTES", "TORUS_OFI_SHM_STAGE_BYTES",
      "TORUS_OFI_SHM_DEPTH", "TORUS_OFI_SHM_EAGER_BYTES", "TORUS_OFI_SHM_NT_BYTES", "TORUS_OFI_SHM_ZERO_COPY_BYTES",
      "TORUS_OFI_INLINE_SPIN_US", "TORUS_OFI_INLINE_MAX_BYTES", "TORUS_OFI_OVERSUBSCRIBED", "TORUS_OFI_RD_MAX_BYTES",
      "TORUS_OFI_TREE_MAX_BYTES", "TORUS_OFI_CHUNK_BYTES", "TORUS_OFI_WINDOW", "TORUS_OFI_REGISTER_LOCAL",
      "TORUS_OFI_HMEM",
      // shared host memory (docs/comm.md)
      "TORUS_SHARED_HOST_ALLOC", "TORUS_SHARED_HOST_ALLOC_MIN_BYTES", "TORUS_SHARED_HOST_SLAB_BYTES",
      "TORUS_SHARED_HOST_CACHE_BYTES", "TORUS_SHARED_HOST_FORK",
      // MFU (docs/train.md)
      "TORUS_PEAK_CACHE",
      // optimizers (docs/optim.md)
      "TORUS_CPU_ADAM_ISA",
      // Neuron runtime (docs/neuron.md)
      "TORUS_NEURON_LIBRARY",
      // Read by the build scripts and tests, never by the library (docs/testing.md).
      "TORUS_BUILD_DIR", "TORUS_JOBS", "TORUS_NP", "TORUS_GPU_JOBS", "TORUS_SKIP_APT", "TORUS_NO_CUDA",
      "TORUS_CTEST_ARGS", "TORUS_REQUIRE_GPU", "TORUS_BOOTSTRAP_TOKEN_RANK",
      // Read by the torus-launch wrapper and its tests (docs/launch.md), never by the library.
      "TORUS_LAUNCH_PYTHON", "TORUS_LAUNCH_DIR"};
  return known;
}

constexpr std::string_view kTestPrefix = "TORUS_TEST_";  // reserved for the tests' own variables

SharedHostAllocPolicy parse_shared_host_alloc(const std::string& v) {
  if (v == "auto") return SharedHostAllocPolicy::kAuto;
  if (v == "on" || v == "1") return SharedHostAllocPolicy::kOn;
  if (v == "off" || v == "0") return SharedHostAllocPolicy::kOff;
  throw InvalidArgument(fmt::format("TORUS_SHARED_HOST_ALLOC='{}' must be auto, on or off", v));
}

EnvParams::Ofi ofi_from_env() {
  EnvParams::Ofi o;
  if (auto v = env_string("TORUS_OFI_PROVIDER")) {
    o.provider = *v;
  } else if (auto f = env_string("FI_PROVIDER")) {
    o.provider = *f;  // libfabric's own variable, so that FI_PROVIDER=tcp alone also steers Torus
  }
  o.host_shm = env_bool("TORUS_OFI_HOST_SHM");
  o.shm_chunk_bytes = env_size("TORUS_OFI_SHM_CHUNK_BYTES", 64);
  o.shm_stage_bytes = env_size("TORUS_OFI_SHM_STAGE_BYTES", 4096);
  o.shm_depth = env_int32("TORUS_OFI_SHM_DEPTH", 2);
  o.shm_eager_bytes = env_size("TORUS_OFI_SHM_EAGER_BYTES", 0);
  o.shm_nt_bytes = env_size("TORUS_OFI_SHM_NT_BYTES", 0);
  o.shm_zero_copy_bytes = env_size("TORUS_OFI_SHM_ZERO_COPY_BYTES", 0);
  o.inline_spin_us = env_size("TORUS_OFI_INLINE_SPIN_US", 0);
  o.inline_max_bytes = env_size("TORUS_OFI_INLINE_MAX_BYTES", 0);
  o.oversubscribed = env_bool("TORUS_OFI_OVERSUBSCRIBED");
  o.rd_max_bytes = env_size("TORUS_OFI_RD_MAX_BYTES", 0);
  o.tree_max_bytes = env_size("TORUS_OFI_TREE_MAX_BYTES", 0);
  o.chunk_bytes = env_size("TORUS_OFI_CHUNK_BYTES", 64);
  o.window = env_int32("TORUS_OFI_WINDOW", 1);
  o.register_local = env_bool("TORUS_OFI_REGISTER_LOCAL");
  if (auto v = env_string("TORUS_OFI_HMEM")) {
    TORUS_CHECK(*v == "auto" || *v == "off" || *v == "as-host", InvalidArgument,
                "TORUS_OFI_HMEM='{}' must be auto, off or as-host", *v);
    o.hmem = *v;
  }
  return o;
}

EnvParams::SharedHost shared_host_from_env() {
  EnvParams::SharedHost s;
  if (auto v = env_string("TORUS_SHARED_HOST_ALLOC")) s.alloc = parse_shared_host_alloc(*v);
  s.alloc_min_bytes = env_size("TORUS_SHARED_HOST_ALLOC_MIN_BYTES", 1);
  s.slab_bytes = env_size("TORUS_SHARED_HOST_SLAB_BYTES", int64_t{2} << 20);  // the pool's slab alignment
  s.cache_bytes = env_size("TORUS_SHARED_HOST_CACHE_BYTES", 0);
  if (auto v = env_string("TORUS_SHARED_HOST_FORK")) {
    TORUS_CHECK(*v == "view" || *v == "copy", InvalidArgument, "TORUS_SHARED_HOST_FORK='{}' must be view or copy",
                *v);
    s.fork_copy = *v == "copy";
  }
  return s;
}

}  // namespace

bool is_known_env_variable(const std::string& name) {
  return known_variables().count(name) != 0 || (name.size() > kTestPrefix.size() && name.rfind(kTestPrefix, 0) == 0);
}

EnvParams EnvParams::from_env() {
  EnvParams p;
  if (auto v = env_string("TORUS_LOG_LEVEL")) {
    try {
      p.log_level = parse_log_level(*v);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("TORUS_LOG_LEVEL: {}", e.what()));
    }
  }
  if (auto v = env_int("TORUS_TIMEOUT_MS")) {
    TORUS_CHECK(*v > 0, InvalidArgument, "TORUS_TIMEOUT_MS={} must be > 0", *v);
    p.timeout = std::chrono::milliseconds(*v);
  }
  if (auto v = env_bool("TORUS_DEBUG_COLLECTIVES")) p.debug_collectives = *v;
  if (auto v = env_string("TORUS_BACKEND")) {
    TORUS_CHECK(*v == "mpi" || *v == "ofi", InvalidArgument, "TORUS_BACKEND='{}' must be 'mpi' or 'ofi'", *v);
    p.host_backend = *v;
  }
  p.rank = env_int32("TORUS_RANK", 0);
  p.world_size = env_int32("TORUS_WORLD_SIZE", 1);
  p.local_rank = env_int32("TORUS_LOCAL_RANK", 0);
  p.local_size = env_int32("TORUS_LOCAL_SIZE", 1);
  if (auto v = env_string("TORUS_MASTER_ADDR")) p.master_addr = *v;
  p.master_port = env_int32("TORUS_MASTER_PORT", 0);
  if (p.master_port) {
    TORUS_CHECK(*p.master_port <= 65535, InvalidArgument, "TORUS_MASTER_PORT={} is not a port", *p.master_port);
  }
  if (auto v = env_string("TORUS_SOCKET_IFNAME")) p.socket_ifname = *v;
  if (auto v = env_string("TORUS_JOB_TOKEN")) p.job_token = *v;
  if (auto v = env_int("TORUS_STORE_TIMEOUT_MS")) {
    TORUS_CHECK(*v > 0, InvalidArgument, "TORUS_STORE_TIMEOUT_MS={} must be > 0", *v);
    p.store_timeout = std::chrono::milliseconds(*v);
  }
  if (auto v = env_string("TORUS_RUNTIME_DIR")) {
    TORUS_CHECK(v->front() == '/', InvalidArgument, "TORUS_RUNTIME_DIR='{}' must be an absolute path", *v);
    p.runtime_dir = *v;
  } else if (auto x = env_string("XDG_RUNTIME_DIR"); x && x->front() == '/') {
    p.runtime_dir = *x;  // the XDG spec: a relative value is ignored
  } else if (auto t = env_string("TMPDIR"); t && t->front() == '/') {
    p.runtime_dir = *t;
  }
  p.ofi = ofi_from_env();
  p.shared_host = shared_host_from_env();
  if (auto v = env_string("TORUS_PEAK_CACHE")) {
    TORUS_CHECK(*v == "off" || v->front() == '/', InvalidArgument,
                "TORUS_PEAK_CACHE='{}' must be an absolute path or off", *v);
    if (*v != "off") p.peak_cache = *v;
  } else if (auto x = env_string("XDG_CACHE_HOME"); x && x->front() == '/') {
    p.peak_cache = *x + "/torus/peak_flops.json";  // the XDG spec: a relative value is ignored
  } else if (auto h = env_string("HOME"); h && h->front() == '/') {
    p.peak_cache = *h + "/.cache/torus/peak_flops.json";
  }
  if (auto v = env_string("TORUS_CPU_ADAM_ISA")) {
    TORUS_CHECK(*v == "auto" || *v == "scalar" || *v == "avx2" || *v == "avx512", InvalidArgument,
                "TORUS_CPU_ADAM_ISA='{}' must be auto, scalar, avx2 or avx512", *v);
    p.cpu_adam_isa = *v;
  }
  if (auto v = env_string("TORUS_NEURON_LIBRARY")) p.neuron_library = *v;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "TORUS_", 6) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (!is_known_env_variable(name)) p.unknown.push_back(name);
  }
  return p;
}

std::vector<std::pair<std::string, std::string>> EnvParams::describe() const {
  auto opt = [](const auto& v) { return v ? fmt::format("{}", *v) : std::string("(default)"); };
  auto unset = [](const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("(unset)"); };
  auto str = [](const std::string& s) { return s.empty() ? std::string("(unset)") : s; };
  auto flag = [](const std::optional<bool>& v) { return v ? std::string(*v ? "1" : "0") : std::string("(default)"); };
  const char* alloc = shared_host.alloc == SharedHostAllocPolicy::kOn    ? "on"
                      : shared_host.alloc == SharedHostAllocPolicy::kOff ? "off"
                                                                          : "auto";
  return {
      {"TORUS_LOG_LEVEL", std::string(log_level_name(log_level))},
      {"TORUS_TIMEOUT_MS", std::to_string(timeout.count())},
      {"TORUS_DEBUG_COLLECTIVES", debug_collectives ? "1" : "0"},
      {"TORUS_BACKEND", str(host_backend)},
      {"TORUS_RANK", unset(rank)},
      {"TORUS_WORLD_SIZE", unset(world_size)},
      {"TORUS_LOCAL_RANK", unset(local_rank)},
      {"TORUS_LOCAL_SIZE", unset(local_size)},
      {"TORUS_MASTER_ADDR", str(master_addr)},
      {"TORUS_MASTER_PORT", unset(master_port)},
      {"TORUS_SOCKET_IFNAME", str(socket_ifname)},
      {"TORUS_JOB_TOKEN", job_token.empty() ? "(unset)" : "(set, redacted)"},
      {"TORUS_STORE_TIMEOUT_MS", std::to_string(store_timeout.count())},
      {"TORUS_RUNTIME_DIR", runtime_dir},
      {"TORUS_OFI_PROVIDER", str(ofi.provider)},
      {"TORUS_OFI_HOST_SHM", flag(ofi.host_shm)},
      {"TORUS_OFI_SHM_CHUNK_BYTES", opt(ofi.shm_chunk_bytes)},
      {"TORUS_OFI_SHM_STAGE_BYTES", opt(ofi.shm_stage_bytes)},
      {"TORUS_OFI_SHM_DEPTH", opt(ofi.shm_depth)},
      {"TORUS_OFI_SHM_EAGER_BYTES", opt(ofi.shm_eager_bytes)},
      {"TORUS_OFI_SHM_NT_BYTES", opt(ofi.shm_nt_bytes)},
      {"TORUS_OFI_SHM_ZERO_COPY_BYTES", opt(ofi.shm_zero_copy_bytes)},
      {"TORUS_OFI_INLINE_SPIN_US", opt(ofi.inline_spin_us)},
      {"TORUS_OFI_INLINE_MAX_BYTES", opt(ofi.inline_max_bytes)},
      {"TORUS_OFI_OVERSUBSCRIBED", flag(ofi.oversubscribed)},
      {"TORUS_OFI_RD_MAX_BYTES", opt(ofi.rd_max_bytes)},
      {"TORUS_OFI_TREE_MAX_BYTES", opt(ofi.tree_max_bytes)},
      {"TORUS_OFI_CHUNK_BYTES", opt(ofi.chunk_bytes)},
      {"TORUS_OFI_WINDOW", opt(ofi.window)},
      {"TORUS_OFI_REGISTER_LOCAL", flag(ofi.register_local)},
      {"TORUS_OFI_HMEM", ofi.hmem.empty() ? "auto" : ofi.hmem},
      {"TORUS_SHARED_HOST_ALLOC", alloc},
      {"TORUS_SHARED_HOST_ALLOC_MIN_BYTES", opt(shared_host.alloc_min_bytes)},
      {"TORUS_SHARED_HOST_SLAB_BYTES", opt(shared_host.slab_bytes)},
      {"TORUS_SHARED_HOST_CACHE_BYTES", opt(shared_host.cache_bytes)},
      {"TORUS_SHARED_HOST_FORK", shared_host.fork_copy ? "copy" : "view"},
      {"TORUS_PEAK_CACHE", peak_cache.empty() ? "off" : peak_cache},
      {"TORUS_CPU_ADAM_ISA", cpu_adam_isa.empty() ? "auto" : cpu_adam_isa},
      {"TORUS_NEURON_LIBRARY", neuron_library.empty() ? "libnrt.so.1" : neuron_library},
  };
}

const EnvParams& env_params() {
  static const EnvParams params = EnvParams::from_env();
  return params;
}

}  // namespace torus
