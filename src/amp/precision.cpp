#include "torus/amp/precision.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/log.h"

namespace torus::amp {

Precision parse_precision(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "f32" || s == "fp32" || s == "float32") return Precision::kF32;
  if (s == "bf16" || s == "bfloat16") return Precision::kBF16;
  if (s == "fp16" || s == "f16" || s == "float16") return Precision::kF16;
  throw InvalidArgument(fmt::format(
      "unknown precision '{}': expected f32 (fp32, float32), bf16 (bfloat16) or fp16 (f16, float16)", text));
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kF32:
      return "f32";
    case Precision::kBF16:
      return "bf16";
    case Precision::kF16:
      return "fp16";
  }
  return "?";
}

c10::ScalarType param_dtype(Precision p) {
  switch (p) {
    case Precision::kF32:
      return c10::kFloat;
    case Precision::kBF16:
      return c10::kBFloat16;
    case Precision::kF16:
      return c10::kHalf;
  }
  return c10::kFloat;
}

Precision precision_of(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
    case c10::kDouble:
      return Precision::kF32;
    case c10::kBFloat16:
      return Precision::kBF16;
    case c10::kHalf:
      return Precision::kF16;
    default:
      throw InvalidArgument(fmt::format("precision_of: {} is not a training dtype (f32, f64, bf16, f16)",
                                        c10::toString(dtype)));
  }
}

}  // namespace torus::amp
