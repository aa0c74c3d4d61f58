// torus/amp/autocast.h — LibTorch autocast as a scope, for training with
// fp32 parameters and bf16/f16 matmuls (the `--autocast` mode).
//
//   {
//     torus::amp::AutocastGuard autocast(c10::DeviceType::CUDA, at::kBFloat16);
//     loss = model->loss(tokens, labels);   // matmuls in bf16, the rest as autocast says
//   }
//   loss.backward();                        // outside the scope, as in PyTorch
//
// While alive, ops dispatched on this thread for `device_type` (CPU or CUDA)
// run under autocast with `dtype` (or with autocast off when `enabled` is
// false, e.g. to exclude a region); the destructor restores the previous
// state and dtype, and the outermost guard of a nest clears autocast's cache
// of cast weights, exactly as torch.autocast's __exit__ does. The Torus
// layers hold their numerics under it (LayerNorm and the cross entropy in
// fp32, attention softmax in fp32; custom autograd functions return
// gradients in their inputs' dtypes). Thread-local, like autocast itself;
// not movable. Throws InvalidArgument for a device without autocast or a
// dtype other than bf16/f16 (f32 on CPU is refused too: it would be a no-op
// that hides a mistake).
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace torus::amp {

class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

}  // namespace torus::amp
