// Bindings of torus::comm: init, ProcessGroup, Work, DeviceMesh.
//
// Every call that can block (collectives, wait, init, split, mesh creation)
// releases the GIL. Timeouts are given in seconds (float); None means the
// group's default.
#include <ATen/Functions.h>

#include <optional>

#include "bindings.h"
#include "torus/comm/device_mesh.h"
#include "torus/comm/process_group.h"
#include "torus/comm/shared_host.h"
#include "torus/core/error.h"

namespace py = pybind11;

namespace torus::python {
namespace {

using namespace torus::comm;
using Release = py::call_guard<py::gil_scoped_release>;

Duration to_ms(std::optional<double> seconds) {
  if (!seconds) return kDefaultTimeout;
  if (*seconds <= 0) throw torus::InvalidArgument("timeout must be > 0 seconds");
  return Duration(static_cast<int64_t>(*seconds * 1000.0 + 0.5));
}

ReduceOp to_op(const py::object& op) {
  if (py::isinstance<py::str>(op)) return reduce_op_from_name(op.cast<std::string>());
  return op.cast<ReduceOp>();
}

}  // namespace

// Note [Tensors from Python]: an op's Work holds its tensors until the op
// completes, and the host backends complete ops on their progress thread. If
// that thread dropped the last reference to a tensor that has a Python
// object, it would need the GIL — and deadlock against a main thread that
// holds the GIL while it waits for that thread (interpreter exit). So the C++
// side gets a new TensorImpl over the same storage, with no Python object and
// no autograd link to the caller's tensor (an at::alias view would keep one
// through its view metadata). In-place results land in the caller's tensor.
at::Tensor unpy(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::empty({0}, t.options().requires_grad(false))
      .set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}

void bind_comm(py::module_& m) {
  py::enum_<ReduceOp>(m, "ReduceOp", "Reduction of all_reduce, reduce_scatter and reduce.")
      .value("SUM", ReduceOp::kSum)
      .value("AVG", ReduceOp::kAvg)
      .value("MAX", ReduceOp::kMax)
      .value("MIN", ReduceOp::kMin)
      .value("PROD", ReduceOp::kProd);

  py::class_<Work, WorkPtr>(m, "Work", "Handle of an asynchronous op; wait() before reading outputs.")
      .def("is_completed", &Work::is_completed, "True once the op finished (successfully or not). Never blocks.")
      .def(
          "wait",
          [](Work& w, std::optional<double> timeout) {
            if (timeout) {
              w.wait(to_ms(timeout));
            } else {
              w.wait();
            }
          },
          py::arg("timeout") = py::none(), Release(),
          "Blocks until the op completes and raises its error if it failed. With a timeout (seconds), raises "
          "torus.TimeoutError when it passes (the op keeps its own deadline).")
      .def_property_readonly("succeeded", &Work::succeeded)
      .def_property_readonly("seq", [](const Work& w) { return w.info().seq; })
      .def_property_readonly("op", [](const Work& w) { return std::string(op_type_name(w.info().op)); })
      .def_property_readonly("group", [](const Work& w) { return w.info().group; })
      .def_property_readonly("sizes", [](const Work& w) { return w.info().sizes; })
      .def_property_readonly("dtype", [](const Work& w) { return std::string(dtype_name(w.info().dtype)); })
      .def("exception",
           [](const Work& w) -> py::object {
             auto e = w.exception();
             if (!e) return py::none();
             try {
               std::rethrow_exception(e);
             } catch (const std::exception& ex) {
               return py::str(ex.what());
             }
           },
           "The error message of a failed op, or None.")
      .def("__repr__", [](const Work& w) {
        return "<torus.Work " + w.info().describe() + (w.is_completed() ? " completed>" : " running>");
      });

  py::class_<ProcessGroup, ProcessGroupPtr>(m, "ProcessGroup", "A group of ranks running collectives on tensors.")
      .def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("size", &ProcessGroup::size)
      .def_property_readonly("name", &ProcessGroup::name)
      .def_property_readonly("global_ranks", [](const ProcessGroup& g) { return g.info().global_ranks; })
      .def_property_readonly("backend", [](const ProcessGroup& g) { return std::string(g.host_backend()->name()); })
      .def_property(
          "timeout", [](const ProcessGroup& g) { return g.timeout().count() / 1000.0; },
          [](ProcessGroup& g, double s) { g.set_timeout(to_ms(s)); }, "Default op deadline in seconds.")
      .def_property("debug", &ProcessGroup::debug, &ProcessGroup::set_debug,
                    "Cross-rank fingerprint check before each collective (TORUS_DEBUG_COLLECTIVES).")
      .def(
          "all_reduce",
          [](ProcessGroup& g, at::Tensor tensor, const py::object& op, std::optional<at::Tensor> output,
             std::optional<double> timeout) {
            AllReduceOptions o{to_op(op), to_ms(timeout)};
            at::Tensor t = unpy(tensor);
            py::gil_scoped_release release;
            if (output) {
              at::Tensor out = unpy(*output);
              return g.all_reduce(t, out, o);
            }
            return g.all_reduce(t, o);
          },
          py::arg("tensor"), py::arg("op") = ReduceOp::kSum, py::arg("output") = py::none(),
          py::arg("timeout") = py::none(), "All-reduce; in place unless output is given. Returns a Work.")
      .def(
          "reduce_scatter",
          [](ProcessGroup& g, const at::Tensor& input, at::Tensor output, const py::object& op,
             std::optional<double> timeout) {
            ReduceScatterOptions o{to_op(op), to_ms(timeout)};
            at::Tensor in = unpy(input), out = unpy(output);
            py::gil_scoped_release release;
            return g.reduce_scatter(in, out, o);
          },
          py::arg("input"), py::arg("output"), py::arg("op") = ReduceOp::kSum, py::arg("timeout") = py::none())
      .def(
          "all_gather",
          [](ProcessGroup& g, const at::Tensor& input, at::Tensor output, std::optional<double> timeout) {
            at::Tensor in = unpy(input), out = unpy(output);
            py::gil_scoped_release release;
            return g.all_gather(in, out, AllGatherOptions{to_ms(timeout)});
          },
          py::arg("input"), py::arg("output"), py::arg("timeout") = py::none(),
          "output (size x input elements) receives every rank's input, in rank order.")
      .def(
          "all_to_all",
          [](ProcessGroup& g, const at::Tensor& input, at::Tensor output, std::vector<int64_t> input_split_sizes,
             std::vector<int64_t> output_split_sizes, std::optional<double> timeout) {
            AllToAllOptions o{std::move(input_split_sizes), std::move(output_split_sizes), to_ms(timeout)};
            at::Tensor in = unpy(input), out = unpy(output);
            py::gil_scoped_release release;
            return g.all_to_all(in, out, o);
          },
          py::arg("input"), py::arg("output"), py::arg("input_split_sizes") = std::vector<int64_t>{},
          py::arg("output_split_sizes") = std::vector<int64_t>{}, py::arg("timeout") = py::none())
      .def(
          "broadcast",
          [](ProcessGroup& g, at::Tensor tensor, int root, std::optional<double> timeout) {
            at::Tensor t = unpy(tensor);
            py::gil_scoped_release release;
            return g.broadcast(t, BroadcastOptions{root, to_ms(timeout)});
          },
          py::arg("tensor"), py::arg("root") = 0, py::arg("timeout") = py::none())
      .def(
          "reduce",
          [](ProcessGroup& g, at::Tensor tensor, int root, const py::object& op, std::optional<double> timeout) {
            ReduceOptions o{to_op(op), root, to_ms(timeout)};
            at::Tensor t = unpy(tensor);
            py::gil_scoped_release release;
            return g.reduce(t, o);
          },
          py::arg("tensor"), py::arg("root") = 0, py::arg("op") = ReduceOp::kSum, py::arg("timeout") = py::none())
      .def(
          "send",
          [](ProcessGroup& g, const at::Tensor& tensor, int dst, int tag, std::optional<double> timeout) {
            at::Tensor t = unpy(tensor);
            py::gil_scoped_release release;
            return g.send(t, dst, SendRecvOptions{tag, to_ms(timeout)});
          },
          py::arg("tensor"), py::arg("dst"), py::arg("tag") = 0, py::arg("timeout") = py::none())
      .def(
          "recv",
          [](ProcessGroup& g, at::Tensor tensor, int src, int tag, std::optional<double> timeout) {
            at::Tensor t = unpy(tensor);
            py::gil_scoped_release release;
            return g.recv(t, src, SendRecvOptions{tag, to_ms(timeout)});
          },
          py::arg("tensor"), py::arg("src"), py::arg("tag") = 0, py::arg("timeout") = py::none())
      .def(
          "barrier",
          [](ProcessGroup& g, std::optional<double> timeout) { return g.barrier(BarrierOptions{to_ms(timeout)}); },
          py::arg("timeout") = py::none(), Release())
      .def("split", &ProcessGroup::split, py::arg("color"), py::arg("key"), py::arg("name"), Release(),
           "Collective: ranks with equal color >= 0 form a new group (None for color < 0).")
      .def("new_group", &ProcessGroup::new_group, py::arg("ranks"), py::arg("name"), Release(),
           "Collective: the listed ranks form a new group (None elsewhere).")
      .def("abort", &ProcessGroup::abort, py::arg("reason"))
      .def("__repr__", [](const ProcessGroup& g) {
        return "<torus.ProcessGroup '" + g.name() + "' rank " + std::to_string(g.rank()) + "/" +
               std::to_string(g.size()) + " backend " + std::string(g.host_backend()->name()) + ">";
      });

  m.def(
      "_shared_host_bytes", [](int64_t n) { return torus::comm::shared_host_zeros({n}, at::kByte); }, py::arg("n"),
      "A zeroed uint8 CPU tensor of n bytes over shared host memory (torus.shared_host_zeros builds on it).");
  m.def(
      "is_shared_host",
      [](const at::Tensor& t) {
        return t.device().is_cpu() && t.nbytes() > 0 && torus::comm::is_shared_host(t.data_ptr(), t.nbytes());
      },
      py::arg("tensor"),
      "True when all of the tensor's bytes lie in shared host memory (a pool block or a shared_host_zeros "
      "allocation), so same-host peers on the ofi backend can map them.");
  m.def("shared_host_allocator_installed", &torus::comm::shared_host_allocator_installed,
        "True when the shared host allocator serves LibTorch's CPU tensors (torus.init installs it on ofi with "
        "2+ ranks on a host unless TORUS_SHARED_HOST_ALLOC=off; docs/comm.md).");
  m.def(
      "shared_host_pool_stats",
      [] {
        const torus::comm::SharedHostPoolStats s = torus::comm::shared_host_pool_stats();
        py::dict d;
        d["slabs"] = s.slabs;
        d["slab_bytes"] = s.slab_bytes;
        d["live_blocks"] = s.live_blocks;
        d["live_bytes"] = s.live_bytes;
        d["free_bytes"] = s.free_bytes;
        d["free_blocks"] = s.free_blocks;
        d["cached_bytes"] = s.cached_bytes;
        d["allocs"] = s.allocs;
        d["slabs_made"] = s.slabs_made;
        d["punches"] = s.punches;
        return d;
      },
      "The shared host pool's counters (torus/comm/shared_host.h, SharedHostPoolStats) as a dict.");

  m.def(
      "init",
      [](std::optional<int> rank, std::optional<int> world_size, std::optional<int> local_rank,
         std::optional<int> local_size, const std::string& master_addr, std::optional<int> master_port,
         const std::string& backend, std::optional<double> timeout, const std::string& job_token) {
        InitOptions o;
        o.rank = rank;
        o.world_size = world_size;
        o.local_rank = local_rank;
        o.local_size = local_size;
        o.master_addr = master_addr;
        o.master_port = master_port;
        o.host_backend = backend;
        o.timeout = to_ms(timeout);
        o.job_token = job_token;
        py::gil_scoped_release release;
        return torus::init(o);
      },
      py::arg("rank") = py::none(), py::arg("world_size") = py::none(), py::arg("local_rank") = py::none(),
      py::arg("local_size") = py::none(), py::arg("master_addr") = "", py::arg("master_port") = py::none(),
      py::arg("backend") = "", py::arg("timeout") = py::none(), py::arg("job_token") = "",
      "Bootstraps this process from the launcher's environment (or the arguments) and returns the world group.");

  py::class_<DeviceMesh, std::shared_ptr<DeviceMesh>>(m, "DeviceMesh",
                                                      "Named parallel dimensions (pp, dp, ep, cp, tp; tp innermost).")
      .def(py::init([](ProcessGroupPtr world, const std::vector<std::pair<std::string, int>>& dims) {
             py::gil_scoped_release release;
             return std::make_shared<DeviceMesh>(std::move(world), dims);
           }),
           py::arg("world"), py::arg("dims"))
      .def("size", &DeviceMesh::size, py::arg("dim"))
      .def("coord", &DeviceMesh::coord, py::arg("dim"))
      .def(
          "group",
          [](const DeviceMesh& mesh, const py::object& dims) {
            if (py::isinstance<py::str>(dims)) return mesh.group(dims.cast<std::string>());
            return mesh.group(dims.cast<std::vector<std::string>>());
          },
          py::arg("dims"), "The group along one dimension (str) or a combination (list of str).")
      .def_property_readonly("world", &DeviceMesh::world)
      .def("__repr__", [](const DeviceMesh& mesh) { return "<torus.DeviceMesh " + mesh.layout().describe() + ">"; });
}

}  // namespace torus::python
