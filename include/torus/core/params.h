// torus/core/params.h — typed run-time parameters and their environment
// overrides.
//
// Configuration is a value: every component takes an options struct. The
// environment is a documented override layer, parsed here and only here
// (src/core/params.cpp), once per process, and logged once at start-up by the
// bootstrap. docs/params.md lists every variable, its type, its default and
// the component that reads it.
//
// Precedence, highest first: explicit options in code > TORUS_* variables >
// launcher variables (Open MPI, PMIx, Slurm, torchrun) > defaults.
//
// Note [One reader of the environment]: nothing outside params.cpp calls
// getenv. Components take their values from env_params() (or from an options
// struct filled from it: comm::ofi::OfiOptions, comm::SharedHostPoolOptions,
// comm::SharedHostAllocatorOptions). Two kinds of variables that are not
// Torus's own are read through env_lookup() instead of being fields here:
// the launcher's (OMPI_COMM_WORLD_*, PMIX_*, SLURM_*, RANK, ...), which the
// bootstrap's launch detection walks in precedence order through an
// injectable lookup (comm::detect_launch), and the NCCL/libfabric settings
// the EFA start-up check reports (src/comm/nccl/efa_check.cpp).
// docs/decisions.md says why.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torus/core/logging.h"

namespace torus {

// TORUS_SHARED_HOST_ALLOC (comm/shared_host.h, Note [Shared host allocator]).
enum class SharedHostAllocPolicy { kAuto, kOn, kOff };

struct EnvParams {
  // --- logging ---------------------------------------------------------------
  LogLevel log_level = LogLevel::kInfo;          // TORUS_LOG_LEVEL

  // --- collectives -------------------------------------------------------------
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // TORUS_TIMEOUT_MS
  bool debug_collectives = false;                // TORUS_DEBUG_COLLECTIVES=1
  std::string host_backend;                      // TORUS_BACKEND: mpi | ofi (empty: best built)

  // --- bootstrap (explicit rank information; all optional) ---------------------
  // Read by comm::detect_launch, above the launcher's variables.
  std::optional<int> rank;                       // TORUS_RANK
  std::optional<int> world_size;                 // TORUS_WORLD_SIZE
  std::optional<int> local_rank;                 // TORUS_LOCAL_RANK
  std::optional<int> local_size;                 // TORUS_LOCAL_SIZE
  std::string master_addr;                       // TORUS_MASTER_ADDR
  std::optional<int> master_port;                // TORUS_MASTER_PORT
  std::string socket_ifname;                     // TORUS_SOCKET_IFNAME
  std::string job_token;                         // TORUS_JOB_TOKEN (never logged)
  std::chrono::milliseconds store_timeout{std::chrono::minutes(5)};  // TORUS_STORE_TIMEOUT_MS
  // Where a loopback job without a token keeps it (Note [Local job token] in
  // src/comm/store_token.h): TORUS_RUNTIME_DIR, else XDG_RUNTIME_DIR, else
  // TMPDIR, else /tmp.
  std::string runtime_dir = "/tmp";

  // --- ofi backend (docs/ofi.md) -------------------------------------------------
  // Read by comm::ofi::OfiOptions::from_params (src/comm/ofi/ofi_options.h),
  // which holds the defaults and the meaning of each: an unset tunable keeps
  // that default. The lower bounds are checked here.
  struct Ofi {
    std::string provider;                        // TORUS_OFI_PROVIDER, else FI_PROVIDER
    std::optional<bool> host_shm;                // TORUS_OFI_HOST_SHM
    std::optional<size_t> shm_chunk_bytes;       // TORUS_OFI_SHM_CHUNK_BYTES (>= 64)
    std::optional<size_t> shm_stage_bytes;       // TORUS_OFI_SHM_STAGE_BYTES (>= 4096)
    std::optional<int> shm_depth;                // TORUS_OFI_SHM_DEPTH (>= 2)
    std::optional<size_t> shm_eager_bytes;       // TORUS_OFI_SHM_EAGER_BYTES
    std::optional<size_t> shm_nt_bytes;          // TORUS_OFI_SHM_NT_BYTES
    std::optional<size_t> shm_zero_copy_bytes;   // TORUS_OFI_SHM_ZERO_COPY_BYTES
    std::optional<size_t> inline_spin_us;        // TORUS_OFI_INLINE_SPIN_US
    std::optional<size_t> inline_max_bytes;      // TORUS_OFI_INLINE_MAX_BYTES
    std::optional<bool> oversubscribed;          // TORUS_OFI_OVERSUBSCRIBED (unset: decided from the host)
    std::optional<size_t> rd_max_bytes;          // TORUS_OFI_RD_MAX_BYTES
    std::optional<size_t> tree_max_bytes;        // TORUS_OFI_TREE_MAX_BYTES
    std::optional<size_t> chunk_bytes;           // TORUS_OFI_CHUNK_BYTES (>= 64)
    std::optional<int> window;                   // TORUS_OFI_WINDOW (>= 1)
    std::optional<bool> register_local;          // TORUS_OFI_REGISTER_LOCAL
    std::string hmem;                            // TORUS_OFI_HMEM: auto | off | as-host (empty: auto)
  } ofi;

