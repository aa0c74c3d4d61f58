// The ofi backend over injected topologies: every collective, checked
// against closed forms, on one host (host segment; flat provider algorithms
// over shm and tcp with small pipeline chunks) and on several fake hosts
// (hierarchical compositions, uneven hosts, interleaved ranks), and the
// segment's non-temporal output path on odd sizes. The
// conformance suite (tests/backend) covers the full dtype/op matrix on one
// host; this file covers the paths it cannot reach.
#include <gtest/gtest.h>

#include "collective_checks.h"

namespace torus::comm::ofi::test {
namespace {

struct Layout {
  std::string name;
  std::vector<int> host_of;
  std::string provider;
  bool host_shm;
  size_t chunk_bytes;    // provider pipeline chunk
  size_t shm_chunk;      // segment stripe
  size_t rd_max = 1024;  // small messages through recursive doubling, large ones through the ring
  size_t shm_nt = size_t{16} << 20;  // segment ops this large write with non-temporal stores
};

class Topologies : public testing::TestWithParam<Layout> {};

TEST_P(Topologies, EveryCollectiveIsCorrect) {
  const Layout& l = GetParam();
  JobSpec spec;
  spec.host_of = l.host_of;
  spec.options.provider = l.provider;
  spec.options.host_shm = l.host_shm;
  spec.options.chunk_bytes = l.chunk_bytes;
  spec.options.shm_chunk_bytes = l.shm_chunk;
  spec.options.rd_max_bytes = l.rd_max;
  spec.options.shm_nt_bytes = l.shm_nt;
  spec.options.tree_max_bytes = 1024;  // trees for small broadcasts/reduces, chains and rings above
  expect_all_ok(run_job(spec, check_everything));
}

INSTANTIATE_TEST_SUITE_P(
    Ofi, Topologies,
    testing::Values(Layout{"one_host_segment_3", {0, 0, 0}, "shm", true, 64 << 10, 4096},
                    // Non-temporal stores from 4 KiB on: odd sizes, unaligned heads and tails.
                    Layout{"one_host_segment_nt_3", {0, 0, 0}, "shm", true, 64 << 10, 4096, 1024, 4096},
                    Layout{"one_host_shm_flat_3", {0, 0, 0}, "shm", false, 8192, 4096},
                    Layout{"one_host_tcp_flat_4", {0, 0, 0, 0}, "tcp", false, 16384, 4096},
                    Layout{"one_host_tcp_rd_5", {0, 0, 0, 0, 0}, "tcp", false, 16384, 4096, size_t{1} << 20},
                    Layout{"two_hosts_uniform", {0, 0, 1, 1}, "tcp", true, 16384, 4096},
                    Layout{"two_hosts_uneven", {0, 0, 0, 1}, "tcp", true, 16384, 4096},
                    Layout{"two_hosts_interleaved", {0, 1, 0, 1}, "tcp", true, 16384, 4096},
                    Layout{"three_hosts", {0, 1, 1, 2}, "tcp", true, 16384, 4096}),
    [](const testing::TestParamInfo<Layout>& i) { return i.param.name; });

}  // namespace
}  // namespace torus::comm::ofi::test
