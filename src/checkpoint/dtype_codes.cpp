// Safetensors dtype codes of LibTorch scalar types (checkpoint.h), both ways.
#include <map>

#include "core/log.h"
#include "torus/checkpoint/checkpoint.h"

namespace torus::ckpt {

std::string dtype_code(c10::ScalarType t) {
  switch (t) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: break;
  }
  throw CheckpointError(fmt::format("checkpoint: dtype {} has no safetensors code", c10::toString(t)));
}

c10::ScalarType dtype_from_code(const std::string& code) {
  static const std::map<std::string, c10::ScalarType> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  auto it = table.find(code);
  TORUS_CHECK(it != table.end(), ckpt::CheckpointError, "checkpoint: safetensors dtype {} is not supported here", code);
  return it->second;
}

}  // namespace torus::ckpt
