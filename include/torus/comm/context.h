// torus/comm/context.h — bootstrap: who am I, where is everybody, and the
// world communicators. Free of LibTorch; torus::init() (process_group.h)
// wraps a Context in the world ProcessGroup.
//
// Bootstrap order (DESIGN.md): InitOptions > TORUS_* > a torchrun worker
// (TORCHELASTIC_RUN_ID: its agent may be an srun or mpirun task) > Open MPI
// (OMPI_COMM_WORLD_*) > PMIx (PMIX_RANK) > Slurm (SLURM_PROCID..., only in a
// step: SLURM_STEP_ID set) > torchrun style (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) > single process. Logged.
//
// Store address and job token (Note [Store security] in store.h):
//  * TORUS_MASTER_ADDR/PORT (or MASTER_ADDR/PORT, or options) name rank 0's
//    store, where it listens (torchrun's own store: src/comm/agent_store.h).
//  * Launched by Open MPI without a master address, rank 0 listens on the
//    interface chosen by TORUS_SOCKET_IFNAME (loopback when the whole job is
//    on one host, else the interface of the default route) and hands address,
//    port and — if the launcher gave none — a freshly generated job token to
//    the ranks through MPI.
//  * Otherwise the token comes from TORUS_JOB_TOKEN (options.job_token). Only
//    a job whose store listens on loopback (so every rank is on rank 0's
//    host) may run without one: then rank 0 generates a token and shares it
//    through a file only this user can read, <runtime dir>/torus-<uid>/
//    store-<address>-<port>.token (mode 0600 in a 0700 directory; runtime
//    dir: TORUS_RUNTIME_DIR, else XDG_RUNTIME_DIR, else TMPDIR, else /tmp).
//    The other ranks wait for it within the store timeout, re-read it if
//    their token is refused (a stale file of an earlier job on that port),
//    and rank 0 removes it when its store server shuts down. A directory
//    that is a symbolic link, another user's, or open to group or others is
//    refused with InvalidArgument: no rank falls back to a guessable token.
//    Note [Local job token] in src/comm/store_token.h has the details.
#pragma once

#include <atomic>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torus/comm/backend.h"
#include "torus/comm/store.h"
#include "torus/comm/types.h"
#include "torus/core/params.h"

namespace torus::comm {

class LocalTokenFile;  // private: src/comm/store_token.h

struct InitOptions {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<int> local_size;
  std::string master_addr;
  std::optional<int> master_port;
  std::string job_token;
  std::string host_backend;   // "mpi" | "ofi"; empty: TORUS_BACKEND, else the fastest usable
  Duration timeout{0};        // default op deadline; 0: TORUS_TIMEOUT_MS (10 min)
};

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string source;         // "options", "torus-env", "open-mpi", "pmix", "slurm", "torchrun", "single"
  std::string master_addr;    // empty: chosen by the bootstrap
  int master_port = 0;
  bool launched_by_mpi = false;
};

// Finds rank information following the precedence above: `options`, then
// the TORUS_* values in `params`, then the launcher's variables (Open MPI,
// PMIx, Slurm, torchrun), looked up through `launcher_env` (injectable for
// tests). Throws InvalidArgument on inconsistent values (rank >= world size,
// negative, half-specified pairs).
using GetEnv = std::function<std::optional<std::string>(const char*)>;
LaunchInfo detect_launch(const InitOptions& options, const EnvParams& params, const GetEnv& launcher_env);
// This process: detect_launch(options, env_params(), env_lookup).
LaunchInfo detect_launch(const InitOptions& options);

// Which hosts the ranks are on, from a hostname exchange through the Store.
struct HostMap {
  std::vector<int> host_of_rank;       // host index per world rank (by first appearance)
  std::vector<std::string> hostnames;  // per host index
  int num_hosts() const { return static_cast<int>(hostnames.size()); }
};

class Context {
 public:
  // Runs the whole bootstrap: launch detection, store, host map, the world
  // host backend. Collective over the job. Throws InvalidArgument on bad
  // configuration, TimeoutError if peers do not arrive within the store
  // timeout.
  static std::shared_ptr<Context> create(const InitOptions& options = {});
  ~Context();

  const LaunchInfo& launch() const { return launch_; }
  int rank() const { return launch_.rank; }

  // Declares the job failed (a peer died or an op failed for good): at
  // destruction rank 0 no longer waits for every rank to check out of the
  // store (Note in ~Context), since a dead rank never will. An op of this
  // process that failed after the Context was made has the same effect
  // (every Work that fails counts). Thread safe.
  void mark_failed() { failed_.store(true); }
  bool failed() const { return failed_.load(); }
  int world_size() const { return launch_.world_size; }
  const HostMap& hosts() const { return hosts_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  Duration default_timeout() const { return timeout_; }

  // The world communicator of the host (CPU) backend.
  const BackendPtr& host_backend() const { return host_backend_; }
  // The world communicator of the device backend (nccl), or null when this
  // build has none or the process sees no device.
  const BackendPtr& device_backend() const { return device_backend_; }
  std::string_view host_backend_name() const;

  // Names of host backends compiled into this build ("mpi", "ofi").
  static std::vector<std::string> available_host_backends();

 private:
  Context() = default;
  LaunchInfo launch_;
  HostMap hosts_;
  Duration timeout_{0};
  std::shared_ptr<void> mpi_hold_;  // keeps MPI initialised (mpi builds under mpirun)
  std::unique_ptr<LocalTokenFile> token_file_;  // rank 0 of a loopback job without a token; outlives server_
  std::unique_ptr<TcpStoreServer> server_;
  std::atomic<bool> failed_{false};
  uint64_t failed_ops_at_start_ = 0;  // failed_ops_in_process() when made
  std::shared_ptr<Store> store_;
  BackendPtr host_backend_;
  BackendPtr device_backend_;
};

// Factory used by Context for the world backend of a given name. Each backend
// lives in its own directory and registers itself (torus/comm/backends.h).
// Throws Unsupported for a name not built in, listing those that are.
struct BackendInit {
  const LaunchInfo* launch = nullptr;
  const HostMap* hosts = nullptr;
  std::shared_ptr<Store> store;
  Duration timeout{0};
};
BackendPtr create_world_backend(const std::string& name, const BackendInit& init);

}  // namespace torus::comm
