// torus/optim/flat_state.h — the state of a buffer-level optimizer
// (HostOffloadAdam) as named flat host buffers, free of LibTorch and of
// files: each buffer is this rank's element range of a global 1-D tensor.
// This is what state_dict() hands out and load_state_dict() takes back; the
// checkpoint layer saves and loads it in the Torus checkpoint format
// (checkpoint/flat_state.h: every tensor under its global name, each rank's
// range a flat piece of it), so a state saved on one data-parallel size
// loads on any other.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "torus/core/dtype.h"

namespace torus::optim {

// Elements [offset, offset + numel) of the global 1-D tensor `name` of
// global_numel elements, held by this rank in host memory at `data`.
struct FlatTensor {
  std::string name;          // global name ("optim.exp_avg")
  DType dtype = DType::kF32;
  size_t global_numel = 0;
  size_t offset = 0;
  size_t numel = 0;
  const void* data = nullptr;  // numel elements of dtype
  // Every rank holds the same elements (a step count): saved once, by rank 0
  // of the group that saves.
  bool replicated = false;
};

struct FlatState {
  std::vector<FlatTensor> tensors;
  // What a saved state must match to be loaded into this one (strings by
  // name: HostOffloadAdam's "param_dtype"). Recorded in the checkpoint's
  // manifest and compared, equal or refused, on load.
  std::map<std::string, std::string> meta;

  // The tensor called `name`, or nullptr.
  const FlatTensor* find(const std::string& name) const {
    for (const FlatTensor& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
};

}  // namespace torus::optim
