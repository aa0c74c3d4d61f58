// torus/core/dtype.h — element types and device kinds understood by the
// buffer-level layers (comm backends, kernels). Free of LibTorch; the
// ProcessGroup maps at::ScalarType onto these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace torus {

enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64, kU8 };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                       DType::kI32, DType::kI64, DType::kU8};

// Size of one element in bytes.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kU8: return 1;
  }
  return 0;
}

constexpr bool dtype_is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}

// Short lower-case name: "f32", "bf16", "u8", ...
std::string_view dtype_name(DType t);

// Parses a name produced by dtype_name (also accepts "float32", "bfloat16",
// "half", "int64", ...). Throws InvalidArgument on an unknown name.
DType dtype_from_name(std::string_view name);

// Where a buffer lives. The device backend present is fixed at build time.
enum class DeviceType : uint8_t { kCPU, kCUDA, kNeuron };

std::string_view device_type_name(DeviceType d);

}  // namespace torus
