#include "torus/amp/loss_scaler.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "core/log.h"

namespace torus::amp {
namespace {

bool finite_positive(double x) { return std::isfinite(x) && x > 0; }

void validate(const LossScalerOptions& o) {
  TORUS_CHECK(finite_positive(o.min_scale), InvalidArgument, "LossScaler: min_scale must be finite and > 0, got {}",
              o.min_scale);
  TORUS_CHECK(finite_positive(o.max_scale) && o.max_scale >= o.min_scale, InvalidArgument,
              "LossScaler: max_scale must be finite and >= min_scale {}, got {}", o.min_scale, o.max_scale);
  TORUS_CHECK(finite_positive(o.initial_scale) && o.initial_scale >= o.min_scale && o.initial_scale <= o.max_scale,
              InvalidArgument, "LossScaler: initial_scale {} must lie in [min_scale {}, max_scale {}]",
              o.initial_scale, o.min_scale, o.max_scale);
  TORUS_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, InvalidArgument,
              "LossScaler: growth_factor must be finite and > 1, got {}", o.growth_factor);
  TORUS_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, InvalidArgument,
              "LossScaler: backoff_factor must be in (0, 1), got {}", o.backoff_factor);
  TORUS_CHECK(o.growth_interval >= 1, InvalidArgument, "LossScaler: growth_interval must be >= 1, got {}",
              o.growth_interval);
  TORUS_CHECK(o.hysteresis >= 1, InvalidArgument,
              "LossScaler: hysteresis must be >= 1 (1: back off at the first overflow), got {}", o.hysteresis);
}

const at::Tensor& entry(const std::map<std::string, at::Tensor>& state, const std::string& key) {
  auto it = state.find(key);
  TORUS_CHECK(it != state.end(), InvalidArgument, "LossScaler::load_state_dict: missing '{}'", key);
  TORUS_CHECK(it->second.defined() && it->second.numel() == 1, InvalidArgument,
              "LossScaler::load_state_dict: '{}' must hold one element", key);
  return it->second;
}

at::Tensor i64(int64_t v) { return at::scalar_tensor(v, at::TensorOptions().dtype(at::kLong)); }

}  // namespace

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.initial_scale), hysteresis_left_(options.hysteresis) {
  validate(options_);
}

LossScaler LossScaler::constant(double scale) {
  TORUS_CHECK(finite_positive(scale), InvalidArgument, "LossScaler::constant: scale must be finite and > 0, got {}",
              scale);
  LossScalerOptions o;
  o.dynamic = false;
  o.initial_scale = o.min_scale = o.max_scale = scale;
  return LossScaler(o);
}

at::Tensor LossScaler::scale_loss(const at::Tensor& loss) const {
  TORUS_CHECK(loss.defined(), InvalidArgument, "LossScaler::scale_loss: undefined loss");
  return scale_ == 1.0 ? loss : loss * scale_;
}

bool LossScaler::update(bool found_inf) {
  ++steps_;
  if (!found_inf) {
    if (options_.dynamic && ++growth_tracker_ >= options_.growth_interval) {
      growth_tracker_ = 0;
      hysteresis_left_ = options_.hysteresis;
      const double grown = std::min(scale_ * options_.growth_factor, options_.max_scale);
      if (grown > scale_) ++growths_;
      scale_ = grown;
    }
    return true;
  }
  ++skipped_;
  if (!options_.dynamic) return false;
  growth_tracker_ = 0;
  if (hysteresis_left_ > 1) {
    --hysteresis_left_;
    return false;
  }
  hysteresis_left_ = 0;
  TORUS_CHECK(scale_ > options_.min_scale, Error,
              "LossScaler: gradients overflowed at step {} with the loss scale already at its minimum {} "
              "(min_scale; {} of {} steps skipped): the loss or the model diverged",
              steps_, scale_, skipped_, steps_);
  scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
  ++backoffs_;
  return false;
}

std::map<std::string, at::Tensor> LossScaler::state_dict() const {
  return {{"scale", at::scalar_tensor(scale_, at::TensorOptions().dtype(at::kDouble))},
          {"growth_tracker", i64(growth_tracker_)},
          {"hysteresis_left", i64(hysteresis_left_)},
          {"steps", i64(steps_)},
          {"skipped_steps", i64(skipped_)},
          {"growth_count", i64(growths_)},
          {"backoff_count", i64(backoffs_)}};
}

void LossScaler::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  const double scale = entry(state, "scale").item<double>();
  auto count = [&](const char* key) {
    const at::Tensor& t = entry(state, key);
    TORUS_CHECK(!at::isFloatingType(t.scalar_type()) || t.item<double>() == std::floor(t.item<double>()),
                InvalidArgument, "LossScaler::load_state_dict: '{}' must be an integer", key);
    const int64_t v = t.item<int64_t>();
    TORUS_CHECK(v >= 0, InvalidArgument, "LossScaler::load_state_dict: '{}' must be >= 0, got {}", key, v);
    return v;
  };
  TORUS_CHECK(finite_positive(scale) && scale >= options_.min_scale && scale <= options_.max_scale, InvalidArgument,
              "LossScaler::load_state_dict: scale {} outside [min_scale {}, max_scale {}]", scale, options_.min_scale,
              options_.max_scale);
  const int64_t growth = count("growth_tracker"), hysteresis = count("hysteresis_left");
  TORUS_CHECK(growth < options_.growth_interval, InvalidArgument,
              "LossScaler::load_state_dict: growth_tracker {} must be below growth_interval {}", growth,
              options_.growth_interval);
  TORUS_CHECK(hysteresis <= options_.hysteresis, InvalidArgument,
              "LossScaler::load_state_dict: hysteresis_left {} exceeds hysteresis {}", hysteresis,
              options_.hysteresis);
  const int64_t steps = count("steps"), skipped = count("skipped_steps");
  const int64_t growths = count("growth_count"), backoffs = count("backoff_count");
  TORUS_CHECK(skipped <= steps, InvalidArgument, "LossScaler::load_state_dict: {} skipped of {} steps", skipped,
              steps);
  scale_ = scale;
  growth_tracker_ = growth;
  hysteresis_left_ = hysteresis;
  steps_ = steps;
  skipped_ = skipped;
  growths_ = growths;
  backoffs_ = backoffs;
}

}  // namespace torus::amp
