// One rank of a multi-host check of the ofi backend, started by
// scripts/netns_hosts.sh (or any launcher that sets the TORUS_* bootstrap
// variables): boots through the real Context (store, host exchange), checks
// that the expected number of hosts was found, and runs every collective
// (collective_checks.h) on the world and on split groups.
//
// Environment: the bootstrap's (TORUS_RANK, TORUS_WORLD_SIZE,
// TORUS_MASTER_ADDR, TORUS_MASTER_PORT, TORUS_JOB_TOKEN, TORUS_BACKEND=ofi,
// FI_PROVIDER, FI_TCP_IFACE) plus NETNS_EXPECT_HOSTS (optional).
// Exit status 0 when every check passed; messages go to stderr.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "collective_checks.h"
#include "torus/comm/context.h"

int main() {
  using namespace torus::comm;
  try {
    auto ctx = Context::create();
    Backend& world = *ctx->host_backend();
    if (world.name() != "ofi") throw std::runtime_error("the host backend is not ofi (set TORUS_BACKEND=ofi)");
    if (const char* want = std::getenv("NETNS_EXPECT_HOSTS")) {
      int hosts = ctx->hosts().num_hosts();
      if (hosts != std::atoi(want)) {
        throw std::runtime_error("the bootstrap found " + std::to_string(hosts) + " hosts, expected " + want);
      }
    }
    ofi::test::check_everything(world, world.rank());
    world.barrier(ofi::test::kT)->wait();
    std::fprintf(stderr, "hosts_check: rank %d/%d on host %d of %d: all collectives correct\n", world.rank(),
                 world.size(), ctx->hosts().host_of_rank[static_cast<size_t>(world.rank())], ctx->hosts().num_hosts());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hosts_check: FAILED: %s\n", e.what());
    return 1;
  }
}
