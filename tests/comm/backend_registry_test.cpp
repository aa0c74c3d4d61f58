// The comm backend registry (Note [Backend registration] in
// src/comm/backend_registry.h) and the default host backend it gives the
// bootstrap. Run under mpirun with 2 ranks: once as is (ofi is the default
// where built), once with a libfabric provider that does not exist
// (TORUS_TEST_OFI_UNUSABLE=1: mpi is the default).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "comm/backend_registry.h"
#include "torus/comm/backends.h"
#include "torus/comm/context.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

bool ofi_unusable_here() {
  const char* v = std::getenv("TORUS_TEST_OFI_UNUSABLE");
  return v != nullptr && std::string(v) == "1";
}

TEST(BackendRegistry, NamesAreUniqueAndHostBackendsAmongThem) {
  const std::vector<std::string> all = registered_backends();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), all.size());
  for (const auto& name : all) EXPECT_TRUE(backend_registered(name)) << name;
  EXPECT_FALSE(backend_registered("no-such-backend"));
  for (const auto& name : Context::available_host_backends()) {
    EXPECT_NE(std::find(all.begin(), all.end(), name), all.end()) << name;
    const BackendFactory* f = backend_registry().find(name);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->memory, DeviceType::kCPU) << name;
  }
  if (backend_registered("nccl")) EXPECT_EQ(backend_registry().find("nccl")->memory, DeviceType::kCUDA);
}

TEST(BackendRegistry, UnknownNameIsUnsupportedNamingTheBuiltOnes) {
  BackendInit init;
  try {
    create_world_backend("no-such-backend", init);
    FAIL() << "an unknown backend was made";
  } catch (const Unsupported& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no-such-backend"), std::string::npos) << m;
    for (const auto& name : registered_backends()) EXPECT_NE(m.find(name), std::string::npos) << m;
  }
}

// A job of two ranks on one host that mpirun did not launch: only ofi can
// serve it.
TEST(DefaultHostBackend, WithoutMpirunOnlyOfiServes) {
  LaunchInfo launch;
  launch.rank = 0;
  launch.world_size = 2;
  HostMap hosts;
  hosts.host_of_rank = {0, 0};
  hosts.hostnames = {"h"};
  BackendInit init{&launch, &hosts, nullptr, Duration(0)};
  if (backend_registered("ofi") && !ofi_unusable_here()) {
    HostBackendChoice c = choose_host_backend(init);
    EXPECT_EQ(c.name, "ofi");
    EXPECT_NE(c.why.find("libfabric provider shm"), std::string::npos) << c.why;
  } else {
    try {
      choose_host_backend(init);
      FAIL() << "a host backend was chosen";
    } catch (const Unsupported& e) {
      if (backend_registered("mpi")) EXPECT_NE(std::string(e.what()).find("not launched by mpirun"), std::string::npos);
    }
  }
}

// The bootstrap under mpirun with no TORUS_BACKEND: ofi where libfabric
// offers a provider, else mpi; every rank makes the same one.
TEST(DefaultHostBackend, TheBootstrapTakesTheFastestUsable) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) GTEST_SKIP() << "needs mpirun";
  if (std::getenv("TORUS_BACKEND") != nullptr) GTEST_SKIP() << "TORUS_BACKEND is set";
  const bool ofi = backend_registered("ofi") && !ofi_unusable_here();
  if (!ofi && !backend_registered("mpi")) GTEST_SKIP() << "neither ofi nor mpi is built in";
  auto ctx = Context::create();
  EXPECT_EQ(ctx->host_backend_name(), ofi ? "ofi" : "mpi");
  // The same choice made locally names the reasons.
  BackendInit init{&ctx->launch(), &ctx->hosts(), ctx->store(), ctx->default_timeout()};
  HostBackendChoice c = choose_host_backend(init);
  EXPECT_EQ(c.name, ctx->host_backend_name());
  const std::string reason = ofi ? (backend_registered("mpi") ? "preferred to mpi" : "default")
                                 : (backend_registered("ofi") ? "ofi unusable" : "default");
  EXPECT_NE(c.why.find(reason), std::string::npos) << c.why;
}

}  // namespace
}  // namespace torus::comm
