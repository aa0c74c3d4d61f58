// Private: the seam between the torch-free bootstrap and the client of
// torchrun's agent store (Note [torchrun's agent store] in
// torus/comm/context.h), and the record rank 0 publishes there.
//
// The agent serves a c10d TCPStore, whose client is LibTorch's
// (c10d::TCPStore); torus_base must not include LibTorch. So the torch-facing
// library registers a connector when it is loaded (c10d_agent_store.cpp), the
// way a backend registers its factory, and the bootstrap asks for it only
// when torchrun says its agent serves the store. A program linked with the
// torch-free objects alone has no connector, and says so.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "torus/comm/context.h"
#include "torus/comm/store.h"

namespace torus::comm {

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
