// Neuron device buffers for the comm tests (neuron_backend_test.cpp,
// ofi_neuron_test.cpp), staged to and from the conformance suite's host
// buffers (backend/backend_fixture.h).
#pragma once

#include <algorithm>
#include <cstddef>

#include "backend/backend_fixture.h"
#include "torus/device/device.h"

namespace torus::comm::test {

inline device::Device& dev() { return device::get_device(DeviceType::kNeuron); }

// A Neuron buffer of n elements, with host staging through Buf.
struct DevBuf {
  DevBuf(DType t, size_t n) : dtype(t), count(n), mem(DeviceType::kNeuron, std::max<size_t>(n, 1) * dtype_size(t)) {}
  void upload(const Buf& b) { dev().copy(mem.data(), b.data(), count * dtype_size(dtype)); }
  Buf download() const {
    Buf b(dtype, count);
    dev().copy(b.data(), mem.data(), count * dtype_size(dtype));
    return b;
  }
  char* at(size_t i) const { return mem.as<char>() + i * dtype_size(dtype); }
  DType dtype;
  size_t count;
  device::DeviceBuffer mem;
};

}  // namespace torus::comm::test
