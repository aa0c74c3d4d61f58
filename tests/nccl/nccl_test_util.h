// Test helpers for the nccl backend: ranks as threads of one process (one
// GPU each, as many as are visible, capped by TORUS_TEST_NCCL_RANKS), typed
// host <-> device buffers, and dtype-aware encoding of small integers.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_backend.h"
#include "kernels/ref/half.h"
#include "nccl/memory_store.h"
#include "torus/device/device.h"

namespace torus::testing {

inline device::Device& cuda() { return device::get_device(DeviceType::kCUDA); }

inline int nccl_test_ranks() {
  int n = cuda().count();
  if (const char* cap = std::getenv("TORUS_TEST_NCCL_RANKS")) n = std::min(n, std::max(1, std::atoi(cap)));
  return n;
}

// Runs fn(rank) on n threads, rank r on CUDA device r; reports every
// exception as a test failure naming the rank.
inline void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda().set_current(r);
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[static_cast<size_t>(r)]) continue;
    try {
      std::rethrow_exception(errors[static_cast<size_t>(r)]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

using Backends = std::vector<std::shared_ptr<comm::NcclBackend>>;

inline Backends make_world(int n, const std::string& prefix, std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  auto store = std::make_shared<MemoryStore>();
  Backends b(static_cast<size_t>(n));
  on_ranks(n, [&](int r) {
    comm::NcclInit init;
    init.store = store;
    init.store_prefix = prefix;
    init.rank = r;
    init.size = n;
    init.device = r;
    init.timeout = timeout;
    b[static_cast<size_t>(r)] = comm::create_nccl_backend(init);
  });
  return b;
}

// Destroys the backends concurrently (finalising a communicator may need its
// peers to finalise too).
inline void destroy_world(Backends& b) {
  on_ranks(static_cast<int>(b.size()), [&](int r) { b[static_cast<size_t>(r)].reset(); });
}

// Small integers as `t` (exact in every dtype while |v| < 256).
inline std::vector<uint8_t> encode(const std::vector<double>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    uint8_t* p = out.data() + i * dtype_size(t);
    switch (t) {
      case DType::kF32: { float x = static_cast<float>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::kF64: std::memcpy(p, &v[i], 8); break;
      case DType::kF16: { uint16_t h = kernels::ref::f32_to_f16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::kBF16: { uint16_t h = kernels::ref::f32_to_bf16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::kI32: { auto x = static_cast<int32_t>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::kI64: { auto x = static_cast<int64_t>(v[i]); std::memcpy(p, &x, 8); break; }
      case DType::kU8: *p = static_cast<uint8_t>(static_cast<int64_t>(v[i])); break;
    }
  }
  return out;
}

inline std::vector<double> decode(const std::vector<uint8_t>& b, DType t) {
  std::vector<double> out(b.size() / dtype_size(t));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = b.data() + i * dtype_size(t);
    switch (t) {
      case DType::kF32: { float x; std::memcpy(&x, p, 4); out[i] = x; break; }
      case DType::kF64: std::memcpy(&out[i], p, 8); break;
      case DType::kF16: { uint16_t h; std::memcpy(&h, p, 2); out[i] = kernels::ref::f16_to_f32(h); break; }
      case DType::kBF16: { uint16_t h; std::memcpy(&h, p, 2); out[i] = kernels::ref::bf16_to_f32(h); break; }
      case DType::kI32: { int32_t x; std::memcpy(&x, p, 4); out[i] = x; break; }
      case DType::kI64: { int64_t x; std::memcpy(&x, p, 8); out[i] = static_cast<double>(x); break; }
      case DType::kU8: out[i] = *p; break;
    }
  }
  return out;
}

inline device::DeviceBuffer upload(const std::vector<uint8_t>& bytes) {
  device::DeviceBuffer b(DeviceType::kCUDA, std::max<size_t>(bytes.size(), 1));
  cuda().copy(b.data(), bytes.data(), bytes.size());
  return b;
}

// Reads a device buffer with a synchronous copy on the default stream: after
// Work::wait() it sees the op's output (Note [Stream-ordered work]).
inline std::vector<uint8_t> download(const void* dev, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  cuda().copy(out.data(), dev, bytes);
  return out;
}

}  // namespace torus::testing
