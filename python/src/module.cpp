// torus._C: the extension module behind `import torus`.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "Torus: 3D/4D-parallel training runtime (C++ core)";
  torus::python::bind_core(m);
  torus::python::bind_comm(m);
  torus::python::bind_parallel(m);
  torus::python::bind_pipeline(m);  // before bind_train: ScheduleKind is a default argument there
  torus::python::bind_optim(m);
  torus::python::bind_train(m);
}
