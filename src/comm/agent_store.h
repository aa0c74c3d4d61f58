// Private: how the bootstrap finds rank 0's store under torchrun, whose
// elastic agent already serves a store of its own at MASTER_ADDR:MASTER_PORT.
//
// Note [torchrun's agent store]: torchrun's elastic agent hosts a c10d
// TCPStore at MASTER_ADDR:MASTER_PORT and tells its workers so with
// TORCHELASTIC_USE_AGENT_STORE=True; the port is taken, so Torus's rank 0
// cannot listen there. It listens instead on an ephemeral port of the
// interface the Open MPI path would choose (TORUS_SOCKET_IFNAME, else
// loopback when LOCAL_WORLD_SIZE == WORLD_SIZE, else the first non-loopback
// interface) and writes "torus-store-v1 host port [token]" into the agent's
// store under torus/<TORCHELASTIC_RUN_ID>/attempt_<TORCHELASTIC_RESTART_COUNT>/store;
// the other ranks read it there (within the store timeout) and connect. The
// key names the restart attempt: the agent keeps its store across restarts
// (--max-restarts), and a restarted worker group must never read the address
// of the group before it.
//
// The token travels with the address only when rank 0 generated it and its
// store is not on loopback; on loopback it goes through the private file of
// Note [Local job token] (store_token.h), and TORUS_JOB_TOKEN is never
// published. The agent's store is unauthenticated: whoever can reach it can
// read a published token, but can equally rewrite torchrun's rendezvous and
// every address the workers take from it, so the token adds no trust the job
// did not already place in that store (docs/comm.md, docs/decisions.md).
// Only the launcher's MASTER_ADDR and MASTER_PORT count: an address given to
// Torus (InitOptions, TORUS_MASTER_ADDR/PORT) is always Torus's to listen on.
//
// The seam: the agent's store speaks c10d's protocol, whose client is
// LibTorch's (c10d::TCPStore), and torus_base must not include LibTorch. So
// the torch-facing library registers a connector when it is loaded
// (c10d_agent_store.cpp), the way a backend registers its factory, and the
// bootstrap asks for it only when torchrun says its agent serves the store.
// A program linked with the torch-free objects alone has no connector, and
// says so.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "torus/comm/context.h"
#include "torus/comm/store.h"

namespace torus::comm {

// torchrun's agent serves the store at the launcher's MASTER_ADDR:MASTER_PORT.
struct AgentStoreInfo {
  std::string run_id;     // TORCHELASTIC_RUN_ID (may be empty)
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: the worker group's restart attempt
};

// Set when TORCHELASTIC_USE_AGENT_STORE is true (torchrun writes "True"; 1
// and any case are taken too) and the store address is the launcher's
// MASTER_ADDR and MASTER_PORT, not one given in `options` or `params`.
// Reads the launcher's variables through `launcher_env`, like detect_launch.
// Throws InvalidArgument for a flag that is neither true nor false, or one
// without TORCHELASTIC_RESTART_COUNT.
std::optional<AgentStoreInfo> detect_agent_store(const InitOptions& options, const EnvParams& params,
                                                 const GetEnv& launcher_env);

// Connects a client to the agent's store at host:port, retrying until
// `timeout`. The Store's get/wait take their own timeouts; failures throw
// TimeoutError (a key or the server not there in time) or CommError.
using AgentStoreConnector = std::shared_ptr<Store> (*)(const std::string& host, int port,
                                                       std::chrono::milliseconds timeout);

// Installs the connector; the torch-facing library calls it once at load
// time. Thread safe; the last registration wins.
void register_agent_store_connector(AgentStoreConnector connect);

// The registered connector's client. Throws Unsupported when none is
// registered.
std::shared_ptr<Store> connect_agent_store(const std::string& host, int port, std::chrono::milliseconds timeout);

// Where rank 0's store listens, as published in the agent's store. `token`
// is empty when it does not travel with the address (TORUS_JOB_TOKEN, or the
// private file of a loopback store).
struct AgentStoreRecord {
  std::string host;  // numeric address
  int port = 0;
  std::string token;
};

// The key of this job and restart attempt:
// "torus/<run id>/attempt_<restart count>/store".
std::string agent_store_key(const AgentStoreInfo& info);

// "torus-store-v1 <host> <port>[ <token>]". decode_agent_store_record bounds
// and validates what it reads (the agent's store is open to anyone who can
// reach it): throws CommError naming the fault for anything else.
std::string encode_agent_store_record(const AgentStoreRecord& record);
AgentStoreRecord decode_agent_store_record(std::string_view text);

}  // namespace torus::comm
