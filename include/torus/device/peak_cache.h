// torus/device/peak_cache.h — measured peaks kept per host, so that every
// run on a host divides its MFU by the same figure (docs/train.md, "MFU").
//
// One small JSON file (TORUS_PEAK_CACHE; default
// $XDG_CACHE_HOME/torus/peak_flops.json, else ~/.cache/torus/peak_flops.json)
// holds entries keyed by host name, CPU model, dtype, thread count and Torus
// version, each with its FLOP/s and the UTC time it was measured. A new
// measurement replaces the entry of its key; the file is rewritten whole
// under a temporary name and renamed into place, so a reader never sees half
// of it (two writers at once: the last rename wins). Delete the file, or
// set TORUS_PEAK_CACHE=off, to measure again.
//
// LibTorch-free. Never throws for a missing, unreadable or malformed file or
// a failed write: the cache is an optimisation, so those log a warning and
// behave as "not cached".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace torus::device {

struct PeakKey {
  std::string host;       // gethostname()
  std::string cpu_model;  // /proc/cpuinfo's first "model name" (empty where none)
  std::string dtype;      // "f32", "bf16", ...
  int threads = 0;
  std::string version;    // TORUS_VERSION
};

struct CachedPeak {
  double flops = 0;
  int64_t measured_unix = 0;  // seconds since the epoch (UTC)
};

// This host's key for `dtype` measured on `threads` threads.
PeakKey host_peak_key(const std::string& dtype, int threads);

// The cache file (env_params().peak_cache); empty when the cache is off.
const std::string& peak_cache_path();

// The entry of `key` in the file at `path`, if any.
std::optional<CachedPeak> read_cached_peak(const std::string& path, const PeakKey& key);

// Stores `flops` for `key` (measured now) in the file at `path`, creating
// its directory; atomic (see above).
void write_cached_peak(const std::string& path, const PeakKey& key, double flops);

// "2026-12-07" for a measured_unix time (UTC).
std::string format_utc_date(int64_t unix_seconds);

}  // namespace torus::device
