// Launch detection: rank, world size, local rank/size and the store address,
// following the precedence written in context.h. The TORUS_* values come
// parsed (EnvParams); the launcher's variables are read here, through the
// injected lookup, since which of them count depends on which are present.
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/agent_store.h"
#include "core/log.h"
#include "torus/comm/context.h"
#include "torus/core/params.h"

namespace torus::comm {
namespace {

struct Reader {
  const GetEnv& lookup;

  std::optional<int> integer(const char* name, int min_value) const {
    auto s = lookup(name);
    if (!s || s->empty()) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(s->c_str(), &end, 10);
    TORUS_CHECK(errno == 0 && end && *end == '\0' && v >= min_value && v <= INT32_MAX, InvalidArgument,
                "launcher variable {}='{}' is not an integer >= {}", name, *s, min_value);
    return static_cast<int>(v);
  }
  std::string string(const char* name) const {
    auto s = lookup(name);
    return s ? *s : std::string();
  }
  bool has(const char* name) const {
    auto s = lookup(name);
    return s && !s->empty();
  }
};

// Fills rank/size/local from one source when its variables are present.
bool from_source(const Reader& env, LaunchInfo& out, const char* rank_var, const char* size_var,
                 const char* local_rank_var, const char* local_size_var) {
  auto rank = env.integer(rank_var, 0);
  auto size = size_var ? env.integer(size_var, 1) : std::nullopt;
  if (!rank && !size) return false;
  TORUS_CHECK(rank && size, InvalidArgument, "{} and {} must be set together (found only {})", rank_var,
              size_var ? size_var : "?", rank ? rank_var : size_var);
  out.rank = *rank;
  out.world_size = *size;
  out.local_rank = local_rank_var ? env.integer(local_rank_var, 0).value_or(-1) : -1;
  out.local_size = local_size_var ? env.integer(local_size_var, 1).value_or(-1) : -1;
  return true;
}

// Slurm's per-node task counts: SLURM_TASKS_PER_NODE ("4(x2),3" = 4, 4, 3
// on nodes 0, 1, 2) at SLURM_NODEID, else an integer SLURM_NTASKS_PER_NODE;
// -1 when neither says.
int slurm_local_size(const Reader& env) {
  std::string spec = env.string("SLURM_TASKS_PER_NODE");
  auto node = env.integer("SLURM_NODEID", 0);
  if (!spec.empty() && node) {
    int index = 0;
    size_t pos = 0;
    while (pos < spec.size()) {
      size_t comma = spec.find(',', pos);
      std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      int count = 0, repeat = 1;
      char tail = 0;
      int fields = std::sscanf(item.c_str(), "%d(x%d)%c", &count, &repeat, &tail);
      TORUS_CHECK((fields == 1 && item.find('(') == std::string::npos) || (fields == 2 && item.back() == ')'),
                  InvalidArgument, "SLURM_TASKS_PER_NODE='{}' is not a list of N or N(xM)", spec);
      if (*node < index + repeat) return count;
      index += repeat;
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    throw InvalidArgument(fmt::format("SLURM_NODEID={} is past the nodes of SLURM_TASKS_PER_NODE='{}'", *node, spec));
  }
  std::string per_node = env.string("SLURM_NTASKS_PER_NODE");
  if (!per_node.empty() && per_node.find_first_not_of("0123456789") == std::string::npos) {
    return *env.integer("SLURM_NTASKS_PER_NODE", 1);
  }
  return -1;
}

// TORCHELASTIC_USE_AGENT_STORE as torchrun writes it (str(bool): "True" or
// "False"); 1/0 and any case are taken too.
bool agent_store_flag(const Reader& env) {
  std::string v = env.string("TORCHELASTIC_USE_AGENT_STORE");
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v.empty() || v == "false" || v == "0") return false;
  TORUS_CHECK(v == "true" || v == "1", InvalidArgument, "TORCHELASTIC_USE_AGENT_STORE='{}' is not True or False",
              env.string("TORCHELASTIC_USE_AGENT_STORE"));
  return true;
}

}  // namespace

LaunchInfo detect_launch(const InitOptions& options, const EnvParams& params, const GetEnv& launcher_env) {
  Reader env{launcher_env};
  LaunchInfo info;
  info.local_rank = -1;
  info.local_size = -1;
  info.launched_by_mpi = env.has("OMPI_COMM_WORLD_SIZE");

  if (options.rank || options.world_size) {
    TORUS_CHECK(options.rank && options.world_size, InvalidArgument,
                "InitOptions: rank and world_size must be given together");
    info.rank = *options.rank;
    info.world_size = *options.world_size;
    info.source = "options";
  } else if (params.rank || params.world_size) {
    TORUS_CHECK(params.rank && params.world_size, InvalidArgument,
                "TORUS_RANK and TORUS_WORLD_SIZE must be set together (found only {})",
                params.rank ? "TORUS_RANK" : "TORUS_WORLD_SIZE");
    info.rank = *params.rank;
    info.world_size = *params.world_size;
    info.source = "torus-env";
  } else if (env.has("TORCHELASTIC_RUN_ID") &&
             from_source(env, info, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")) {
    // A worker of torchrun's agent. The agent may itself be a task of srun
    // or mpirun (one per node), whose variables the worker inherits: they
    // describe the agent, not this process, so torchrun's come first.
    info.source = "torchrun";
    info.launched_by_mpi = false;
  } else if (from_source(env, info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE")) {
    info.source = "open-mpi";
  } else if (env.has("PMIX_RANK") && (env.has("PMIX_SIZE") || env.has("OMPI_UNIVERSE_SIZE"))) {
    // PMIx proper needs the PMIx client library; launchers that export the
    // size beside PMIX_RANK are served from the environment.
    info.rank = *env.integer("PMIX_RANK", 0);
    info.world_size = env.has("PMIX_SIZE") ? *env.integer("PMIX_SIZE", 1) : *env.integer("OMPI_UNIVERSE_SIZE", 1);
    info.source = "pmix";
  } else if (env.has("SLURM_STEP_ID") &&
             from_source(env, info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr)) {
    // A task of a job step (srun, with or without --mpi=pmix; srun's PMIx
    // exports no size beside PMIX_RANK, so it lands here). The batch script
    // itself has no step: its SLURM_PROCID/SLURM_NTASKS describe the job.
    info.local_size = slurm_local_size(env);
    info.source = "slurm";
  } else if (env.has("RANK") && !env.has("LOCAL_RANK") && !env.has("TORCHELASTIC_RUN_ID") &&
             env.has("KUBERNETES_SERVICE_HOST")) {
    // Kubernetes training operators (PyTorchJob, TrainJob's torch runtime)
    // give every pod RANK = the pod's index: a process rank only when the
    // pod runs one process, which Torus cannot know. torchrun adds
    // LOCAL_RANK and TORCHELASTIC_RUN_ID; mpirun (MPIJob) its own variables.
    throw InvalidArgument(fmt::format(
        "RANK={} WORLD_SIZE={} are set in a Kubernetes pod without LOCAL_RANK or TORCHELASTIC_RUN_ID: that is a "
        "training operator's pod rank, not a process rank. Launch the pod's processes with mpirun (MPIJob) or "
        "torchrun, or, with exactly one process per pod, set TORUS_RANK and TORUS_WORLD_SIZE",
        env.string("RANK"), env.string("WORLD_SIZE")));
  } else if (from_source(env, info, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")) {
    info.source = "torchrun";
  } else {
    info.rank = 0;
    info.world_size = 1;
    info.source = "single";
  }

  // Local rank/size: options > TORUS_LOCAL_* > the source's own. Ranks given
  // in code take no local values from the environment.
  if (info.source != "options") {
    if (params.local_rank) info.local_rank = *params.local_rank;
    if (params.local_size) info.local_size = *params.local_size;
  }
  if (options.local_rank) info.local_rank = *options.local_rank;
  if (options.local_size) info.local_size = *options.local_size;

  TORUS_CHECK(info.world_size >= 1, InvalidArgument, "world size must be >= 1, got {} (from {})", info.world_size,
              info.source);
  TORUS_CHECK(info.rank >= 0 && info.rank < info.world_size, InvalidArgument,
              "rank {} is out of range for world size {} (from {})", info.rank, info.world_size, info.source);
  if (info.local_size > 0 && info.local_rank >= 0) {
    TORUS_CHECK(info.local_rank < info.local_size, InvalidArgument, "local rank {} >= local size {} (from {})",
                info.local_rank, info.local_size, info.source);
  }

  // The store address: options > TORUS_MASTER_* > MASTER_* (torchrun, Slurm
  // recipes). Empty means the bootstrap chooses (Open MPI launches).
  info.master_addr = options.master_addr;
  if (info.master_addr.empty()) info.master_addr = params.master_addr;
  if (info.master_addr.empty()) info.master_addr = env.string("MASTER_ADDR");
  std::optional<int> port = options.master_port;
  if (!port) port = params.master_port;
  if (!port) port = env.integer("MASTER_PORT", 0);
  info.master_port = port.value_or(0);
  TORUS_CHECK(info.master_port >= 0 && info.master_port <= 65535, InvalidArgument, "master port {} is not a port",
              info.master_port);
  TORUS_CHECK(info.world_size == 1 || info.launched_by_mpi || !info.master_addr.empty(), InvalidArgument,
              "a {}-rank job launched through '{}' needs the store address: set TORUS_MASTER_ADDR and "
              "TORUS_MASTER_PORT (or MASTER_ADDR/MASTER_PORT)",
              info.world_size, info.source);
  TORUS_CHECK(info.master_addr.empty() || info.master_port > 0 || info.launched_by_mpi, InvalidArgument,
              "master address '{}' given without a port: set TORUS_MASTER_PORT (or MASTER_PORT)", info.master_addr);
  return info;
}

LaunchInfo detect_launch(const InitOptions& options) { return detect_launch(options, env_params(), env_lookup); }

std::optional<AgentStoreInfo> detect_agent_store(const InitOptions& options, const EnvParams& params,
                                                 const GetEnv& launcher_env) {
  Reader env{launcher_env};
  // An address given to Torus itself is Torus's to listen on, agent or not.
  const bool launcher_address = options.master_addr.empty() && params.master_addr.empty() && !options.master_port &&
                                !params.master_port && env.has("MASTER_ADDR");
  if (!launcher_address || !agent_store_flag(env)) return std::nullopt;
  auto attempt = env.integer("TORCHELASTIC_RESTART_COUNT", 0);
  TORUS_CHECK(attempt.has_value(), InvalidArgument,
              "TORCHELASTIC_USE_AGENT_STORE is set without TORCHELASTIC_RESTART_COUNT: not a torchrun worker?");
  return AgentStoreInfo{env.string("TORCHELASTIC_RUN_ID"), *attempt};
}

}  // namespace torus::comm
