// The bootstrap (context.h): launch detection, the rendezvous store, the host
// map and the world host backend.
#include "torus/comm/context.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "comm/agent_store.h"
#include "comm/backend_registry.h"
#include "comm/op_failures.h"
#include "comm/store_token.h"
#include "core/log.h"
#include "torus/core/params.h"
#include "torus/device/device.h"

namespace torus::comm {
namespace {

using namespace std::chrono_literals;

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// Resolves a host name or address to a numeric address to bind or connect.
std::string numeric_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  TORUS_CHECK(rc == 0 && res != nullptr, InvalidArgument, "cannot resolve store address '{}': {}", host,
              gai_strerror(rc));
  char buf[INET6_ADDRSTRLEN] = {0};
  const void* src = res->ai_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr)
                                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr);
  ::inet_ntop(res->ai_family, src, buf, sizeof(buf));
  ::freeaddrinfo(res);
  return buf;
}

// The IPv4 address of interface `ifname`, or of the first non-loopback
// interface that is up when `ifname` is empty.
std::string interface_address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  TORUS_CHECK_SYS(::getifaddrs(&list), "getifaddrs");
  std::string found;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    bool loop = (it->ifa_flags & IFF_LOOPBACK) != 0;
    if (ifname.empty() ? loop : ifname != it->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof(buf));
    found = buf;
    break;
  }
  ::freeifaddrs(list);
  TORUS_CHECK(!found.empty(), InvalidArgument, "no IPv4 address on {} for the store (set TORUS_SOCKET_IFNAME)",
              ifname.empty() ? std::string("any non-loopback interface") : "interface '" + ifname + "'");
  return found;
}

// Host identity: the host name plus the network namespace, so that ranks in
// different network namespaces of one machine count as different hosts.
std::string host_identity() {
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  std::string id = name;
  struct stat st{};
  if (::stat("/proc/self/ns/net", &st) == 0) id += fmt::format("#net{}", static_cast<unsigned long>(st.st_ino));
  return id;
}

}  // namespace

