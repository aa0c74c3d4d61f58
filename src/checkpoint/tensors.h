// Private: the LibTorch side of a checkpoint's vocabulary (format.h): a
// TensorSlice with its defaults filled in, and a host tensor as the bytes
// the safetensors writer takes.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "checkpoint/format.h"
#include "torus/checkpoint/checkpoint.h"

namespace torus::ckpt {

inline Normal normalize(const std::string& name, const TensorSlice& s) {
  return normalize(name, s.global_shape, s.box_offset, s.box_shape, s.flat_begin, s.flat_end,
                   s.tensor.sizes().vec());
}

// `t` must be contiguous on the CPU and outlive the blob.
inline Blob blob_of(const std::string& name, const at::Tensor& t) {
  return {name, dtype_code(t.scalar_type()), t.sizes().vec(), t.data_ptr()};
}

}  // namespace torus::ckpt
