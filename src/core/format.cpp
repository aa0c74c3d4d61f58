// Numbers for people (core/format.h).
#include "torus/core/format.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <iterator>

namespace torus {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = std::llround(seconds);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes)) return "?";
  if (std::fabs(bytes) < 1024) return fmt::format("{:.0f} B", bytes);
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = bytes / 1024;
  size_t u = 0;
  while (std::fabs(v) >= 1024 && u + 1 < std::size(kUnits)) v /= 1024, ++u;
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

}  // namespace torus
