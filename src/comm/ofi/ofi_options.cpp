// The ofi backend's tunables, taken from the parsed environment (torus/core/params.h).
#include "comm/ofi/ofi_options.h"

#include <algorithm>

#include "torus/core/params.h"

namespace torus::comm::ofi {

OfiOptions OfiOptions::from_params(const EnvParams& params) {
  const EnvParams::Ofi& e = params.ofi;
  OfiOptions o;
  o.provider = e.provider;
  o.host_shm = e.host_shm.value_or(o.host_shm);
  o.shm_chunk_bytes = e.shm_chunk_bytes.value_or(o.shm_chunk_bytes);
  o.shm_stage_bytes = e.shm_stage_bytes.value_or(o.shm_stage_bytes);
  o.shm_depth = e.shm_depth.value_or(o.shm_depth);
  o.shm_eager_bytes = e.shm_eager_bytes.value_or(o.shm_eager_bytes);
  o.shm_nt_bytes = e.shm_nt_bytes.value_or(o.shm_nt_bytes);
  o.shm_zero_copy_bytes = e.shm_zero_copy_bytes.value_or(o.shm_zero_copy_bytes);
  o.inline_spin_us = e.inline_spin_us.value_or(o.inline_spin_us);
  o.inline_max_bytes = e.inline_max_bytes.value_or(o.inline_max_bytes);
  if (e.oversubscribed) o.oversubscribed = *e.oversubscribed ? 1 : 0;
  o.rd_max_bytes = e.rd_max_bytes.value_or(o.rd_max_bytes);
  o.tree_max_bytes = e.tree_max_bytes.value_or(o.tree_max_bytes);
  o.chunk_bytes = e.chunk_bytes.value_or(o.chunk_bytes);
  o.window = e.window.value_or(o.window);
  o.register_local = e.register_local.value_or(o.register_local);
  if (e.hmem == "off") o.hmem = Hmem::kOff;
  if (e.hmem == "as-host") o.hmem = Hmem::kAsHost;
  return o;
}

OfiOptions OfiOptions::from_env() { return from_params(env_params()); }

size_t OfiOptions::stripe_bytes(int local_size) const {
  if (shm_chunk_bytes > 0) return (shm_chunk_bytes + 63) / 64 * 64;  // keep stripes cache-line aligned
  size_t per_stripe = shm_stage_bytes / (static_cast<size_t>(std::max(2, shm_depth)) * (static_cast<size_t>(local_size) + 1));
  size_t stripe = 4096;
  while (stripe * 2 <= per_stripe && stripe < (size_t{1} << 20)) stripe *= 2;
  return stripe;
}

}  // namespace torus::comm::ofi
