// Private: the state of an opened checkpoint (Checkpoint::Impl,
// checkpoint.h): the LibTorch-free Stored (stored.h: the manifest's files
// and tensors, read by read_manifest(), and the files mapped and verified
// so far) with what the tensor readers add — the tensors' dtypes as
// LibTorch's, and the pieces of a tensor assembled into any slice
// (assemble.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/stored.h"
#include "checkpoint/tensors.h"
#include "torus/checkpoint/checkpoint.h"

namespace torus::ckpt {

struct Checkpoint::Impl : Stored {
  std::map<std::string, TensorInfo> listing;

  // The data of a piece as a tensor of its stored shape (read-only memory).
  at::Tensor piece_tensor(const std::string& name, const Piece& pc, c10::ScalarType dtype) const;

  // A target that is a flat range of a box, from flat pieces of the same
  // box (ZeRO to ZeRO over the same TP layout): only the overlapping ranges
  // are read. False when those pieces do not cover the range (the caller
  // then assembles the box).
  bool copy_flat(const std::string& name, const GlobalTensor& g, const std::vector<const Piece*>& pieces,
                 const Normal& n, at::Tensor& dst) const;

  // Copies into `dst` (the box [off, off + box) of `name`) every element
  // of the pieces that intersect it; returns the elements covered inside
  // the global shape.
  int64_t fill_box(const std::string& name, const GlobalTensor& g, const std::vector<const Piece*>& pieces,
                   const std::vector<int64_t>& off, const std::vector<int64_t>& box, at::Tensor& dst) const;
};

}  // namespace torus::ckpt
