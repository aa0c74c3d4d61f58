// Private: the per-module binding functions of torus._C (one file each).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torus::python {

void bind_core(pybind11::module_& m);      // errors, dtypes, logging, build info
void bind_comm(pybind11::module_& m);      // init, ProcessGroup, Work, DeviceMesh
void bind_parallel(pybind11::module_& m);  // tensor/data parallel layers, models

}  // namespace torus::python
