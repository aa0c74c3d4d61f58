// Tests of the device layer (torus/device/device.h): the CPU device in every
// build; the CUDA device's behaviour without a GPU (clear errors, count 0);
// and, when a GPU is present, memory, copies, streams, events and the
// thread-local current stream.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "device/gpu_test_util.h"
#include "torus/core/error.h"
#include "torus/device/device.h"

namespace torus::device {
namespace {

TEST(CpuDevice, Basics) {
  Device& d = cpu_device();
  EXPECT_EQ(d.type(), DeviceType::kCPU);
  EXPECT_EQ(d.count(), 1);
  EXPECT_EQ(d.current(), 0);
  EXPECT_EQ(d.properties(0).name, "cpu");
  EXPECT_THROW(d.set_current(1), InvalidArgument);
  EXPECT_EQ(d.allocate(0), nullptr);
  DeviceBuffer b(DeviceType::kCPU, 100);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_EQ(b.size(), 100u);
}

TEST(CpuDevice, CopyFillStreamsAndEvents) {
  Device& d = cpu_device();
  Stream s = d.create_stream();
  ASSERT_TRUE(s.valid());
  EXPECT_TRUE(s.owned());
  DeviceBuffer a(DeviceType::kCPU, 64);
  PinnedBuffer h(DeviceType::kCPU, 64);
  d.fill_async(a.data(), 7, 64, s);
  d.copy_async(h.data(), a.data(), 64, s);
  Event start = d.create_event({.timing = true});
  Event end = d.create_event({.timing = true});
  start.record(s);
  end.record(s);
  s.wait(end);
  s.synchronize();
  EXPECT_TRUE(s.query());
  EXPECT_TRUE(end.query());
  EXPECT_GE(end.elapsed_ms(start), 0.0f);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(h.as<unsigned char>()[i], 7);
  Event plain = d.create_event();
  plain.record(s);
  EXPECT_THROW(plain.elapsed_ms(start), Error);
}

TEST(CpuDevice, HandlesMoveAndInvalidUse) {
  Stream s = cpu_device().create_stream();
  Stream t = std::move(s);
  EXPECT_FALSE(s.valid());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_TRUE(t.valid());
  Stream v = t.view();
  EXPECT_FALSE(v.owned());
  EXPECT_EQ(v.native_handle(), t.native_handle());
  EXPECT_THROW(Stream().synchronize(), InvalidArgument);
  EXPECT_THROW(Event().query(), InvalidArgument);
  DeviceBuffer b(DeviceType::kCPU, 8);
  DeviceBuffer c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_NE(c.data(), nullptr);
}

// DeviceBuffer and PinnedBuffer are one mechanism: each owns its kind of
// memory, moves it, and gives it back on reset.
TEST(CpuDevice, PinnedBufferMovesAndResets) {
  PinnedBuffer a(DeviceType::kCPU, 48);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 48u);
  void* p = a.data();
  PinnedBuffer b;
  b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.size(), 0u);       // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.as<char>(), static_cast<char*>(p));
  b.reset();
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(DeviceBuffer(DeviceType::kCPU, 0).data(), nullptr);
  EXPECT_THROW(PinnedBuffer(DeviceType::kNeuron, 8), Unsupported);
}

TEST(DeviceRegistry, BuiltTypes) {
  EXPECT_EQ(&get_device(DeviceType::kCPU), &cpu_device());
  EXPECT_THROW(get_device(DeviceType::kNeuron), Unsupported);
  EXPECT_TRUE(current_stream(DeviceType::kCPU).valid());
  EXPECT_TRUE(registered(DeviceType::kCPU));
  EXPECT_FALSE(registered(DeviceType::kNeuron));
  ASSERT_FALSE(registered_kinds().empty());
  EXPECT_EQ(registered_kinds().front(), DeviceType::kCPU);
  if (registered(DeviceType::kCUDA)) {
    ASSERT_NE(accelerator(), nullptr);
    EXPECT_EQ(accelerator_type(), DeviceType::kCUDA);
    EXPECT_EQ(&get_device(DeviceType::kCUDA), accelerator());
    EXPECT_EQ(registered_kinds(), (std::vector<DeviceType>{DeviceType::kCPU, DeviceType::kCUDA}));
  } else {
    EXPECT_EQ(accelerator(), nullptr);
    EXPECT_EQ(accelerator_type(), DeviceType::kCPU);
    EXPECT_THROW(get_device(DeviceType::kCUDA), Unsupported);
    EXPECT_THROW(select_device_for_local_rank(0, 1), Unsupported);
    EXPECT_EQ(registered_kinds(), (std::vector<DeviceType>{DeviceType::kCPU}));
  }
}

// The CUDA tests skip, saying so, in a build without the CUDA device kind.
#define TORUS_REQUIRE_CUDA_KIND() \
  if (!registered(DeviceType::kCUDA)) GTEST_SKIP() << "the CUDA device kind is not built into this Torus"

