// Private: the per-module binding functions of torus._C (one file each).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

namespace torus::python {

void bind_core(pybind11::module_& m);      // errors, dtypes, logging, build info
void bind_comm(pybind11::module_& m);      // init, ProcessGroup, Work, DeviceMesh
void bind_parallel(pybind11::module_& m);  // tensor/data parallel layers, models
void bind_pipeline(pybind11::module_& m);  // schedules, simulator, partition, executor
void bind_optim(pybind11::module_& m);     // Optimizer (SGD, Adam, AdamW), ParamGroup, OptimizerSpec
void bind_train(pybind11::module_& m);     // GPTTrainer, lr schedule, corpus, metrics, plot

// A new TensorImpl over the storage of `t`, with no Python object and no
// autograd link (Note [Tensors from Python], bind_comm.cpp). Every tensor that
// crosses from Python into C++ code that may keep it, or from C++ into Python
// while C++ keeps it, goes through this. Undefined stays undefined.
at::Tensor unpy(const at::Tensor& t);

}  // namespace torus::python
