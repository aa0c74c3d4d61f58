#include "torus/core/dtype.h"

#include <algorithm>
#include <string>

#include "core/log.h"

namespace torus {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "f32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "f64" || n == "float64" || n == "double") return DType::kF64;
  if (n == "f16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "i32" || n == "int32" || n == "int") return DType::kI32;
  if (n == "i64" || n == "int64" || n == "long") return DType::kI64;
  if (n == "u8" || n == "uint8" || n == "byte") return DType::kU8;
  throw InvalidArgument(fmt::format("unknown dtype '{}' (expected one of f32, f64, f16, bf16, i32, i64, u8)", name));
}

std::string_view device_type_name(DeviceType d) {
  switch (d) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda";
    case DeviceType::kNeuron: return "neuron";
  }
  return "?";
}

}  // namespace torus
