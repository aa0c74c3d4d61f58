// Private: the tunables of the ofi backend, one value type. The environment
// overrides them through EnvParams::ofi, parsed and range-checked in
// src/core/params.cpp; docs/ofi.md lists them.
#pragma once

#include <cstddef>
#include <string>

#include "torus/core/dtype.h"
#include "torus/core/params.h"

namespace torus::comm::ofi {

struct OfiOptions {
  // libfabric provider name ("shm", "tcp", "efa", "tcp;ofi_rxm"...). Empty:
  // "shm" when every rank is on one host, else the first RDM provider
  // libfabric offers. From TORUS_OFI_PROVIDER, else FI_PROVIDER.
  std::string provider;

  // Collectives among the ranks of one host go through Torus's own shared-
  // memory segment (host_collectives.h) instead of the provider.
  bool host_shm = true;                        // TORUS_OFI_HOST_SHM
  // Bytes of one pipeline stripe per rank in the host segment; the segment
  // holds shm_depth rounds of (local ranks + 1) stripes per rank. 0: the
  // largest power of two that keeps a rank's staging within
  // shm_stage_bytes (so that all of it stays in the shared cache).
  size_t shm_chunk_bytes = 0;                  // TORUS_OFI_SHM_CHUNK_BYTES
  size_t shm_stage_bytes = size_t{2} << 20;    // TORUS_OFI_SHM_STAGE_BYTES
  int shm_depth = 4;                           // TORUS_OFI_SHM_DEPTH
  // all_reduce up to this size on the host segment: every rank reduces the
  // whole message (one round, lowest latency); above: pipelined
  // reduce-scatter + all-gather through the segment.
  size_t shm_eager_bytes = size_t{16} << 10;   // TORUS_OFI_SHM_EAGER_BYTES
  // An all_reduce of one round (up to shm_eager_bytes) on a group that lives
  // on one host runs in the caller's thread (Note [Inline mailbox
  // all_reduce]), spinning at most this long for the peers before the
  // engine takes over. 0: every op through the engine.
  size_t inline_spin_us = 10;                  // TORUS_OFI_INLINE_SPIN_US
  // On such a group, other collectives moving at most this many bytes per
  // rank also start in the caller's thread, under the same spin, and the
  // engine finishes what the spin did not (Note [Inline ops] in engine.h).
  size_t inline_max_bytes = size_t{64} << 10;  // TORUS_OFI_INLINE_MAX_BYTES
  // Whether this host runs more ranks than it has cores, so that a waiting
  // rank should give its core up almost at once (its peer may need it)
  // rather than spin for a few microseconds first. -1: decide from the host
  // map and the CPUs this process may run on.
  int oversubscribed = -1;                     // TORUS_OFI_OVERSUBSCRIBED (0 or 1)
  // Ops moving at least this many bytes write their results to user memory
  // with non-temporal stores (they would only evict the caches).
  // 16 MiB: below it the outputs of two ranks stay in a 32 MiB last-level
  // cache, and cached stores measured up to 2x faster than non-temporal
  // ones at 4 and 8 MiB (all_reduce, all_gather, all_to_all on 2 ranks);
  // from 16 MiB on the two were alike.
  size_t shm_nt_bytes = size_t{16} << 20;      // TORUS_OFI_SHM_NT_BYTES
  // all_reduce, reduce_scatter, all_gather, broadcast and all_to_all (equal
  // blocks) moving at least this many bytes per rank check whether every
  // rank's buffers are shared host memory, and if so skip the staging
  // stripes (Note [Zero-copy host ops]). 0: never check. Must be the same
  // on every rank (HostSegment checks it, and shm_eager_bytes).
  size_t shm_zero_copy_bytes = size_t{64} << 10;   // TORUS_OFI_SHM_ZERO_COPY_BYTES

  // Algorithms over the provider.
  size_t rd_max_bytes = size_t{32} << 10;      // TORUS_OFI_RD_MAX_BYTES: all_reduce <= this: recursive doubling, above: ring
  size_t tree_max_bytes = size_t{256} << 10;   // TORUS_OFI_TREE_MAX_BYTES: broadcast/reduce <= this: binomial tree
  size_t chunk_bytes = size_t{512} << 10;      // TORUS_OFI_CHUNK_BYTES: pipeline chunk of ring/chain algorithms
  int window = 4;                              // TORUS_OFI_WINDOW: chunks in flight per peer and step

  // Register local buffers even when the provider's mr_mode does not ask for
  // it (exercises the FI_MR_LOCAL path on providers that do not need it).
  bool register_local = false;                 // TORUS_OFI_REGISTER_LOCAL

  // The memory of the buffers the world's ops take (Note [Device buffers]
  // in ofi_backend.cpp): host memory, or the accelerator's for a world made
  // as "ofi-neuron". Set by the backend's name, not by the environment.
  DeviceType memory = DeviceType::kCPU;
  // How the provider reaches device buffers:
  //   kAuto: registered with FI_HMEM (zero copy) for point-to-point when the
  //          provider offers FI_HMEM and a probe registration succeeds;
  //          otherwise moved through host memory;
  //   kOff: always moved through host memory;
  //   kAsHost: the device's addresses registered as host memory: only for a
  //          runtime whose "device" memory is host memory (the tests' fake).
  enum class Hmem : uint8_t { kAuto, kOff, kAsHost };
  Hmem hmem = Hmem::kAuto;                     // TORUS_OFI_HMEM: auto | off | as-host

  // The defaults above, overridden by the variables that `params` holds.
  static OfiOptions from_params(const EnvParams& params);
  // from_params(env_params()); throws InvalidArgument naming a bad variable.
  static OfiOptions from_env();

  // The stripe for a segment of `local_size` ranks (see shm_chunk_bytes).
  size_t stripe_bytes(int local_size) const;
};

}  // namespace torus::comm::ofi
