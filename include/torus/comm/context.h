// torus/comm/context.h — bootstrap: who am I, where is everybody, and the
// world communicators. Free of LibTorch; torus::init() (process_group.h)
// wraps a Context in the world ProcessGroup.
//
// Bootstrap order (DESIGN.md): explicit InitOptions > TORUS_* variables >
// Open MPI (OMPI_COMM_WORLD_*) > PMIx (PMIX_RANK) > Slurm (SLURM_PROCID...,
// only inside a step: SLURM_STEP_ID set) > torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) > single process.
// The source used is logged.
//
// Store address and job token (Note [Store security] in store.h):
//  * TORUS_MASTER_ADDR/PORT (or MASTER_ADDR/PORT, or options) name rank 0's
//    store; rank 0 listens on exactly that address.
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
//  * Under torchrun, whose agent serves its own store at MASTER_ADDR:
//    MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), rank 0 listens on a
//    port of its own instead: Note [torchrun's agent store] below.
//
// Note [torchrun's agent store]: torchrun's elastic agent hosts a c10d
// TCPStore at MASTER_ADDR:MASTER_PORT and tells its workers so with
// TORCHELASTIC_USE_AGENT_STORE=True; the port is taken, so Torus's rank 0
// cannot listen there. It listens instead on an ephemeral port of the
// interface the Open MPI path would choose (TORUS_SOCKET_IFNAME, else
// loopback when LOCAL_WORLD_SIZE == WORLD_SIZE, else the first non-loopback
// interface) and writes "host port [token]" into the agent's store under
// torus/<TORCHELASTIC_RUN_ID>/attempt_<TORCHELASTIC_RESTART_COUNT>/store;
// the other ranks read it there (within the store timeout) and connect. The
// key names the restart attempt, so a worker group restarted by the agent
// never reads the address of the group before it. The agent's store is
// reached through LibTorch's client (c10d::TCPStore), registered by the
// torch-facing library (src/comm/agent_store.h), so torus_base stays free of
// LibTorch. The token travels with the address only when rank 0 generated it
// and the store is not on loopback; on loopback it goes through the private
// file of Note [Local job token], and TORUS_JOB_TOKEN is never published.
// The agent's store is unauthenticated: whoever can reach it can read a
// published token, but can equally rewrite torchrun's rendezvous and every
// address the workers take from it, so the token adds no trust that the job
// did not already place in that store (docs/comm.md, docs/decisions.md).
// Only MASTER_ADDR and MASTER_PORT from the launcher count: an address given
// to Torus (options, TORUS_MASTER_ADDR/PORT) is always Torus's to listen on.
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

// torchrun's agent serves the store at MASTER_ADDR:MASTER_PORT (Note
// [torchrun's agent store]).
struct AgentStoreInfo {
  std::string run_id;     // TORCHELASTIC_RUN_ID (may be empty)
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: the worker group's restart attempt
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
  std::optional<AgentStoreInfo> agent_store;  // set: master_addr:master_port is torchrun's agent store
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
