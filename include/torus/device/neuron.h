// torus/device/neuron.h — what is particular to the Neuron device (Trainium):
// the runtime that was loaded and the caching allocator's statistics.
//
// The Neuron device itself is the accelerator of a Neuron build
// (-DTORUS_WITH_NEURON=ON) behind device.h: get_device(DeviceType::kNeuron).
// Its device indices are logical NeuronCore ids (as NEURON_RT_VISIBLE_CORES
// leaves them); its memory is runtime tensors given addresses that the host
// must never dereference (Note [Neuron addresses] in
// src/device/neuron/neuron_memory.h); every copy and fill completes before it
// returns, so its streams are always idle and its events complete when
// recorded (the runtime's tensor calls are synchronous). docs/neuron.md says
// what runs on trn1/trn2 and what does not.
//
// No Neuron SDK header is needed: the runtime (libnrt.so.1, or the library
// TORUS_NEURON_LIBRARY names) is opened at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace torus::device::neuron {

struct RuntimeInfo {
  bool built = false;     // this Torus was built with TORUS_WITH_NEURON
  bool available = false; // the runtime loaded and initialised
  std::string library;    // the path that was opened
  std::string version;    // "2.21.41.0"
  uint64_t major = 0, minor = 0, patch = 0;
  int visible_cores = 0;  // NeuronCores this process may use
  int total_cores = 0;    // NeuronCores on the host
  bool programs = false;  // the runtime offers nrt_load/nrt_execute (neff_program.h)
  std::string reason;     // why it is not available
};

// The runtime of this process, loading it on first call. Never throws.
RuntimeInfo runtime_info() noexcept;

struct AllocatorStats {
  size_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  size_t requested_bytes = 0;       // as asked for
  size_t reserved_bytes = 0;        // held from the runtime: allocated + cached
  size_t peak_allocated_bytes = 0;
  size_t peak_reserved_bytes = 0;
  uint64_t allocations = 0;         // allocate() calls that returned a block
  uint64_t frees = 0;
  uint64_t cache_hits = 0;          // allocations served from the cache
  uint64_t runtime_allocations = 0; // nrt_tensor_allocate calls that succeeded
  uint64_t runtime_frees = 0;
  uint64_t failed_allocations = 0;  // allocate() calls that threw
};

// The caching allocator's counters. Throws Unsupported in a build without
// Neuron, Error when the runtime is unavailable.
AllocatorStats allocator_stats();
// Returns every cached block to the runtime.
void empty_cache();
// Peaks restart from the current values.
void reset_peak_stats();

}  // namespace torus::device::neuron