std::shared_ptr<Context> Context::create(const InitOptions& options) {
  const EnvParams& params = env_params();
  set_log_level(params.log_level);
  std::shared_ptr<Context> ctx(new Context());
  ctx->failed_ops_at_start_ = failed_ops_in_process();
  ctx->launch_ = detect_launch(options, params, env_lookup);
  LaunchInfo& L = ctx->launch_;
  set_log_rank(L.rank, L.world_size);
  ctx->timeout_ = options.timeout.count() > 0 ? options.timeout : params.timeout;

  std::string token = !options.job_token.empty() ? options.job_token : params.job_token;
  const bool single_host_hint = L.local_size > 0 && L.local_size == L.world_size;

  // --- the store --------------------------------------------------------------
  std::string host;
  int port = 0;
  std::optional<LocalTokenPath> local_token;  // set when the token travels through a file
  const std::optional<AgentStoreInfo> agent_store = detect_agent_store(options, params, env_lookup);
  if (L.world_size == 1 && (L.master_addr.empty() || agent_store)) {
    if (token.empty()) token = generate_job_token();
    ctx->server_ = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{"127.0.0.1", 0, token});
    host = "127.0.0.1";
    port = ctx->server_->port();
  } else if (L.master_addr.empty()) {
    const LauncherChannel* mpi = launcher_channel("mpi");
    TORUS_CHECK(mpi != nullptr, InvalidArgument,
                "launched by Open MPI but this Torus was built without MPI: set TORUS_MASTER_ADDR and "
                "TORUS_MASTER_PORT");
    // Launched by Open MPI: rank 0 chooses, MPI hands out address and token.
    std::string payload;
    if (L.rank == 0) {
      std::string bind = !params.socket_ifname.empty() ? interface_address(params.socket_ifname)
                         : single_host_hint            ? std::string("127.0.0.1")
                                                       : interface_address("");
      if (token.empty()) token = generate_job_token();
      ctx->server_ = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{bind, 0, token});
      payload = fmt::format("{} {} {}", bind, ctx->server_->port(), token);
    }
    // Note [MPI lifetime in the bootstrap]: MPI stays initialised for the
    // life of the Context, not just the broadcast.
    ctx->mpi_hold_ = mpi->hold();
    payload = mpi->broadcast(payload, params.store_timeout);
    auto sp1 = payload.find(' ');
    auto sp2 = payload.find(' ', sp1 + 1);
    TORUS_CHECK(sp1 != std::string::npos && sp2 != std::string::npos, CommError, "malformed store address from rank 0");
    host = payload.substr(0, sp1);
    port = std::stoi(payload.substr(sp1 + 1, sp2 - sp1 - 1));
    token = payload.substr(sp2 + 1);
  } else if (agent_store) {
    // Note [torchrun's agent store] (agent_store.h): rank 0 listens on a port of
    // its own and says where through the agent's store, under a key of this
    // restart attempt.
    const std::string key = agent_store_key(*agent_store);
    auto agent = connect_agent_store(L.master_addr, L.master_port, params.store_timeout);
    AgentStoreRecord record;
    const char* token_via = "TORUS_JOB_TOKEN";
    if (L.rank == 0) {
      record.host = !params.socket_ifname.empty() ? interface_address(params.socket_ifname)
                    : single_host_hint            ? std::string("127.0.0.1")
                                                  : interface_address("");
      const bool generated = token.empty();
      if (generated) token = generate_job_token();
      ctx->server_ = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{record.host, 0, token});
      record.port = ctx->server_->port();
      if (generated && is_loopback(record.host)) {
        // Note [Local job token]: on loopback the token need not leave this user's files.
        ctx->token_file_ =
            std::make_unique<LocalTokenFile>(local_token_path(params.runtime_dir, record.host, record.port));
        ctx->token_file_->publish(token);
        token_via = "a file only this user can read";
      } else if (generated) {
        record.token = token;
        token_via = "the agent's store, with the address";
      }
      agent->set_string(key, encode_agent_store_record(record));
    } else {
      record = decode_agent_store_record(agent->get_string(key, params.store_timeout));
      if (!record.token.empty()) {
        token = record.token;
      } else if (token.empty()) {
        TORUS_CHECK(is_loopback(record.host), InvalidArgument,
                    "rank 0 published its store at {}:{} without a token, so it has TORUS_JOB_TOKEN: set the same "
                    "TORUS_JOB_TOKEN on every rank",
                    record.host, record.port);
        local_token = local_token_path(params.runtime_dir, record.host, record.port);
      }
    }
    host = record.host;
    port = record.port;
    if (L.rank == 0) {
      TORUS_LOG_INFO(
          "store: torchrun's agent serves {}:{}, so Torus's store listens on {}:{}, its address handed "
          "to the ranks through the agent's store ({}), the job token through {}",
          L.master_addr, L.master_port, host, port, key, token_via);
    }
  } else {
    host = L.master_addr;
    port = L.master_port;
    if (token.empty()) {
      TORUS_CHECK(is_loopback(host), InvalidArgument,
                  "the store at {}:{} is reachable from the network, so the job needs a token: set TORUS_JOB_TOKEN "
                  "to the same secret on every rank (e.g. `openssl rand -hex 32`)",
                  host, port);
      if (L.world_size > 1) {
        // Note [Local job token]: the ranks share a generated token through
        // a file only this user can read.
        local_token = local_token_path(params.runtime_dir, numeric_address(host), port);
      } else {
        token = generate_job_token();  // nobody else needs to know it
      }
    }
    if (L.rank == 0) {
      // The directory is checked before the server starts, but the file is
      // written only once the port is ours: a rank 0 that fails to bind
      // (another job holds the port) must not replace that job's token.
      if (local_token) {
        ctx->token_file_ = std::make_unique<LocalTokenFile>(*local_token);
        token = generate_job_token();
      }
      ctx->server_ = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{numeric_address(host), port, token});
      if (local_token) {
        ctx->token_file_->publish(token);
        TORUS_LOG_INFO("no TORUS_JOB_TOKEN: generated a job token for the loopback store and shared it with the "
                       "ranks of this host through {}",
                       local_token->file());
      }
    }
  }
  if (local_token && L.rank != 0) {
    ctx->store_ = connect_with_local_token(TcpStore::Options{host, port, "", params.store_timeout}, *local_token);
  } else {
    ctx->store_ = std::make_shared<TcpStore>(TcpStore::Options{host, port, token, params.store_timeout});
  }

  // --- hosts ------------------------------------------------------------------
  const auto& store = ctx->store_;
  store->set_string(fmt::format("torus/host/{}", L.rank), host_identity());
  std::map<std::string, int> index_of;
  ctx->hosts_.host_of_rank.resize(L.world_size);
  for (int r = 0; r < L.world_size; ++r) {
    std::string h = store->get_string(fmt::format("torus/host/{}", r), params.store_timeout);
    auto [it, added] = index_of.emplace(h, static_cast<int>(ctx->hosts_.hostnames.size()));
    if (added) ctx->hosts_.hostnames.push_back(h);
    ctx->hosts_.host_of_rank[r] = it->second;
  }
  int my_host = ctx->hosts_.host_of_rank[L.rank];
  int local_rank = 0, local_size = 0;
  for (int r = 0; r < L.world_size; ++r) {
    if (ctx->hosts_.host_of_rank[r] != my_host) continue;
    if (r < L.rank) ++local_rank;
    ++local_size;
  }
  if (L.local_size > 0 && L.local_size != local_size) {
    TORUS_LOG_WARN("launcher says local size {}, the host exchange found {} ranks on this host; using the launcher's",
                   L.local_size, local_size);
  }
  if (L.local_rank < 0) L.local_rank = local_rank;
  if (L.local_size < 0) L.local_size = local_size;

  // --- the backends --------------------------------------------------------------
  // The host backend: named by the options or TORUS_BACKEND, else the fastest
  // one that can serve this job, decided by rank 0 for all (Note [Backend
  // registration] in backend_registry.h).
  BackendInit init{&ctx->launch_, &ctx->hosts_, ctx->store_, ctx->timeout_};
  HostBackendChoice backend;
  if (!options.host_backend.empty()) {
    backend = {options.host_backend, "set by InitOptions::host_backend"};
  } else if (!params.host_backend.empty()) {
    backend = {params.host_backend, "set by TORUS_BACKEND"};
  } else {
    backend = agree_host_backend(init, params.store_timeout);
  }

  if (L.rank == 0) {
    TORUS_LOG_INFO("bootstrap: {} ranks from {}, {} host(s), store {}:{}, host backend {} ({}), default timeout {} ms",
                   L.world_size, L.source, ctx->hosts_.num_hosts(), host, port, backend.name, backend.why,
                   ctx->timeout_.count());
    for (const auto& [name, value] : params.describe()) TORUS_LOG_DEBUG("param {} = {}", name, value);
  }
  for (const auto& name : params.unknown) {
    TORUS_LOG_WARN("unknown environment variable {} ignored (typo? see docs/params.md)", name);
  }

  ctx->host_backend_ = create_world_backend(backend.name, init);
  // The device backend: the one registered for this build's accelerator,
  // when the process sees a device of that kind.
  for (const BackendFactory& f : backend_registry().factories()) {
    if (f.role != BackendRole::kDevice || f.memory != device::accelerator_type()) continue;
    const Usability u = f.usability ? f.usability(init) : Usability{};
    if (u.usable) {
      ctx->device_backend_ = f.create(init);
    } else if (L.rank == 0) {
      TORUS_LOG_INFO("no device backend: {}", u.detail);
    }
    break;
  }
  return ctx;
}

