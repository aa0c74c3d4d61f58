#include "torus/amp/autocast.h"

#include <ATen/autocast_mode.h>

#include "core/log.h"

namespace torus::amp {

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : device_type_(device_type) {
  TORUS_CHECK(device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA, InvalidArgument,
              "AutocastGuard: autocast is for CPU or CUDA, got {}", c10::DeviceTypeName(device_type));
  TORUS_CHECK(dtype == c10::kBFloat16 || dtype == c10::kHalf, InvalidArgument,
              "AutocastGuard: the autocast dtype must be bf16 or f16, got {}", c10::toString(dtype));
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // torch.autocast.__exit__: the outermost scope drops the cached casts.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace torus::amp
