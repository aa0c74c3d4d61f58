// torus/amp/precision.h — the training precision modes.
//
//   mode   parameters, activations   loss scaling    names accepted by parse_precision()
//   f32    fp32                      none            "f32", "fp32", "float32"
//   bf16   bfloat16                  none (the same  "bf16", "bfloat16"
//                                    exponent range as fp32)
//   fp16   float16                   dynamic         "fp16", "f16", "float16"
//
// Whatever the mode, the numerics that need range or many-term accuracy stay
// in fp32: LayerNorm statistics, attention softmax, the cross entropy (its
// log-sum-exp, the loss and the counts of tokens), the loss scaler's
// bookkeeping. docs/precision.md says what and why. The fp32 master copy of
// half-precision parameters belongs to the optimizer (optim/).
#pragma once

#include <c10/core/ScalarType.h>

#include <string_view>

namespace torus::amp {

enum class Precision { kF32, kBF16, kF16 };

// Case-insensitive; throws InvalidArgument naming the accepted spellings.
Precision parse_precision(std::string_view text);
// "f32", "bf16", "fp16" (parse_precision(precision_name(p)) == p).
const char* precision_name(Precision p);
// at::kFloat, at::kBFloat16, at::kHalf.
c10::ScalarType param_dtype(Precision p);
// The precision of a floating dtype (f32 for f32 and f64); InvalidArgument otherwise.
Precision precision_of(c10::ScalarType dtype);
// Only fp16 needs a loss scaler: its gradients underflow below 2^-24.
inline bool needs_loss_scaling(Precision p) { return p == Precision::kF16; }

}  // namespace torus::amp
