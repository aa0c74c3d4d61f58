// Private: carries a ProcessGroup through an autograd context.
//
// AutogradContext::saved_data holds IValues only; a ProcessGroup is not a
// registered TorchScript class, so it travels in an IValue capsule (an
// intrusive holder that needs no registration).
#pragma once

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

inline comm::ProcessGroupPtr unpack_group(const at::IValue& value) {
  return static_cast<GroupHolder*>(value.toCapsule().get())->group;
}

}  // namespace torus::tp::detail