  // --- shared host memory (docs/comm.md, "Shared host buffers") ------------------
  // Read by comm::SharedHostPoolOptions / SharedHostAllocatorOptions
  // ::from_params (include/torus/comm/shared_host.h), which hold the defaults.
  struct SharedHost {
    SharedHostAllocPolicy alloc = SharedHostAllocPolicy::kAuto;  // TORUS_SHARED_HOST_ALLOC: auto | on | off
    std::optional<size_t> alloc_min_bytes;       // TORUS_SHARED_HOST_ALLOC_MIN_BYTES (>= 1)
    std::optional<size_t> slab_bytes;            // TORUS_SHARED_HOST_SLAB_BYTES (>= 2 MiB)
    std::optional<size_t> cache_bytes;           // TORUS_SHARED_HOST_CACHE_BYTES
    bool fork_copy = false;                      // TORUS_SHARED_HOST_FORK: view (false) | copy (true)
  } shared_host;

  // --- MFU (docs/train.md, "MFU") -------------------------------------------------
  // The file that keeps measured CPU peaks per host (torus/device/peak_cache.h):
  // TORUS_PEAK_CACHE (a path, or "off"), else $XDG_CACHE_HOME/torus/peak_flops.json,
  // else $HOME/.cache/torus/peak_flops.json. Empty: off (measure every run).
  std::string peak_cache;

  // --- optimizers (docs/optim.md, "CPU Adam") ------------------------------------
  std::string cpu_adam_isa;                      // TORUS_CPU_ADAM_ISA: auto | scalar | avx2 | avx512 (empty: auto)

  // --- Neuron runtime (docs/neuron.md; Neuron builds only) ------------------------
  // The Neuron runtime library to load: a path, or empty for libnrt.so.1
  // through the usual library search path. The runtime reads its own
  // NEURON_RT_* variables (NEURON_RT_VISIBLE_CORES, ...); Torus does not.
  std::string neuron_library;                    // TORUS_NEURON_LIBRARY

  // Reads the process environment. Throws InvalidArgument naming the variable
  // when a value does not parse or is out of range. Unknown TORUS_* variables
  // are collected in `unknown` (logged as a warning, since they are usually
  // typos).
  static EnvParams from_env();

  // Name/value lines for the start-up log; the job token is redacted.
  std::vector<std::pair<std::string, std::string>> describe() const;

  std::vector<std::string> unknown;
};

// The parameters of this process, parsed on first use (thread safe). A parse
// that throws is retried on the next call; one that succeeds is kept, so
// later changes to the environment are not seen.
const EnvParams& env_params();

// Whether `name` is a TORUS_* variable Torus knows: one parsed above, or one
// read only by the build scripts and tests (those, and the reserved prefix
// TORUS_TEST_, never reach the library).
bool is_known_env_variable(const std::string& name);

// TORUS_LOG_LEVEL for the logger's first level, which must work before (and
// without) env_params(): never throws; info when unset or bad (EnvParams
// rejects a bad value when the bootstrap parses it).
LogLevel initial_log_level_from_env() noexcept;

// Low-level helpers, exposed for tests and for the variables that are not
// Torus's own (Note [One reader of the environment]). env_lookup: the value
// of a set variable, empty included. The others treat an empty value as
// unset and throw InvalidArgument naming `name` on a bad value.
std::optional<std::string> env_lookup(const char* name);
std::optional<std::string> env_string(const char* name);
std::optional<int64_t> env_int(const char* name);
std::optional<bool> env_bool(const char* name);

}  // namespace torus
