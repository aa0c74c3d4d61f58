// The one place where the ofi backend reads its environment variables.
#include "comm/ofi/ofi_options.h"

#include <algorithm>

#include "core/log.h"
#include "torus/core/params.h"

namespace torus::comm::ofi {
namespace {

size_t env_bytes(const char* name, size_t fallback, size_t min_value) {
  auto v = env_int(name);
  if (!v) return fallback;
  TORUS_CHECK(*v >= static_cast<int64_t>(min_value), InvalidArgument, "{}={} must be >= {}", name, *v, min_value);
  return static_cast<size_t>(*v);
}

}  // namespace

OfiOptions OfiOptions::from_env() {
  OfiOptions o;
  o.provider = env_params().ofi_provider;
  if (auto v = env_bool("TORUS_OFI_HOST_SHM")) o.host_shm = *v;
  o.shm_chunk_bytes = env_bytes("TORUS_OFI_SHM_CHUNK_BYTES", o.shm_chunk_bytes, 64);
  o.shm_stage_bytes = env_bytes("TORUS_OFI_SHM_STAGE_BYTES", o.shm_stage_bytes, 4096);
  o.shm_depth = static_cast<int>(env_bytes("TORUS_OFI_SHM_DEPTH", o.shm_depth, 2));
  o.shm_eager_bytes = env_bytes("TORUS_OFI_SHM_EAGER_BYTES", o.shm_eager_bytes, 0);
  o.shm_nt_bytes = env_bytes("TORUS_OFI_SHM_NT_BYTES", o.shm_nt_bytes, 0);
  o.shm_zero_copy_bytes = env_bytes("TORUS_OFI_SHM_ZERO_COPY_BYTES", o.shm_zero_copy_bytes, 0);
  o.inline_spin_us = env_bytes("TORUS_OFI_INLINE_SPIN_US", o.inline_spin_us, 0);
  o.inline_max_bytes = env_bytes("TORUS_OFI_INLINE_MAX_BYTES", o.inline_max_bytes, 0);
  if (auto v = env_bool("TORUS_OFI_OVERSUBSCRIBED")) o.oversubscribed = *v ? 1 : 0;
  o.rd_max_bytes = env_bytes("TORUS_OFI_RD_MAX_BYTES", o.rd_max_bytes, 0);
  o.tree_max_bytes = env_bytes("TORUS_OFI_TREE_MAX_BYTES", o.tree_max_bytes, 0);
  o.chunk_bytes = env_bytes("TORUS_OFI_CHUNK_BYTES", o.chunk_bytes, 64);
  o.window = static_cast<int>(env_bytes("TORUS_OFI_WINDOW", o.window, 1));
  if (auto v = env_bool("TORUS_OFI_REGISTER_LOCAL")) o.register_local = *v;
  return o;
}

size_t OfiOptions::stripe_bytes(int local_size) const {
  if (shm_chunk_bytes > 0) return (shm_chunk_bytes + 63) / 64 * 64;  // keep stripes cache-line aligned
  size_t per_stripe = shm_stage_bytes / (static_cast<size_t>(std::max(2, shm_depth)) * (static_cast<size_t>(local_size) + 1));
  size_t stripe = 4096;
  while (stripe * 2 <= per_stripe && stripe < (size_t{1} << 20)) stripe *= 2;
  return stripe;
}

}  // namespace torus::comm::ofi
