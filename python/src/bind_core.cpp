// Bindings of torus::core: the exception hierarchy, log level, build info.
//
// C++ exceptions become Python exceptions of matching types:
//   torus.Error (RuntimeError), torus.InvalidArgument (Error, ValueError),
//   torus.CommError (Error), torus.TimeoutError (Error, builtins.TimeoutError),
//   torus.Unsupported (Error, NotImplementedError).
#include <Python.h>

#include "bindings.h"
#include "torus/checkpoint/safetensors.h"
#include "torus/comm/backends.h"
#include "torus/config.h"
#include "torus/core/error.h"
#include "torus/core/host_allocator.h"
#include "torus/core/logging.h"
#include "torus/device/device.h"

namespace py = pybind11;

namespace torus::python {
namespace {

PyObject* new_exception(py::module_& m, const char* name, py::tuple bases) {
  std::string qualified = std::string("torus._C.") + name;
  PyObject* type = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;
}

}  // namespace

void bind_core(py::module_& m) {
  static PyObject* error = new_exception(m, "Error", py::make_tuple(py::handle(PyExc_RuntimeError)));
  static PyObject* invalid =
      new_exception(m, "InvalidArgument", py::make_tuple(py::handle(error), py::handle(PyExc_ValueError)));
  static PyObject* comm = new_exception(m, "CommError", py::make_tuple(py::handle(error)));
  static PyObject* timeout =
      new_exception(m, "TimeoutError", py::make_tuple(py::handle(error), py::handle(PyExc_TimeoutError)));
  static PyObject* unsupported =
      new_exception(m, "Unsupported", py::make_tuple(py::handle(error), py::handle(PyExc_NotImplementedError)));
  static PyObject* checkpoint = new_exception(m, "CheckpointError", py::make_tuple(py::handle(error)));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const torus::InvalidArgument& e) {
      PyErr_SetString(invalid, e.what());
    } catch (const torus::TimeoutError& e) {
      PyErr_SetString(timeout, e.what());
    } catch (const torus::CommError& e) {
      PyErr_SetString(comm, e.what());
    } catch (const torus::Unsupported& e) {
      PyErr_SetString(unsupported, e.what());
    } catch (const torus::ckpt::CheckpointError& e) {
      PyErr_SetString(checkpoint, e.what());
    } catch (const torus::Error& e) {
      PyErr_SetString(error, e.what());
    }
  });

  m.def("set_log_level", [](const std::string& level) { set_log_level(parse_log_level(level)); },
        py::arg("level"), "Sets the log level: trace, debug, info, warn, error or off.");
  m.def("log_level", [] { return std::string(log_level_name(torus::log_level())); });
  m.def(
      "retain_freed_host_memory",
      [] {
        const HostAllocatorSettings s = retain_freed_host_memory();
        py::dict d;
        d["applied"] = s.applied;
        d["mmap_threshold"] = s.mmap_threshold;
        d["trim_threshold"] = s.trim_threshold;
        return d;
      },
      "Keeps host memory a training step frees in the process for the next step (glibc malloc: the\n"
      "largest mmap threshold, no heap trimming); a process-wide setting for trainers. Returns the\n"
      "settings applied (applied=False where the C library is not glibc). See torus/core/host_allocator.h.");
  m.attr("__version__") = TORUS_VERSION;
  py::dict build;
  // What the registries hold (Note [Backend registration]); "neuron" is the
  // device kind, as "cuda" is.
  build["mpi"] = comm::backend_registered("mpi");
  build["ofi"] = comm::backend_registered("ofi");
  build["cuda"] = device::registered(DeviceType::kCUDA);
  build["nccl"] = comm::backend_registered("nccl");
  build["neuron"] = device::registered(DeviceType::kNeuron);
  m.attr("build_info") = build;
}

}  // namespace torus::python