std::string_view Context::host_backend_name() const { return host_backend_ ? host_backend_->name() : ""; }

Context::~Context() {
  // Backends go first (they may use the store while shutting down). Rank 0's
  // store server must outlive the other ranks' last requests, failed job or
  // not (a rank that saw a failure may finish before a healthy peer's last
  // split): everyone checks in, and rank 0 waits until every rank has checked
  // in or every other client has gone (a dead rank's socket closes), bounded.
  device_backend_.reset();
  host_backend_.reset();
  if (!store_) {
    mpi_hold_.reset();
    return;
  }
  try {
    store_->add("torus/shutdown", 1);
    const bool failed = failed_.load() || failed_ops_in_process() > failed_ops_at_start_;
    if (server_) {
      // After a failure a peer may be stuck for good: wait less for it.
      auto deadline = std::chrono::steady_clock::now() + (failed ? 10s : 30s);
      while (store_->add("torus/shutdown", 0) < launch_.world_size && server_->stats().clients_connected > 1 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(5ms);
      }
    }
  } catch (const std::exception& e) {
    TORUS_LOG_DEBUG("store check-out at shutdown failed: {}", e.what());
  }
  store_.reset();
  server_.reset();
  token_file_.reset();  // removed with the server: nobody can use the token any more
  mpi_hold_.reset();  // MPI_Finalize (if this was the last holder) runs last
}

}  // namespace torus::comm
