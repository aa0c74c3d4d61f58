// The Neuron device (src/device/neuron) against the fake runtime
// (fake_nrt.cpp), one process. tests.cmake runs this binary once per runtime
// configuration, each run selecting that configuration's test suite with
// --gtest_filter:
//   NeuronDevice              the fake is loaded: memory, copies, fills, the cache, events
//   NeuronDeviceVisibleCores  NEURON_RT_VISIBLE_CORES=1-2: two cores visible
//   NeuronDeviceOutOfMemory   4 MiB per core: the cache is released and the allocation retried
//   NeuronDeviceAllocFail     the runtime fails every allocation after the second
//   NeuronDeviceAbsent        no library: zero devices, clear errors, never a crash
//   NeuronDeviceOldRuntime    a 1.x runtime: refused with the version named
//   NeuronDevicePartial       a library without the tensor calls: refused, naming them
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "torus/core/error.h"
#include "torus/device/device.h"
#include "torus/device/neuron.h"

namespace torus::device {
namespace {

Device& neuron() { return get_device(DeviceType::kNeuron); }

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(NeuronDeviceBuild, IsTheAcceleratorOfThisBuild) {
  EXPECT_EQ(accelerator_type(), DeviceType::kNeuron);
  ASSERT_NE(accelerator(), nullptr);
  EXPECT_EQ(&neuron(), accelerator());
  neuron::RuntimeInfo info = neuron::runtime_info();
  EXPECT_TRUE(info.built);
}

TEST(NeuronDevice, LoadsTheRuntimeAndCountsVisibleCores) {
  neuron::RuntimeInfo info = neuron::runtime_info();
  ASSERT_TRUE(info.available) << info.reason;
  EXPECT_EQ(info.version, "2.99.0.0");
  EXPECT_EQ(info.major, 2u);
  EXPECT_EQ(info.visible_cores, 4);
  EXPECT_EQ(info.total_cores, 4);
  EXPECT_TRUE(info.programs);
  EXPECT_EQ(neuron().count(), 4);
  EXPECT_NE(neuron().describe().find("4 of 4 NeuronCore(s) visible (Neuron runtime 2.99.0.0"), std::string::npos)
      << neuron().describe();
  EXPECT_NE(neuron().properties(3).name.find("NeuronCore 3"), std::string::npos);
  EXPECT_THROW(neuron().properties(4), InvalidArgument);
}

TEST(NeuronDevice, CopiesRoundTripThroughDeviceMemoryAtAnyOffset) {
  const size_t n = 3000;  // not a multiple of the allocator's rounding
  DeviceBuffer a(DeviceType::kNeuron, n * sizeof(float));
  DeviceBuffer b(DeviceType::kNeuron, n * sizeof(float));
  std::vector<float> host = iota_floats(n, 1);
  neuron().copy(a.data(), host.data(), n * sizeof(float));                  // host -> device
  neuron().copy(b.data(), a.data(), n * sizeof(float));                     // device -> device
  // An interior pointer: elements [100, 1100) of b over elements [0, 1000) of a.
  neuron().copy(b.as<float>() + 100, a.data(), 1000 * sizeof(float));
  std::vector<float> back(n, -1);
  Stream s = neuron().create_stream();
  neuron().copy_async(back.data(), b.data(), n * sizeof(float), s);         // device -> host
  s.synchronize();
  for (size_t i = 0; i < n; ++i) {
    float want = (i >= 100 && i < 1100) ? static_cast<float>(i - 100 + 1) : static_cast<float>(i + 1);
    ASSERT_EQ(back[i], want) << "element " << i;
  }
  // Reading an interior range back.
  std::vector<float> mid(10, -1);
  neuron().copy(mid.data(), a.as<float>() + 2990, 10 * sizeof(float));
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(mid[i], static_cast<float>(2991 + i));
}

TEST(NeuronDevice, FillsDeviceMemory) {
  // Runs with and without the runtime's nrt_tensor_memset (tests.cmake);
  // 3 MiB spans several chunks of the fallback's host buffer.
  const size_t bytes = (size_t{3} << 20) + 5;
  DeviceBuffer a(DeviceType::kNeuron, bytes);
  neuron().fill_async(a.data(), 0, bytes, neuron().default_stream(0));
  neuron().fill_async(a.as<unsigned char>() + 7, 0x3C, bytes - 8, neuron().default_stream(0));
  std::vector<unsigned char> back(bytes, 1);
  neuron().copy(back.data(), a.data(), bytes);
  for (size_t i = 0; i < bytes; ++i) {
    unsigned char want = (i >= 7 && i < bytes - 1) ? 0x3C : 0;
    ASSERT_EQ(back[i], want) << "byte " << i;
  }
}

TEST(NeuronDevice, RefusesAccessOutsideAnAllocation) {
  DeviceBuffer a(DeviceType::kNeuron, 1000);
  std::vector<char> host(2000);
  // Past the end of the request (the block is rounded up to 1024 bytes; the
  // bound is the request).
  EXPECT_THROW(neuron().copy(host.data(), a.data(), 1001), InvalidArgument);
  EXPECT_THROW(neuron().copy(a.as<char>() + 500, host.data(), 501), InvalidArgument);
  EXPECT_NO_THROW(neuron().copy(a.as<char>() + 500, host.data(), 500));
  void* stale = a.data();
  a.reset();
  try {
    neuron().copy(host.data(), stale, 10);
    ADD_FAILURE() << "a copy from freed device memory was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not allocated"), std::string::npos) << e.what();
  }
}

