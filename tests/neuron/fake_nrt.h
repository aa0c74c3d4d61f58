// The fake Neuron runtime's shared state (fake_nrt.cpp, fake_nrt_cc.cpp).
// It uses Torus's own declarations of the runtime's C types (nrt_api.h), so
// it is ABI-compatible with what Torus calls by construction; the contract
// script (contract.sh) checks those declarations against a real runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "device/neuron/nrt_api.h"

using torus::device::neuron::NRT_FAILURE;
using torus::device::neuron::NRT_INVALID;
using torus::device::neuron::NRT_RESOURCE;
using torus::device::neuron::NRT_STATUS;
using torus::device::neuron::NRT_SUCCESS;
using torus::device::neuron::NRT_TENSOR_PLACEMENT_DEVICE;
using torus::device::neuron::NRT_TENSOR_USAGE_INPUT;
using torus::device::neuron::NRT_TENSOR_USAGE_OUTPUT;
using torus::device::neuron::NRT_TIMEOUT;
using torus::device::neuron::NRT_UNINITIALIZED;
using torus::device::neuron::nrt_tensor_info_array_t;
using torus::device::neuron::nrt_tensor_info_t;
using torus::device::neuron::nrt_version_t;

struct nrt_tensor;

namespace fake {

struct Config {
  int cores = 4;
  size_t core_bytes = size_t{1} << 30;
  long long fail_alloc_after = -1;
  long long read_fail_bytes = -1;  // nrt_tensor_read of this size fails (READ_FAIL_BYTES)
  unsigned long long major = 2, minor = 99, patch = 0;
  std::string trace;
};
Config& config();

struct State {
  std::mutex mu;
  bool initialised = false;
  bool closed = false;
  std::vector<int> visible;   // physical core of each logical core
  std::vector<size_t> used;   // device bytes per logical core
  long long device_allocations = 0;
  long long live_tensors = 0;
};
State& state();

// Appends `call` to the trace file (TORUS_TEST_FAKE_NRT_TRACE), if any.
void trace(const char* call);

// The host bytes of a tensor (fake_nrt.cpp).
unsigned char* tensor_data(nrt_tensor* t);
size_t tensor_size(const nrt_tensor* t);

// Stops the collectives' progress thread and finalizes MPI if the fake
// started it (fake_nrt_cc.cpp); called by nrt_close.
void shutdown_collectives();

}  // namespace fake
