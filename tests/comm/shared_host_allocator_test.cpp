// LibTorch's CPU allocator replaced by the shared host allocator (Note
// [Shared host allocator] in torus/comm/shared_host.h), in one process:
// large tensors land in the pool and small ones do not; both free through
// the one deleter, also by the raw interface; tensor code (math, clone,
// resize) is unchanged; the policy variable is parsed strictly.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "torus/comm/shared_host.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

constexpr size_t kMin = size_t{64} << 10;

void install_once() {
  SharedHostAllocatorOptions o;
  o.min_bytes = kMin;
  ASSERT_TRUE(install_shared_host_allocator(o));
  ASSERT_TRUE(shared_host_allocator_installed());
}

bool data_is_shared(const at::Tensor& t) { return is_shared_host(t.data_ptr(), t.nbytes()); }

TEST(SharedHostAllocator, LargeTensorsAreSharedAndSmallOnesAreNot) {
  install_once();
  const SharedHostPoolStats s0 = shared_host_pool_stats();
  {
    at::Tensor big = at::empty({static_cast<int64_t>(kMin / 4)}, at::kFloat);  // exactly min_bytes
    at::Tensor small = at::empty({static_cast<int64_t>(kMin / 4) - 1}, at::kFloat);
    EXPECT_TRUE(data_is_shared(big));
    EXPECT_FALSE(data_is_shared(small));
    EXPECT_EQ(shared_host_pool_stats().live_blocks, s0.live_blocks + 1);
    // Math over pool memory: the closed form of 0 + 1 + ... + (n - 1).
    const int64_t n = 1 << 20;
    at::Tensor r = at::arange(n, at::kDouble);
    EXPECT_TRUE(data_is_shared(r));
    EXPECT_EQ(r.sum().item<double>(), static_cast<double>(n) * (n - 1) / 2);
    at::Tensor c = r.clone();
    EXPECT_TRUE(data_is_shared(c));
    EXPECT_NE(c.data_ptr(), r.data_ptr());
    EXPECT_TRUE(at::equal(c, r));
  }
  const SharedHostPoolStats s1 = shared_host_pool_stats();
  EXPECT_EQ(s1.live_blocks, s0.live_blocks) << "a tensor's block outlived it";
  EXPECT_EQ(s1.live_bytes, s0.live_bytes);
}

// A tensor grown past min_bytes moves into the pool with its contents.
TEST(SharedHostAllocator, ResizeKeepsTheContents) {
  install_once();
  at::Tensor t = at::arange(100, at::kFloat);
  EXPECT_FALSE(data_is_shared(t));
  t.resize_({1 << 18});
  EXPECT_TRUE(data_is_shared(t));
  at::Tensor head = t.slice(0, 0, 100);
  EXPECT_TRUE(at::equal(head, at::arange(100, at::kFloat)));
}

// The raw interface: both sizes come back through raw_deleter.
TEST(SharedHostAllocator, RawInterfaceFreesBothKinds) {
  install_once();
  c10::Allocator* a = c10::GetCPUAllocator();
  ASSERT_NE(a->raw_deleter(), nullptr);
  const SharedHostPoolStats s0 = shared_host_pool_stats();
  void* big = a->raw_allocate(kMin * 2);
  void* small = a->raw_allocate(100);
  EXPECT_TRUE(is_shared_host(big, kMin * 2));
  EXPECT_FALSE(is_shared_host(small, 100));
  a->raw_deallocate(big);
  a->raw_deallocate(small);
  EXPECT_EQ(shared_host_pool_stats().live_blocks, s0.live_blocks);
  // A second install changes nothing and still reports it installed.
  EXPECT_TRUE(install_shared_host_allocator());
  EXPECT_EQ(c10::GetCPUAllocator(), a);
}

// The variables are parsed by EnvParams (src/core/params.cpp); the options
// structs take them from there.
TEST(SharedHostAllocator, PolicyVariableIsParsedStrictly) {
  ::unsetenv("TORUS_SHARED_HOST_ALLOC");
  EXPECT_EQ(EnvParams::from_env().shared_host.alloc, SharedHostAllocPolicy::kAuto);
  ::setenv("TORUS_SHARED_HOST_ALLOC", "off", 1);
  EXPECT_EQ(EnvParams::from_env().shared_host.alloc, SharedHostAllocPolicy::kOff);
  ::setenv("TORUS_SHARED_HOST_ALLOC", "on", 1);
  EXPECT_EQ(EnvParams::from_env().shared_host.alloc, SharedHostAllocPolicy::kOn);
  ::setenv("TORUS_SHARED_HOST_ALLOC", "yes please", 1);
  EXPECT_THROW(EnvParams::from_env(), InvalidArgument);
  ::unsetenv("TORUS_SHARED_HOST_ALLOC");
  ::setenv("TORUS_SHARED_HOST_SLAB_BYTES", "4096", 1);
  EXPECT_THROW(SharedHostPoolOptions::from_params(EnvParams::from_env()), InvalidArgument);
  ::setenv("TORUS_SHARED_HOST_SLAB_BYTES", "8388608", 1);
  ::setenv("TORUS_SHARED_HOST_FORK", "copy", 1);
  SharedHostPoolOptions pool = SharedHostPoolOptions::from_params(EnvParams::from_env());
  EXPECT_EQ(pool.slab_bytes, size_t{8} << 20);
  EXPECT_EQ(pool.cache_bytes, SharedHostPoolOptions{}.cache_bytes);
  EXPECT_TRUE(pool.fork_copy);
  ::unsetenv("TORUS_SHARED_HOST_SLAB_BYTES");
  ::unsetenv("TORUS_SHARED_HOST_FORK");
  ::setenv("TORUS_SHARED_HOST_ALLOC_MIN_BYTES", "0", 1);
  EXPECT_THROW(SharedHostAllocatorOptions::from_params(EnvParams::from_env()), InvalidArgument);
  ::unsetenv("TORUS_SHARED_HOST_ALLOC_MIN_BYTES");
}

}  // namespace
}  // namespace torus::comm