TEST(NeuronDevice, DeviceAddressesAreNotHostMemory) {
  DeviceBuffer a(DeviceType::kNeuron, 64);
  char* p = a.as<char>();
  EXPECT_DEATH({ volatile char c = *p; (void)c; }, "");
}

// What a network adapter registers (the ofi backend's Neuron buffers): the
// runtime's address of the allocation plus the offset, on the allocation's
// core; ranges outside a live allocation and host memory are refused.
TEST(NeuronDevice, NicAddressesOfAllocations) {
  neuron().set_current(1);
  DeviceBuffer a(DeviceType::kNeuron, 4096);
  char* p = a.as<char>();
  NicAddress whole = neuron().nic_address(p, 4096);
  NicAddress part = neuron().nic_address(p + 100, 200);
  ASSERT_NE(whole.address, nullptr);
  EXPECT_EQ(static_cast<char*>(part.address) - static_cast<char*>(whole.address), 100);
  EXPECT_EQ(whole.device, 1);
  EXPECT_EQ(part.device, 1);
  EXPECT_THROW(neuron().nic_address(p + 4000, 200), InvalidArgument);  // runs past the allocation
  std::vector<char> host(64);
  EXPECT_THROW(neuron().nic_address(host.data(), 64), InvalidArgument);
  neuron().set_current(0);
}

TEST(NeuronDevice, CachingAllocatorReusesFreedBlocksAndCounts) {
  neuron::empty_cache();
  neuron::AllocatorStats s0 = neuron::allocator_stats();
  void* p = neuron().allocate(1000);
  neuron::AllocatorStats s1 = neuron::allocator_stats();
  EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, 1024u);  // 512-byte rounding
  EXPECT_EQ(s1.requested_bytes - s0.requested_bytes, 1000u);
  EXPECT_EQ(s1.runtime_allocations - s0.runtime_allocations, 1u);
  neuron().deallocate(p);
  void* q = neuron().allocate(900);  // same rounded size: served from the cache
  neuron::AllocatorStats s2 = neuron::allocator_stats();
  EXPECT_EQ(q, p);
  EXPECT_EQ(s2.cache_hits - s1.cache_hits, 1u);
  EXPECT_EQ(s2.runtime_allocations, s1.runtime_allocations);
  EXPECT_EQ(s2.reserved_bytes, s1.reserved_bytes);
  void* big = neuron().allocate(size_t{5} << 20);  // 2 MiB rounding: 6 MiB
  neuron::AllocatorStats s3 = neuron::allocator_stats();
  EXPECT_EQ(s3.allocated_bytes - s2.allocated_bytes, size_t{6} << 20);
  EXPECT_GE(s3.peak_allocated_bytes, s3.allocated_bytes);
  neuron().deallocate(big);
  neuron().deallocate(q);
  neuron::AllocatorStats s4 = neuron::allocator_stats();
  EXPECT_EQ(s4.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s4.reserved_bytes - s0.reserved_bytes, 1024u + (size_t{6} << 20));  // cached, not freed
  neuron::empty_cache();
  neuron::AllocatorStats s5 = neuron::allocator_stats();
  EXPECT_EQ(s5.reserved_bytes, s5.allocated_bytes);
  EXPECT_EQ(s5.runtime_frees - s4.runtime_frees, 2u);
  neuron::reset_peak_stats();
  EXPECT_EQ(neuron::allocator_stats().peak_allocated_bytes, s5.allocated_bytes);
}

TEST(NeuronDevice, AllocatesOnTheCurrentCore) {
  neuron().set_current(3);
  DeviceBuffer a(DeviceType::kNeuron, 128);
  std::vector<int> host(32, 7), back(32, 0);
  neuron().copy(a.data(), host.data(), 128);
  neuron().copy(back.data(), a.data(), 128);
  EXPECT_EQ(back, host);
  EXPECT_EQ(neuron().current(), 3);
  neuron().set_current(0);
  EXPECT_THROW(neuron().set_current(4), InvalidArgument);
  EXPECT_THROW(neuron().set_current(-1), InvalidArgument);
}

