// torus/amp/loss_scaler.h — loss scaling for fp16 training.
//
// fp16 has 5 exponent bits: gradients below 2^-24 flush to zero. Scaling the
// loss by S before backward scales every gradient by S, lifting small ones
// into range; the optimizer then sees the gradients divided by S
// (amp::unscale_). Too large an S overflows some gradient to inf; that step
// is skipped and S shrinks. bf16 has fp32's exponent range and needs none of
// this (a static scaler of 1 is the identity).
//
// One step, on every rank (all ranks must call update() with the same flag,
// which amp::found_non_finite() guarantees):
//
//   scaler.scale_loss(loss).backward();                 // loss * scale()
//   bool inf = amp::found_non_finite(grads, {tp, pp, dp});
//   if (!inf) {
//     amp::unscale_(grads, scaler.inv_scale());          // before clipping
//     clip, optimizer.step();
//   }
//   scaler.update(inf);                                  // the scale of the next step
//   zero the gradients;
//
// Note [Dynamic loss scale rules] (Megatron-LM's DynamicGradScaler rules):
//  * a clean step (no inf/NaN) counts towards growth: after growth_interval
//    consecutive clean steps the scale is multiplied by growth_factor (2),
//    capped at max_scale, and the hysteresis budget is refilled;
//  * an overflow skips the step, resets the clean-step count and spends one
//    unit of the hysteresis budget; when the budget is spent (at once with
//    the default hysteresis of 1) the scale is multiplied by backoff_factor
//    (0.5), floored at min_scale. The budget is refilled only by growth, so
//    once exhausted every further overflow backs off;
//  * an overflow that must back off while the scale already sits at
//    min_scale throws torus::Error naming the step and the scale: the loss
//    or the model diverged, and shrinking further would hide it.
// A static scaler (dynamic = false) never changes its scale and never
// throws; overflowing steps are still reported as skipped.
//
// Thread safety: none (one scaler per training loop). update() does not
// communicate.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace torus::amp {

struct LossScalerOptions {
  bool dynamic = true;
  double initial_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // clean steps before growing, >= 1
  int64_t hysteresis = 1;          // backs off at the hysteresis-th overflow since the last growth
                                   // (1: at once; 2: tolerates one), >= 1
  double min_scale = 1.0;          // > 0
  // 2^24: with a loss of order 1, fp16 gradients overflow long before this;
  // the bound keeps a model whose gradients are all zero (or nearly) from
  // growing the scale towards fp32's own overflow.
  double max_scale = 16777216.0;
};

class LossScaler {
 public:
  // Validates the options: InvalidArgument naming the bad field
  // (initial_scale must lie in [min_scale, max_scale]).
  explicit LossScaler(const LossScalerOptions& options = {});
  // A static scaler of `scale` (1: the identity, for f32 and bf16).
  static LossScaler constant(double scale = 1.0);

  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  // loss * scale() (the loss's dtype; the loss is fp32 in Torus models).
  at::Tensor scale_loss(const at::Tensor& loss) const;

  // Records the outcome of one backward (found_inf: some gradient of some
  // rank is inf or NaN) and moves the scale by Note [Dynamic loss scale
  // rules]. Returns whether this step's optimizer step may be taken
  // (!found_inf). The new scale applies to the NEXT backward: unscale this
  // step's gradients with inv_scale() read before calling update(). Throws
  // torus::Error on an overflow that must back off at min_scale.
  bool update(bool found_inf);

  bool dynamic() const { return options_.dynamic; }
  const LossScalerOptions& options() const { return options_; }
  int64_t steps() const { return steps_; }                   // update() calls
  int64_t skipped_steps() const { return skipped_; }         // of which overflowed
  int64_t growth_count() const { return growths_; }          // times the scale grew
  int64_t backoff_count() const { return backoffs_; }        // times the scale shrank
  int64_t clean_steps_since_growth() const { return growth_tracker_; }
  int64_t hysteresis_left() const { return hysteresis_left_; }

  // The mutable state as 0-d CPU tensors: "scale" (f64), "growth_tracker",
  // "hysteresis_left", "steps", "skipped_steps", "growth_count",
  // "backoff_count" (i64). The options are configuration, not state.
  std::map<std::string, at::Tensor> state_dict() const;
  // Restores a state_dict(); throws InvalidArgument for a missing key, a
  // tensor that is not one element, or values outside the options' ranges
  // (scale outside [min_scale, max_scale], negative counters). Nothing
  // changes when it throws.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_left_;
  int64_t steps_ = 0;
  int64_t skipped_ = 0;
  int64_t growths_ = 0;
  int64_t backoffs_ = 0;
};

}  // namespace torus::amp
