// LrSchedule: linear warm-up + cosine decay (formula in the header).
#include "torus/run/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/log.h"
#include "torus/core/error.h"

namespace torus::run {

void LrSchedule::validate() const {
  TORUS_CHECK(std::isfinite(peak) && peak >= 0, InvalidArgument, "lr schedule: peak must be finite and >= 0, got {}",
              peak);
  TORUS_CHECK(std::isfinite(min) && min >= 0, InvalidArgument, "lr schedule: min must be finite and >= 0, got {}", min);
  TORUS_CHECK(min <= peak, InvalidArgument, "lr schedule: min ({}) must not exceed peak ({})", min, peak);
  TORUS_CHECK(total_steps >= 1, InvalidArgument, "lr schedule: total_steps must be >= 1, got {}", total_steps);
  TORUS_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, InvalidArgument,
              "lr schedule: warmup_steps must be in [0, total_steps = {}], got {}", total_steps, warmup_steps);
}

double LrSchedule::at(int64_t step) const {
  validate();
  TORUS_CHECK(step >= 0, InvalidArgument, "lr schedule: step must be >= 0, got {}", step);
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t decay = total_steps - 1 - warmup_steps;
  if (step >= total_steps || (decay <= 0 && step > warmup_steps)) return min;
  if (decay <= 0) return peak;  // step == warmup_steps == total_steps - 1
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay);
  if (progress >= 1.0) return min;
  return min + (peak - min) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace torus::run