TEST(NeuronDevice, StreamsAndEventsAreCompleteAndTimed) {
  Stream s = neuron().create_stream({.high_priority = true});
  Event start = neuron().create_event({.timing = true});
  Event end = neuron().create_event({.timing = true});
  start.record(s);
  DeviceBuffer a(DeviceType::kNeuron, 1 << 16);
  neuron().fill_async(a.data(), 1, 1 << 16, s);
  end.record(s);
  EXPECT_TRUE(s.query());
  EXPECT_TRUE(end.query());
  end.synchronize();
  EXPECT_GE(end.elapsed_ms(start), 0.0f);
  Event untimed = neuron().create_event();
  untimed.record(s);
  EXPECT_THROW(untimed.elapsed_ms(start), Error);
  s.wait(end);
  neuron().synchronize();
}

TEST(NeuronDevice, SelectsACoreForEachLocalRank) {
  EXPECT_EQ(select_device_for_local_rank(5, 8), 1);
  EXPECT_EQ(neuron().current(), 1);
  neuron().set_current(0);
}

TEST(NeuronDeviceVisibleCores, RespectsVisibleCores) {
  EXPECT_EQ(neuron().count(), 2);
  EXPECT_EQ(neuron::runtime_info().visible_cores, 2);
  EXPECT_EQ(neuron::runtime_info().total_cores, 4);
  neuron().set_current(1);
  DeviceBuffer a(DeviceType::kNeuron, 64);
  EXPECT_THROW(neuron().set_current(2), InvalidArgument);
  neuron().set_current(0);
}

TEST(NeuronDeviceOutOfMemory, ReleasesTheCacheWhenTheRuntimeIsOutOfMemory) {
  void* a = neuron().allocate(size_t{3} << 20);  // a 4 MiB block: the whole core
  neuron().deallocate(a);                         // cached
  void* b = neuron().allocate(size_t{1} << 20);   // 2 MiB: fails, cache released, retried
  neuron::AllocatorStats s = neuron::allocator_stats();
  EXPECT_EQ(s.reserved_bytes, size_t{2} << 20);
  EXPECT_EQ(s.runtime_frees, 1u);
  try {
    neuron().allocate(size_t{4} << 20);
    ADD_FAILURE() << "an allocation past the core's memory succeeded";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("nrt_tensor_allocate of 4194304 bytes on NeuronCore 0 failed: NRT_RESOURCE"), std::string::npos)
        << m;
    EXPECT_NE(m.find("allocated 2097152 bytes"), std::string::npos) << m;
  }
  EXPECT_EQ(neuron::allocator_stats().failed_allocations, 1u);
  neuron().deallocate(b);
}

TEST(NeuronDeviceAllocFail, AFailingRuntimeAllocationIsAClearError) {
  DeviceBuffer a(DeviceType::kNeuron, 100), b(DeviceType::kNeuron, 5000);
  try {
    DeviceBuffer c(DeviceType::kNeuron, 100000);
    ADD_FAILURE() << "the third allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NRT_RESOURCE"), std::string::npos) << e.what();
  }
  // Freed blocks are still served from the cache.
  b.reset();
  EXPECT_NO_THROW(DeviceBuffer(DeviceType::kNeuron, 4990));  // the same 5120-byte class
  EXPECT_EQ(neuron::allocator_stats().failed_allocations, 1u);
}

TEST(NeuronDeviceAbsent, WithoutTheRuntimeThereAreNoDevicesAndClearErrors) {
  EXPECT_EQ(neuron().count(), 0);
  neuron::RuntimeInfo info = neuron::runtime_info();
  EXPECT_FALSE(info.available);
  EXPECT_NE(info.reason.find("could not be loaded"), std::string::npos) << info.reason;
  EXPECT_NE(neuron().describe().find("no Neuron device"), std::string::npos) << neuron().describe();
  try {
    DeviceBuffer a(DeviceType::kNeuron, 64);
    ADD_FAILURE() << "a Neuron allocation succeeded without a runtime";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs the Neuron runtime"), std::string::npos) << e.what();
  }
  EXPECT_THROW(neuron().set_current(0), InvalidArgument);
  EXPECT_THROW(select_device_for_local_rank(0, 1), Error);
  EXPECT_THROW(neuron::allocator_stats(), Error);
}

TEST(NeuronDevicePartial, RefusesALibraryThatLacksTheApi) {
  EXPECT_EQ(neuron().count(), 0);
  std::string reason = neuron::runtime_info().reason;
  EXPECT_NE(reason.find("is not a usable Neuron runtime: it lacks nrt_close, nrt_get_total_nc_count"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("nrt_tensor_allocate"), std::string::npos) << reason;
  EXPECT_THROW(DeviceBuffer(DeviceType::kNeuron, 8), Error);
}

TEST(NeuronDeviceOldRuntime, RefusesAnOldRuntime) {
  EXPECT_EQ(neuron().count(), 0);
  std::string reason = neuron::runtime_info().reason;
  EXPECT_NE(reason.find("is Neuron runtime 1.5.0.0; Torus needs 2.x or later"), std::string::npos) << reason;
}

}  // namespace
}  // namespace torus::device
