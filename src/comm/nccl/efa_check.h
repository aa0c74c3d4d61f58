// Private: the start-up check that NCCL reaches EFA (docs/efa.md).
//
// NCCL talks to EFA only through its libfabric network plugin (aws-ofi-nccl,
// libnccl-net-ofi.so or libnccl-net.so). Without the plugin NCCL silently
// falls back to TCP sockets, which is an order of magnitude slower across
// nodes. After the first communicator is up (NCCL loads its network plugin
// during communicator initialisation) the nccl backend logs one line saying
// whether EFA is in use, from three facts:
//   * EFA devices on this host: entries of /sys/class/infiniband whose driver
//     is "efa";
//   * the NCCL net plugin and libfabric loaded into this process;
//   * the environment variables that matter, flagging those that are
//     obsolete with current plugin/libfabric versions or known to hurt.
// Free of CUDA and NCCL; the inputs are injectable for tests.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "torus/core/logging.h"

namespace torus::comm::nccl {

struct EfaProbeInputs {
  std::string sysfs_root = "/sys/class/infiniband";
  std::vector<std::string> loaded_libraries;  // paths of the shared objects in this process
  std::function<std::optional<std::string>(const char*)> lookup_env;  // the process: env_lookup
};

struct EfaReport {
  std::vector<std::string> efa_devices;   // e.g. "rdmap16s27"
  std::string net_plugin;                 // path of the loaded libnccl-net*.so, "" if none
  std::string libfabric;                  // path of the loaded libfabric.so, "" if none
  std::vector<std::string> settings;      // "NAME=value" of the relevant variables that are set
  std::vector<std::string> advice;        // one line per obsolete or harmful setting
};

struct EfaVerdict {
  LogLevel level = LogLevel::kInfo;  // kWarn when EFA hardware is present but not used
  std::string message;
};

// Paths of the shared objects loaded into this process (dl_iterate_phdr).
std::vector<std::string> loaded_libraries();

EfaReport probe_efa(const EfaProbeInputs& inputs);
EfaVerdict judge_efa(const EfaReport& report);

// Probes this process and logs the verdict (once per process).
void log_efa_check();

}  // namespace torus::comm::nccl