// Runs everywhere: without a GPU the CUDA device reports 0 devices and every
// operation that needs one fails with a clear torus::Error.
TEST(CudaDevice, WithoutAGpuFailsClearly) {
  TORUS_REQUIRE_CUDA_KIND();
  Device& d = get_device(DeviceType::kCUDA);
  if (d.count() > 0) GTEST_SKIP() << "a GPU is present: " << d.describe();
  EXPECT_NE(d.describe().find("no CUDA device"), std::string::npos) << d.describe();
  try {
    (void)d.allocate(16);
    FAIL() << "allocate without a device must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA error"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_device_for_local_rank(0, 1), Error);
  EXPECT_THROW(select_device_for_local_rank(2, 1), InvalidArgument);
}

class CudaDeviceGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    TORUS_REQUIRE_CUDA_KIND();
    TORUS_REQUIRE_ACCELERATOR();
  }
  Device& d() { return get_device(DeviceType::kCUDA); }
};

TEST_F(CudaDeviceGpu, Properties) {
  int n = d().count();
  ASSERT_GT(n, 0);
  DeviceProperties p = d().properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.total_memory, 0u);
  EXPECT_GE(p.compute_major, 7);
  EXPECT_GT(p.multiprocessors, 0);
  EXPECT_GT(p.peak_memory_bandwidth, 1e11) << "peak bandwidth from clock and bus width";
  EXPECT_EQ(select_device_for_local_rank(0, 1), 0);
  EXPECT_EQ(d().current(), 0);
}

TEST_F(CudaDeviceGpu, CopiesRoundTrip) {
  constexpr size_t kN = 1 << 20;
  std::vector<uint32_t> src(kN);
  for (size_t i = 0; i < kN; ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  DeviceBuffer dev(DeviceType::kCUDA, kN * 4);
  PinnedBuffer pinned(DeviceType::kCUDA, kN * 4);
  std::vector<uint32_t> back(kN);
  d().copy(dev.data(), src.data(), kN * 4);             // pageable -> device
  Stream s = d().create_stream();
  d().copy_async(pinned.data(), dev.data(), kN * 4, s);  // device -> pinned
  s.synchronize();
  EXPECT_EQ(std::memcmp(pinned.data(), src.data(), kN * 4), 0);
  d().fill_async(dev.data(), 0xab, kN * 4, s);
  d().copy_async(back.data(), dev.data(), kN * 4, s);  // device -> pageable
  s.synchronize();
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(back[i], 0xababababu) << i;
}

// Work on stream b ordered after work on stream a through an event only.
TEST_F(CudaDeviceGpu, EventOrdersTwoStreams) {
  constexpr size_t kBytes = size_t{256} << 20;  // long enough that an unordered copy would race
  DeviceBuffer big(DeviceType::kCUDA, kBytes);
  DeviceBuffer other(DeviceType::kCUDA, kBytes);
  PinnedBuffer tail(DeviceType::kCUDA, 4096);
  Stream a = d().create_stream();
  Stream b = d().create_stream({.high_priority = true});
  Event done = d().create_event();
  Event start = d().create_event({.timing = true});
  Event end = d().create_event({.timing = true});
  for (int round = 0; round < 3; ++round) {
    unsigned char v = static_cast<unsigned char>(0x10 + round);
    start.record(a);
    d().fill_async(other.data(), 0, kBytes, a);  // delay a
    d().fill_async(big.data(), v, kBytes, a);
    end.record(a);
    done.record(a);
    b.wait(done);
    d().copy_async(tail.data(), static_cast<char*>(big.data()) + kBytes - 4096, 4096, b);
    b.synchronize();
    for (int i = 0; i < 4096; ++i) ASSERT_EQ(tail.as<unsigned char>()[i], v) << "round " << round << " byte " << i;
    EXPECT_TRUE(done.query());
    EXPECT_GT(end.elapsed_ms(start), 0.0f);
  }
}

TEST_F(CudaDeviceGpu, CurrentStreamIsThreadLocalAndNests) {
  Stream s1 = d().create_stream();
  Stream s2 = d().create_stream();
  EXPECT_EQ(current_stream(DeviceType::kCUDA).native_handle(), nullptr);  // the default stream
  {
    StreamGuard g1(s1);
    EXPECT_EQ(current_stream(DeviceType::kCUDA).native_handle(), s1.native_handle());
    {
      StreamGuard g2(s2);
      EXPECT_EQ(current_stream(DeviceType::kCUDA, 0).native_handle(), s2.native_handle());
      void* seen = reinterpret_cast<void*>(1);
      std::thread([&] { seen = current_stream(DeviceType::kCUDA, 0).native_handle(); }).join();
      EXPECT_EQ(seen, nullptr) << "another thread must see its own (default) stream";
    }
    EXPECT_EQ(current_stream(DeviceType::kCUDA).native_handle(), s1.native_handle());
  }
  EXPECT_EQ(current_stream(DeviceType::kCUDA).native_handle(), nullptr);
}

}  // namespace
}  // namespace torus::device
