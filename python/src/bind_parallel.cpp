// Bindings of the parallel modules (filled in with torus::tp / torus::dp).
#include "bindings.h"

namespace torus::python {

void bind_parallel(pybind11::module_& m) { (void)m; }

}  // namespace torus::python
