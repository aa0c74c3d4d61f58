// torus/core/params.h — typed run-time parameters and their environment
// overrides.
//
// Configuration is a value: every component takes an options struct. The
// environment is a documented override layer, parsed here and only here
// (src/core/params.cpp), once per process, and logged once at start-up by the
// bootstrap. docs/params.md lists every variable.
//
// Precedence, highest first: explicit options in code > TORUS_* variables >
// launcher variables (Open MPI, PMIx, Slurm, torchrun) > defaults.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "torus/core/logging.h"

namespace torus {

struct EnvParams {
  // --- logging ---------------------------------------------------------------
  LogLevel log_level = LogLevel::kInfo;          // TORUS_LOG_LEVEL

  // --- collectives -------------------------------------------------------------
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // TORUS_TIMEOUT_MS
  bool debug_collectives = false;                // TORUS_DEBUG_COLLECTIVES=1
  std::string host_backend;                      // TORUS_BACKEND: mpi | ofi (empty: best built)

  // --- bootstrap (explicit rank information; all optional) ---------------------
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

  // --- ofi backend ---------------------------------------------------------------
  std::string ofi_provider;                      // TORUS_OFI_PROVIDER, else FI_PROVIDER

  // Reads the process environment. Throws InvalidArgument naming the variable
  // when a value does not parse. Unknown TORUS_* variables are collected in
  // `unknown` (logged as a warning, since they are usually typos).
  static EnvParams from_env();

  // Name/value lines for the start-up log; the job token is redacted.
  std::vector<std::pair<std::string, std::string>> describe() const;

  std::vector<std::string> unknown;
};

// The parameters of this process, parsed on first use (thread safe).
const EnvParams& env_params();

// Low-level helpers, exposed for tests and for the few launcher variables read
// by the bootstrap. Each throws InvalidArgument naming `name` on a bad value.
std::optional<std::string> env_string(const char* name);
std::optional<int64_t> env_int(const char* name);
std::optional<bool> env_bool(const char* name);

}  // namespace torus
