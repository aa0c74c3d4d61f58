// The one place where Torus reads its environment variables.
#include "torus/core/params.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "core/log.h"

extern char** environ;

namespace torus {

std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
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

namespace {

std::optional<int> env_int32(const char* name, int64_t min_value) {
  auto v = env_int(name);
  if (!v) return std::nullopt;
  TORUS_CHECK(*v >= min_value && *v <= INT32_MAX, InvalidArgument,
              "environment variable {}={} is out of range (must be >= {})", name, *v, min_value);
  return static_cast<int>(*v);
}

// Every TORUS_* variable Torus knows; anything else with the prefix is a typo.
const std::set<std::string>& known_variables() {
  static const std::set<std::string> known = {
      "TORUS_LOG_LEVEL",     "TORUS_TIMEOUT_MS",   "TORUS_DEBUG_COLLECTIVES", "TORUS_BACKEND",
      "TORUS_RANK",          "TORUS_WORLD_SIZE",   "TORUS_LOCAL_RANK",        "TORUS_LOCAL_SIZE",
      "TORUS_MASTER_ADDR",   "TORUS_MASTER_PORT",  "TORUS_SOCKET_IFNAME",     "TORUS_JOB_TOKEN",
      "TORUS_STORE_TIMEOUT_MS", "TORUS_RUNTIME_DIR", "TORUS_OFI_PROVIDER",
      // ofi backend tuning, read by src/comm/ofi/ofi_options.cpp (docs/ofi.md).
      "TORUS_OFI_HOST_SHM", "TORUS_OFI_SHM_CHUNK_BYTES", "TORUS_OFI_SHM_STAGE_BYTES", "TORUS_OFI_SHM_DEPTH",
      "TORUS_OFI_SHM_EAGER_BYTES", "TORUS_OFI_SHM_ZERO_COPY_BYTES", "TORUS_OFI_SHM_NT_BYTES", "TORUS_OFI_RD_MAX_BYTES", "TORUS_OFI_TREE_MAX_BYTES", "TORUS_OFI_CHUNK_BYTES",
      "TORUS_OFI_WINDOW", "TORUS_OFI_REGISTER_LOCAL",
      // The shared host allocator and pool (src/comm/shared_host.cpp, docs/comm.md).
      "TORUS_SHARED_HOST_ALLOC", "TORUS_SHARED_HOST_ALLOC_MIN_BYTES", "TORUS_SHARED_HOST_SLAB_BYTES",
      "TORUS_SHARED_HOST_CACHE_BYTES", "TORUS_SHARED_HOST_FORK",
      // Read by tools and tests rather than the library.
      "TORUS_BUILD_DIR", "TORUS_TEST_SCALE"};
  return known;
}

}  // namespace

EnvParams EnvParams::from_env() {
  EnvParams p;
  if (auto v = env_string("TORUS_LOG_LEVEL")) p.log_level = parse_log_level(*v);
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
  if (auto v = env_string("TORUS_OFI_PROVIDER")) {
    p.ofi_provider = *v;
  } else if (auto f = env_string("FI_PROVIDER")) {
    p.ofi_provider = *f;
  }
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "TORUS_", 6) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (!known_variables().count(name)) p.unknown.push_back(name);
  }
  return p;
}

std::vector<std::pair<std::string, std::string>> EnvParams::describe() const {
  auto opt = [](const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("(unset)"); };
  auto str = [](const std::string& s) { return s.empty() ? std::string("(unset)") : s; };
  return {
      {"TORUS_LOG_LEVEL", std::string(log_level_name(log_level))},
      {"TORUS_TIMEOUT_MS", std::to_string(timeout.count())},
      {"TORUS_DEBUG_COLLECTIVES", debug_collectives ? "1" : "0"},
      {"TORUS_BACKEND", str(host_backend)},
      {"TORUS_RANK", opt(rank)},
      {"TORUS_WORLD_SIZE", opt(world_size)},
      {"TORUS_LOCAL_RANK", opt(local_rank)},
      {"TORUS_LOCAL_SIZE", opt(local_size)},
      {"TORUS_MASTER_ADDR", str(master_addr)},
      {"TORUS_MASTER_PORT", opt(master_port)},
      {"TORUS_SOCKET_IFNAME", str(socket_ifname)},
      {"TORUS_JOB_TOKEN", job_token.empty() ? "(unset)" : "(set, redacted)"},
      {"TORUS_STORE_TIMEOUT_MS", std::to_string(store_timeout.count())},
      {"TORUS_RUNTIME_DIR", runtime_dir},
      {"TORUS_OFI_PROVIDER", str(ofi_provider)},
  };
}

const EnvParams& env_params() {
  static const EnvParams params = EnvParams::from_env();
  return params;
}

}  // namespace torus
