// A whole ofi "job" inside one test: a TcpStoreServer in a process of its own
// (Note [Fork with no threads], ofi_test_util.h) and n forked ranks that each build the ofi world backend with a given
// topology (which rank is on which "host") and options, then run a body.
//
// The host map is injected, so hierarchical paths (several hosts, uneven
// hosts) run on one machine: ranks on the same fake host share host
// segments, the others talk through the provider.
#pragma once

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/ofi/ofi_backend.h"
#include "comm/ofi/ofi_options.h"
#include "ofi_test_util.h"
#include "torus/comm/context.h"
#include "torus/comm/store.h"

namespace torus::comm::ofi::test {

struct JobSpec {
  std::vector<int> host_of;  // fake host index per rank; its size is the world size
  OfiOptions options;
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds test_deadline{90000};
  // Runs in the test process on a client of the job's store before the
  // ranks start (e.g. to put the store in a state a test needs).
  std::function<void(Store&)> before;
};

// The spec of n ranks on one host with `provider`; "tcp" stays on loopback.
inline JobSpec one_host(int n, const std::string& provider, bool host_shm = true) {
  JobSpec s;
  s.host_of.assign(static_cast<size_t>(n), 0);
  s.options.provider = provider;
  s.options.host_shm = host_shm;
  return s;
}

using RankBody = std::function<void(Backend& world, int rank)>;

// Runs `body` on every rank of a job; returns the ranks' results.
inline std::vector<RankResult> run_job(const JobSpec& spec, const RankBody& body) {
  ::setenv("FI_TCP_IFACE", "lo", 1);
  const std::string token = generate_job_token();
  StoreServerProcess server(token);  // Note [Fork with no threads]
  const int port = server.port();
  const int n = static_cast<int>(spec.host_of.size());
  if (spec.before) {
    TcpStore::Options co;
    co.host = "127.0.0.1";
    co.port = port;
    co.token = token;
    TcpStore client(co);
    spec.before(client);
  }
  auto results = run_ranks(
      n,
      [&](int rank) {
        TcpStore::Options co;
        co.host = "127.0.0.1";
        co.port = port;
        co.token = token;
        co.connect_timeout = spec.timeout;
        co.request_timeout = spec.timeout;
        auto store = std::make_shared<TcpStore>(co);
        LaunchInfo launch;
        launch.rank = rank;
        launch.world_size = n;
        launch.source = "options";
        HostMap hosts;
        hosts.host_of_rank = spec.host_of;
        int num_hosts = 0;
        for (int h : spec.host_of) num_hosts = std::max(num_hosts, h + 1);
        for (int h = 0; h < num_hosts; ++h) hosts.hostnames.push_back("host" + std::to_string(h));
        BackendInit init;
        init.launch = &launch;
        init.hosts = &hosts;
        init.store = store;
        init.timeout = spec.timeout;
        BackendPtr world = create_world_backend(init, spec.options);
        body(*world, rank);
      },
      spec.test_deadline);
  return results;
}

// Deterministic small-integer contributions, exact in every dtype.
inline double contribution(int rank, size_t i) { return static_cast<double>((i * 5 + static_cast<size_t>(rank) * 3) % 11 + 1); }

inline std::vector<float> filled(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(contribution(rank, i));
  return v;
}

// Checks out[i] == want(i) for all i, naming the first mismatch.
template <typename T, typename Want>
void require_values(const std::vector<T>& out, Want want, const std::string& what, double tol = 0) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::abs(static_cast<double>(out[i]) - want(i)) > tol) {
      if (bad++ == 0) first = i;
    }
  }
  require(bad == 0, what + ": " + std::to_string(bad) + " of " + std::to_string(out.size()) +
                        " wrong; first at " + std::to_string(first) + ": got " +
                        (out.empty() ? "" : std::to_string(static_cast<double>(out[first]))) + ", want " +
                        std::to_string(want(first)));
}

}  // namespace torus::comm::ofi::test
