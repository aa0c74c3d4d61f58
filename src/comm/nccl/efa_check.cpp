// The EFA start-up check (efa_check.h). Which variables are obsolete or
// harmful follows docs/efa.md; keep the two in step.
#include "comm/nccl/efa_check.h"

#include <link.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <system_error>

#include "core/log.h"
#include "torus/core/params.h"

namespace torus::comm::nccl {
namespace {

namespace fs = std::filesystem;

std::string base_name(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

struct VariableRule {
  const char* name;
  const char* advice;  // nullptr: relevant, nothing to say
};

// The variables worth logging, with advice for those that are obsolete or
// harmful with libfabric >= 1.18 and aws-ofi-nccl >= 1.7 (docs/efa.md).
constexpr VariableRule kRules[] = {
    {"NCCL_NET", nullptr},
    {"NCCL_NET_PLUGIN", nullptr},
    {"NCCL_TUNER_PLUGIN", nullptr},
    {"NCCL_SOCKET_IFNAME", nullptr},
    {"FI_PROVIDER", "FI_PROVIDER: the plugin selects the efa provider itself (needed only with aws-ofi-nccl <= 1.5)"},
    {"FI_EFA_USE_DEVICE_RDMA",
     "FI_EFA_USE_DEVICE_RDMA: not needed with libfabric >= 1.18 and aws-ofi-nccl >= 1.7 (harmless on p4d/p5)"},
    {"FI_EFA_FORK_SAFE", "FI_EFA_FORK_SAFE: not needed; the plugin sets it when the kernel needs it"},
    {"FI_EFA_ENABLE_SHM_TRANSFER", "FI_EFA_ENABLE_SHM_TRANSFER: not needed; the plugin configures shared memory"},
    {"FI_EFA_USE_HUGE_PAGE", nullptr},
    {"NCCL_PROTO",
     "NCCL_PROTO: forcing a protocol (the old 'simple' advice for aws-ofi-nccl <= 1.5) costs small-message latency; "
     "current plugins choose themselves"},
    {"NCCL_MIN_NCHANNELS", "NCCL_MIN_NCHANNELS: leave unset; more channels split messages too finely for EFA"},
    {"NCCL_BUFFSIZE", "NCCL_BUFFSIZE: leave unset unless measured"},
    {"NCCL_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS: applies to the socket transport only, not to EFA"},
    {"NCCL_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD: applies to the socket transport only, not to EFA"},
    {"RDMAV_FORK_SAFE", "RDMAV_FORK_SAFE: do not set; on recent kernels it can break the EFA provider"},
};

}  // namespace

std::vector<std::string> loaded_libraries() {
  std::vector<std::string> out;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &out);
  return out;
}

EfaReport probe_efa(const EfaProbeInputs& in) {
  EfaReport r;
  std::error_code ec;
  if (fs::is_directory(in.sysfs_root, ec)) {
    for (const auto& entry : fs::directory_iterator(in.sysfs_root, ec)) {
      std::string name = entry.path().filename().string();
      fs::path driver = entry.path() / "device" / "driver";
      std::error_code lec;
      fs::path target = fs::read_symlink(driver, lec);
      if (!lec && target.filename() == "efa") r.efa_devices.push_back(name);
    }
    std::sort(r.efa_devices.begin(), r.efa_devices.end());
  }
  for (const std::string& lib : in.loaded_libraries) {
    std::string base = base_name(lib);
    if (r.net_plugin.empty() && base.rfind("libnccl-net", 0) == 0) r.net_plugin = lib;
    if (r.libfabric.empty() && base.rfind("libfabric.so", 0) == 0) r.libfabric = lib;
  }
  if (in.lookup_env) {
    for (const VariableRule& rule : kRules) {
      std::optional<std::string> v = in.lookup_env(rule.name);
      if (!v) continue;
      r.settings.push_back(std::string(rule.name) + "=" + *v);
      if (rule.advice != nullptr) r.advice.emplace_back(rule.advice);
    }
  }
  return r;
}

EfaVerdict judge_efa(const EfaReport& r) {
  EfaVerdict v;
  std::string settings = r.settings.empty() ? "none" : fmt::format("{}", fmt::join(r.settings, " "));
  if (r.efa_devices.empty()) {
    v.level = LogLevel::kInfo;
    v.message = fmt::format("EFA check: no EFA device on this host; NCCL uses NVLink/PCIe inside the host and its "
                            "own transports across hosts (net plugin: {}; settings: {})",
                            r.net_plugin.empty() ? "none" : r.net_plugin, settings);
  } else if (r.net_plugin.empty() || r.libfabric.empty()) {
    v.level = LogLevel::kWarn;
    v.message = fmt::format(
        "EFA check: {} EFA device(s) ({}) but NCCL has {} loaded: traffic between hosts falls back to TCP sockets. "
        "Put the aws-ofi-nccl plugin directory (libnccl-net-ofi.so, e.g. /opt/amazon/ofi-nccl/lib) on "
        "LD_LIBRARY_PATH, or set NCCL_NET_PLUGIN; NCCL_NET=\"AWS Libfabric\" makes a missing plugin fatal "
        "(see docs/efa.md; settings: {})",
        r.efa_devices.size(), fmt::join(r.efa_devices, ", "),
        r.net_plugin.empty() ? "no network plugin" : "its network plugin but not libfabric", settings);
  } else {
    v.level = LogLevel::kInfo;
    v.message = fmt::format("EFA check: in use — {} EFA device(s) ({}), NCCL net plugin {}, libfabric {} "
                            "(settings: {})",
                            r.efa_devices.size(), fmt::join(r.efa_devices, ", "), r.net_plugin, r.libfabric,
                            settings);
  }
  if (!r.advice.empty()) {
    v.message += fmt::format("; obsolete or harmful settings: {}", fmt::join(r.advice, "; "));
  }
  return v;
}

void log_efa_check() {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  EfaProbeInputs in;
  in.loaded_libraries = loaded_libraries();
  // NCCL's and libfabric's own settings, reported as set (empty values
  // included: RDMAV_FORK_SAFE counts when merely set), so they go through
  // env_lookup rather than being parsed into EnvParams.
  in.lookup_env = env_lookup;
  EfaVerdict v = judge_efa(probe_efa(in));
  TORUS_LOG_AT(v.level, "{}", v.message);
}

}  // namespace torus::comm::nccl
