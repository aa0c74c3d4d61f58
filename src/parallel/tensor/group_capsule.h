// Private: carries a ProcessGroup through an autograd context.
//
// AutogradContext::saved_data holds IValues only; a ProcessGroup is not a
// registered TorchScript class, so it travels in an IValue capsule (an
// intrusive holder that needs no registration).
#pragma once

#include <ATen/Functions.h>
#include <ATen/core/ivalue.h>

#include "torus/comm/process_group.h"

namespace torus::tp::detail {

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(comm::ProcessGroupPtr g) : group(std::move(g)) {}
  comm::ProcessGroupPtr group;
};

inline at::IValue pack_group(const comm::ProcessGroupPtr& group) {
  return at::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
}

// Note [Tensors from Python] (python/src/bind_comm.cpp): a collective's Work
// keeps its tensors until the op completes, and the backend's progress thread
// drops them. A tensor the caller handed in may have a Python object, whose
// release needs the GIL; so the collective gets a new TensorImpl over the same
// storage instead, with no Python object and no autograd link.
inline at::Tensor comm_alias(const at::Tensor& t) {
  return at::empty({0}, t.options()).set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}

inline comm::ProcessGroupPtr unpack_group(const at::IValue& value) {
  return static_cast<GroupHolder*>(value.toCapsule().get())->group;
}

}  // namespace torus::tp::detail
