// The tensor-level ProcessGroup on the ofi backend: what torus::init sets up
// there (the shared host allocator) and the zero-copy host path it opens.
// Compiled into builds with the ofi backend only (tests/comm/tests.cmake),
// since it reads the backend's private counter; run by the
// process_group_ofi_np* tests (the others filter it out).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include "comm/ofi/host_collectives.h"
#include "comm/pg_world.h"
#include "torus/comm/shared_host.h"

namespace torus::comm {
namespace {

// On ofi with every rank on this host, torus::init installed the shared
// host allocator: a tensor made the ordinary way is shared host memory, and
// all_reduce, all_gather and reduce_scatter on such tensors take the
// zero-copy path with the results of the closed forms.
TEST(ProcessGroupOnOfi, LargeCpuTensorsTakeTheZeroCopyPath) {
  auto& g = *world();
  ASSERT_EQ(g.host_backend()->name(), "ofi") << "run with TORUS_BACKEND=ofi";
  ASSERT_GE(g.size(), 2);
  ASSERT_EQ(g.context()->hosts().num_hosts(), 1);
  ASSERT_TRUE(shared_host_allocator_installed()) << "torus::init did not install the shared host allocator";
  const int n = g.size(), me = g.rank();
  const int64_t count = 1 << 18;  // 1 MiB of f32
  const uint64_t before = ofi::host_zero_copy_ops();
  at::Tensor x = at::arange(count, at::kFloat) + static_cast<float>(me);
  ASSERT_TRUE(is_shared_host(x.data_ptr(), x.nbytes()));
  g.all_reduce(x)->wait();
  // sum over ranks of (i + r) = n i + n (n - 1) / 2
  at::Tensor want = at::arange(count, at::kFloat) * static_cast<float>(n) + static_cast<float>(n * (n - 1) / 2);
  EXPECT_TRUE(at::equal(x, want)) << "all_reduce";
  at::Tensor mine = at::full({count}, static_cast<float>(me + 1));
  at::Tensor all = at::empty({n * count}, at::kFloat);
  g.all_gather(mine, all)->wait();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(at::equal(all.slice(0, r * count, (r + 1) * count), at::full({count}, static_cast<float>(r + 1))))
        << "all_gather block " << r;
  }
  at::Tensor part = at::empty({count}, at::kFloat);
  g.reduce_scatter(all, part)->wait();
  EXPECT_TRUE(at::equal(part, at::full({count}, static_cast<float>(n * (me + 1))))) << "reduce_scatter";
  EXPECT_EQ(ofi::host_zero_copy_ops() - before, 3u) << "not every op took the zero-copy path";
}

}  // namespace
}  // namespace torus::comm
