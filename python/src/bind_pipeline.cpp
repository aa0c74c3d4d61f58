// Bindings of torus::pp (torus._C.pipeline): schedules as data, the
// validator and simulator, the balanced partition, the GPT stage cuts, and the
// executor with stage callbacks written in Python.
//
// Note [Python stage callbacks]: PipelineExecutor.run releases the GIL and
// the executor calls the StageCallbacks on the caller's thread; the
// trampoline below takes the GIL back for each call into Python and releases
// it on return, so the communication between callbacks (blocking receives,
// waits for sends) runs without it. Tensors cross in both directions as new
// TensorImpls over the same storage (unpy, Note [Tensors from Python]): the
// executor keeps the outputs in its send Works and the received buffers in
// its receive Works, which the backends' progress threads may release last.
// Such a tensor has no autograd history; the callbacks keep their own graph
// (the tensors they returned, keyed by micro-batch and chunk). The one place
// the executor hands a callback's own result back is loss(micro, output) right
// after the last stage's forward: the trampoline passes the very object
// forward() returned, so a loss computed from it can be differentiated.
#include <ATen/Functions.h>
#include <pybind11/operators.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "torus/comm/process_group.h"
#include "torus/core/error.h"
#include "torus/models/gpt.h"
#include "torus/parallel/pipeline/executor.h"
#include "torus/parallel/pipeline/partition.h"
#include "torus/parallel/pipeline/schedule.h"

namespace py = pybind11;

namespace torus::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

py::object to_py(const at::Tensor& t) {
  if (!t.defined()) return py::none();
  return py::cast(unpy(t));
}

// A callback's result: a tensor (as a fresh TensorImpl) or None (undefined).
at::Tensor from_py(const py::object& o, const char* method) {
  if (o.is_none()) return at::Tensor();
  if (!THPVariable_Check(o.ptr())) {
    throw torus::InvalidArgument(std::string("StageCallbacks.") + method + " must return a torch.Tensor or None, got " +
                                 std::string(py::str(py::type::handle_of(o).attr("__name__"))));
  }
  return unpy(THPVariable_Unpack(o.ptr()));
}

// The trampoline of Note [Python stage callbacks].
class PyStageCallbacks : public pp::StageCallbacks {
 public:
  using pp::StageCallbacks::StageCallbacks;

  at::Tensor forward(int micro, int chunk, const at::Tensor& input) override {
    py::gil_scoped_acquire gil;
    clear_last();
    py::function f = override_of("forward", /*required=*/true);
    py::object out = f(micro, chunk, to_py(input));
    at::Tensor t = from_py(out, "forward");
    last_output_py_ = std::move(out);
    last_output_ = t;
    return t;
  }

  at::Tensor loss(int micro, const at::Tensor& output) override {
    {
      py::gil_scoped_acquire gil;
      py::function f = override_of("loss", /*required=*/false);
      if (f) {
        py::object arg = last_output_.defined() && output.is_same(last_output_) ? last_output_py_ : to_py(output);
        clear_last();
        return from_py(f(micro, arg), "loss");
      }
      clear_last();
    }
    return pp::StageCallbacks::loss(micro, output);
  }

  at::Tensor backward_input(int micro, int chunk, const at::Tensor& grad_output) override {
    py::gil_scoped_acquire gil;
    clear_last();
    py::function f = override_of("backward_input", /*required=*/true);
    return from_py(f(micro, chunk, to_py(grad_output)), "backward_input");
  }

  void backward_weight(int micro, int chunk) override {
    py::gil_scoped_acquire gil;
    clear_last();
    py::function f = override_of("backward_weight", /*required=*/true);
    f(micro, chunk);
  }

  at::Tensor backward(int micro, int chunk, const at::Tensor& grad_output) override {
    {
      py::gil_scoped_acquire gil;
      clear_last();
      py::function f = override_of("backward", /*required=*/false);
      if (f) return from_py(f(micro, chunk, to_py(grad_output)), "backward");
    }
    return pp::StageCallbacks::backward(micro, chunk, grad_output);
  }

 private:
  // Needs the GIL.
  py::function override_of(const char* name, bool required) const {
    py::function f = py::get_override(static_cast<const pp::StageCallbacks*>(this), name);
    if (!f && required) {
      throw torus::Unsupported(std::string("StageCallbacks.") + name + " is not implemented by the Python subclass");
    }
    return f;
  }
  // Needs the GIL.
  void clear_last() {
    last_output_py_ = py::object();
    last_output_ = at::Tensor();
  }

  // Released with the GIL: by a later callback, or when the Python object
  // that owns this trampoline is deallocated.
  py::object last_output_py_;  // what the last forward() returned, for loss()
  at::Tensor last_output_;     // the tensor the executor got for it
};

pp::ScheduleKind kind_of(const py::object& kind) {
  if (py::isinstance<py::str>(kind)) return pp::schedule_kind_from_name(kind.cast<std::string>());
  return kind.cast<pp::ScheduleKind>();
}

comm::Duration seconds_to_ms(double seconds) {
  if (seconds < 0) throw torus::InvalidArgument("timeout must be >= 0 seconds (0: the group's timeout)");
  return comm::Duration(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// torus.models.GPTConfig (the Python dataclass) or torus._C.models.GPTConfig.
models::GPTConfig native_config(const py::object& config) {
  if (py::hasattr(config, "to_native")) return config.attr("to_native")().cast<models::GPTConfig>();
  return config.cast<models::GPTConfig>();
}

std::vector<std::string> issue_messages(const std::vector<pp::ScheduleIssue>& issues) {
  std::vector<std::string> out;
  out.reserve(issues.size());
  for (const auto& i : issues) out.push_back(i.message);
  return out;
}

void bind_schedules(py::module_& m) {
  py::enum_<pp::ActionKind>(m, "ActionKind", "What one action of a rank's list does (schedule.h).")
      .value("FORWARD", pp::ActionKind::kForward)
      .value("BACKWARD_INPUT", pp::ActionKind::kBackwardInput)
      .value("BACKWARD_WEIGHT", pp::ActionKind::kBackwardWeight)
      .value("BACKWARD", pp::ActionKind::kBackward)
      .value("SEND_ACTIVATION", pp::ActionKind::kSendActivation)
      .value("RECV_ACTIVATION", pp::ActionKind::kRecvActivation)
      .value("SEND_GRAD", pp::ActionKind::kSendGrad)
      .value("RECV_GRAD", pp::ActionKind::kRecvGrad)
      .def_property_readonly("code", [](pp::ActionKind k) { return std::string(pp::action_kind_code(k)); })
      .def_property_readonly("long_name", [](pp::ActionKind k) { return std::string(pp::action_kind_name(k)); })
      .def_property_readonly("is_compute", &pp::is_compute)
      .def_property_readonly("is_send", &pp::is_send)
      .def_property_readonly("is_recv", &pp::is_recv);

  py::class_<pp::Action>(m, "Action", "One action of a rank: compute or communication of (micro, chunk).")
      .def(py::init([](pp::ActionKind kind, int micro, int chunk, int peer) {
             return pp::Action{kind, micro, chunk, peer};
           }),
           py::arg("kind"), py::arg("micro") = 0, py::arg("chunk") = 0, py::arg("peer") = -1)
      .def_readwrite("kind", &pp::Action::kind)
      .def_readwrite("micro", &pp::Action::micro)
      .def_readwrite("chunk", &pp::Action::chunk)
      .def_readwrite("peer", &pp::Action::peer, "The other rank of a communication action; -1 otherwise.")
      .def("describe", &pp::Action::describe, "\"RecvGrad(micro 3, chunk 1, from rank 2)\"")
      .def("token", &pp::Action::token, "Compact token: \"F3\", \"F3.1\", \"SA3@1\", \"RG3.1@2\".")
      .def(py::self == py::self)
      .def("__repr__", [](const pp::Action& a) { return "<torus.pipeline.Action " + a.token() + ">"; });

  py::class_<pp::Schedule>(m, "Schedule",
                           "Every rank's ordered actions for one step. `actions` is copied in and out: assign a "
                           "whole list of lists to change it.")
      .def(py::init([](std::string name, int num_ranks, int num_micro, int num_chunks,
                       std::vector<std::vector<pp::Action>> actions) {
             pp::Schedule s;
             s.name = std::move(name);
             s.num_ranks = num_ranks;
             s.num_micro = num_micro;
             s.num_chunks = num_chunks;
             s.actions =
                 actions.empty() ? std::vector<std::vector<pp::Action>>(std::max(num_ranks, 0)) : std::move(actions);
             return s;
           }),
           py::arg("name"), py::arg("num_ranks"), py::arg("num_micro"), py::arg("num_chunks") = 1,
           py::arg("actions") = std::vector<std::vector<pp::Action>>{})
      .def_readwrite("name", &pp::Schedule::name)
      .def_readwrite("num_ranks", &pp::Schedule::num_ranks)
      .def_readwrite("num_micro", &pp::Schedule::num_micro)
      .def_readwrite("num_chunks", &pp::Schedule::num_chunks)
      .def_readwrite("actions", &pp::Schedule::actions)
      .def_property_readonly("num_stages", &pp::Schedule::num_stages)
      .def("stage", &pp::Schedule::stage, py::arg("rank"), py::arg("chunk"), "chunk * num_ranks + rank")
      .def("rank_of_stage", &pp::Schedule::rank_of_stage, py::arg("stage"))
      .def("chunk_of_stage", &pp::Schedule::chunk_of_stage, py::arg("stage"))
      .def("is_first_stage", &pp::Schedule::is_first_stage, py::arg("rank"), py::arg("chunk"))
      .def("is_last_stage", &pp::Schedule::is_last_stage, py::arg("rank"), py::arg("chunk"))
      .def("describe", &pp::Schedule::describe)
      .def("to_string", &pp::Schedule::to_string, "One line per rank: \"rank 0: F0 SA0@1 ...\".")
      .def("__str__", &pp::Schedule::to_string)
      .def("__repr__", [](const pp::Schedule& s) { return "<torus.pipeline.Schedule " + s.describe() + ">"; });

  py::enum_<pp::ScheduleKind>(m, "ScheduleKind", "The generated schedules.")
      .value("GPIPE", pp::ScheduleKind::kGPipe)
      .value("ONE_F_ONE_B", pp::ScheduleKind::k1F1B)
      .value("INTERLEAVED", pp::ScheduleKind::kInterleaved1F1B)
      .value("ZB_H1", pp::ScheduleKind::kZeroBubbleH1)
      .def_property_readonly("schedule_name",
                             [](pp::ScheduleKind k) { return std::string(pp::schedule_kind_name(k)); });
  m.attr("ALL_SCHEDULE_KINDS") = py::make_tuple(pp::ScheduleKind::kGPipe, pp::ScheduleKind::k1F1B,
                                                pp::ScheduleKind::kInterleaved1F1B, pp::ScheduleKind::kZeroBubbleH1);
  m.def(
      "schedule_kind_name", [](pp::ScheduleKind k) { return std::string(pp::schedule_kind_name(k)); }, py::arg("kind"));
  m.def(
      "schedule_kind_from_name", [](const std::string& n) { return pp::schedule_kind_from_name(n); }, py::arg("name"),
      "\"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\" (and aliases); InvalidArgument otherwise.");
  m.def(
      "make_schedule",
      [](const py::object& kind, int num_ranks, int num_micro, int num_chunks) {
        return pp::make_schedule({kind_of(kind), num_ranks, num_micro, num_chunks});
      },
      py::arg("kind"), py::arg("num_ranks"), py::arg("num_micro"), py::arg("num_chunks") = 1,
      "A complete schedule (compute and communication). kind: a ScheduleKind or its name.");
  m.def(
      "add_communication",
      [](pp::Schedule s) {
        pp::add_communication(s);
        return s;
      },
      py::arg("schedule"), "A copy of a compute-only schedule with the sends and receives inserted.");
  m.def("parse_schedule", &pp::parse_schedule, py::arg("name"), py::arg("num_ranks"), py::arg("num_micro"),
        py::arg("num_chunks"), py::arg("ranks"), "Parses the compact form (one string per rank) of to_string().");

  py::class_<pp::ScheduleIssue>(m, "ScheduleIssue", "One problem simulate() found.")
      .def_readonly("rank", &pp::ScheduleIssue::rank)
      .def_readonly("index", &pp::ScheduleIssue::index)
      .def_readonly("message", &pp::ScheduleIssue::message)
      .def("__repr__", [](const pp::ScheduleIssue& i) { return "<torus.pipeline.ScheduleIssue " + i.message + ">"; });

  py::class_<pp::CostModel>(m, "CostModel", "Per micro-batch times through one rank's share of the model.")
      .def(py::init([](double f, double bi, double bw, double comm) {
             return pp::CostModel{f, bi, bw, comm};
           }),
           py::arg("forward") = 1.0, py::arg("backward_input") = 1.0, py::arg("backward_weight") = 1.0,
           py::arg("comm") = 0.0)
      .def_readwrite("forward", &pp::CostModel::forward)
      .def_readwrite("backward_input", &pp::CostModel::backward_input)
      .def_readwrite("backward_weight", &pp::CostModel::backward_weight)
      .def_readwrite("comm", &pp::CostModel::comm);

  py::class_<pp::RankStats>(m, "RankStats")
      .def_readonly("busy", &pp::RankStats::busy)
      .def_readonly("finish", &pp::RankStats::finish)
      .def_readonly("bubble", &pp::RankStats::bubble)
      .def_readonly("peak_live", &pp::RankStats::peak_live);

  py::class_<pp::Simulation>(m, "Simulation", "The result of simulate(): issues, or timing and memory per rank.")
      .def_readonly("issues", &pp::Simulation::issues)
      .def_readonly("makespan", &pp::Simulation::makespan)
      .def_readonly("ranks", &pp::Simulation::ranks)
      .def_property_readonly("ok", &pp::Simulation::ok)
      .def("bubble", &pp::Simulation::bubble, "Mean idle fraction over ranks.")
      .def("peak_live", &pp::Simulation::peak_live, "Max live (micro, chunk) pairs over ranks.")
      .def("__repr__", [](const pp::Simulation& s) {
        if (!s.ok()) return "<torus.pipeline.Simulation " + std::to_string(s.issues.size()) + " issues>";
        return "<torus.pipeline.Simulation makespan " + std::to_string(s.makespan) + ", bubble " +
               std::to_string(s.bubble()) + ">";
      });

  m.def("simulate", py::overload_cast<const pp::Schedule&, const pp::CostModel&>(&pp::simulate), py::arg("schedule"),
        py::arg("costs") = pp::CostModel{}, "Runs every rank under Note [Communication semantics].");
  m.def("simulate",
        py::overload_cast<const pp::Schedule&, const std::vector<std::vector<double>>&, double>(&pp::simulate),
        py::arg("schedule"), py::arg("durations"), py::arg("comm") = 0.0,
        "Replays recorded durations (one per action of every rank).");
  m.def(
      "validate", [](const pp::Schedule& s) { return issue_messages(pp::validate(s)); }, py::arg("schedule"),
      "The issue messages of the schedule (empty: valid).");
  m.def("check_schedule", &pp::check_schedule, py::arg("schedule"),
        "Raises torus.InvalidArgument listing the issues if the schedule is invalid.");
  m.def(
      "closed_form_bubble",
      [](const py::object& kind, int num_ranks, int num_micro, int num_chunks, const pp::CostModel& costs) {
        return pp::closed_form_bubble(kind_of(kind), num_ranks, num_micro, num_chunks, costs);
      },
      py::arg("kind"), py::arg("num_ranks"), py::arg("num_micro"), py::arg("num_chunks") = 1,
      py::arg("costs") = pp::CostModel{});
}

void bind_partition(py::module_& m) {
  py::class_<pp::Partition>(m, "Partition", "Stage s holds items [bounds[s], bounds[s+1]).")
      .def(py::init([](std::vector<int64_t> bounds) { return pp::Partition{std::move(bounds)}; }), py::arg("bounds"))
      .def_readonly("bounds", &pp::Partition::bounds)
      .def_property_readonly("num_stages", &pp::Partition::num_stages)
      .def("begin", &pp::Partition::begin, py::arg("stage"))
      .def("end", &pp::Partition::end, py::arg("stage"))
      .def("size", &pp::Partition::size, py::arg("stage"))
      .def("describe", &pp::Partition::describe)
      .def("__repr__", [](const pp::Partition& p) { return "<torus.pipeline.Partition " + p.describe() + ">"; });
  m.def("partition_balanced", &pp::partition_balanced, py::arg("costs"), py::arg("num_stages"),
        "The contiguous cut into non-empty stages minimising the most expensive stage.");
  m.def("partition_from_sizes", &pp::partition_from_sizes, py::arg("sizes"), py::arg("num_items"));
  m.def("max_stage_cost", &pp::max_stage_cost, py::arg("partition"), py::arg("costs"));
  m.def("imbalance", &pp::imbalance, py::arg("partition"), py::arg("costs"));

  py::class_<models::GPTPart>(m, "GPTPart", "Which pieces of the GPT one pipeline stage holds.")
      .def(py::init([](bool embedding, int64_t first_layer, int64_t num_layers, bool head) {
             return models::GPTPart{embedding, first_layer, num_layers, head};
           }),
           py::arg("embedding") = true, py::arg("first_layer") = 0, py::arg("num_layers") = -1, py::arg("head") = true)
      .def_readwrite("embedding", &models::GPTPart::embedding)
      .def_readwrite("first_layer", &models::GPTPart::first_layer)
      .def_readwrite("num_layers", &models::GPTPart::num_layers)
      .def_readwrite("head", &models::GPTPart::head)
      .def(
          "describe", [](const models::GPTPart& p, int64_t n) { return models::describe_part(p, n); },
          py::arg("total_layers"), "\"embedding + blocks 0-2\"")
      .def("__repr__", [](const models::GPTPart& p) {
        return "<torus.pipeline.GPTPart embedding=" + std::string(p.embedding ? "True" : "False") +
               " first_layer=" + std::to_string(p.first_layer) + " num_layers=" + std::to_string(p.num_layers) +
               " head=" + std::string(p.head ? "True" : "False") + ">";
      });
  m.def(
      "gpt_item_costs",
      [](const py::object& config, int64_t seq_len) { return models::gpt_item_costs(native_config(config), seq_len); },
      py::arg("config"), py::arg("seq_len"), "Costs of embedding, blocks 0..L-1 and head (forward FLOPs per token).");
  m.def(
      "gpt_stage_parts",
      [](const py::object& config, int num_stages, int64_t seq_len, const std::vector<int64_t>& layers_per_stage) {
        return models::gpt_stage_parts(native_config(config), num_stages, seq_len, layers_per_stage);
      },
      py::arg("config"), py::arg("num_stages"), py::arg("seq_len"),
      py::arg("layers_per_stage") = std::vector<int64_t>{},
      "The GPT cut into stages: balanced by cost, or the given blocks per stage.");
  m.def("describe_part", &models::describe_part, py::arg("part"), py::arg("num_layers"));
}

void bind_executor(py::module_& m) {
  py::class_<pp::StageCallbacks, PyStageCallbacks, std::shared_ptr<pp::StageCallbacks>>(
      m, "StageCallbacks",
      "What one rank's chunks do; subclass in Python and implement forward, backward_input and backward_weight "
      "(loss and backward have defaults). Call super().__init__(). See Note [Python stage callbacks].")
      .def(py::init<>())
      .def("forward", &pp::StageCallbacks::forward, py::arg("micro"), py::arg("chunk"), py::arg("input"))
      .def(
          "loss", [](pp::StageCallbacks& c, int micro, const at::Tensor& output) { return c.loss(micro, output); },
          py::arg("micro"), py::arg("output"), "Default: the output itself.")
      .def("backward_input", &pp::StageCallbacks::backward_input, py::arg("micro"), py::arg("chunk"),
           py::arg("grad_output"))
      .def("backward_weight", &pp::StageCallbacks::backward_weight, py::arg("micro"), py::arg("chunk"))
      .def(
          "backward",
          [](pp::StageCallbacks& c, int micro, int chunk, const std::optional<at::Tensor>& g) {
            return c.backward(micro, chunk, g ? *g : at::Tensor());
          },
          py::arg("micro"), py::arg("chunk"), py::arg("grad_output"), "Default: backward_input, then backward_weight.");

  py::class_<pp::TensorSpec>(m, "TensorSpec", "Shape and dtype an edge carries (Note [Shape agreement]).")
      .def(py::init([](std::vector<int64_t> sizes, c10::ScalarType dtype) {
             return pp::TensorSpec{sizes, dtype};
           }),
           py::arg("sizes"), py::arg("dtype"))
      .def_readwrite("sizes", &pp::TensorSpec::sizes)
      .def_readwrite("dtype", &pp::TensorSpec::dtype);

  py::class_<pp::ExecutorOptions>(m, "ExecutorOptions")
      .def(py::init([](std::vector<pp::TensorSpec> edge_specs, c10::Device device, double timeout, int recv_prefetch,
                       bool record_trace) {
             pp::ExecutorOptions o;
             o.edge_specs = std::move(edge_specs);
             o.device = device;
             o.timeout = seconds_to_ms(timeout);
             o.recv_prefetch = recv_prefetch;
             o.record_trace = record_trace;
             return o;
           }),
           py::arg("edge_specs") = std::vector<pp::TensorSpec>{}, py::arg("device") = c10::Device(c10::kCPU),
           py::arg("timeout") = 0.0, py::arg("recv_prefetch") = 2, py::arg("record_trace") = false,
           "timeout: seconds per send/recv (0: the group's).")
      .def_readwrite("edge_specs", &pp::ExecutorOptions::edge_specs)
      .def_readwrite("device", &pp::ExecutorOptions::device)
      .def_property(
          "timeout", [](const pp::ExecutorOptions& o) { return o.timeout.count() / 1000.0; },
          [](pp::ExecutorOptions& o, double s) { o.timeout = seconds_to_ms(s); })
      .def_readwrite("recv_prefetch", &pp::ExecutorOptions::recv_prefetch)
      .def_readwrite("record_trace", &pp::ExecutorOptions::record_trace);

  py::class_<pp::ActionRecord>(m, "ActionRecord")
      .def_readonly("action", &pp::ActionRecord::action)
      .def_readonly("start", &pp::ActionRecord::start)
      .def_readonly("end", &pp::ActionRecord::end)
      .def("__repr__", [](const pp::ActionRecord& r) {
        return "<torus.pipeline.ActionRecord " + r.action.token() + " " + std::to_string(r.start) + "-" +
               std::to_string(r.end) + ">";
      });

  py::class_<pp::StepResult>(m, "StepResult", "What one run() did on this rank.")
      .def_property_readonly(
          "losses",
          [](const pp::StepResult& r) {
            py::list out;
            for (const auto& l : r.losses) out.append(to_py(l));
            return out;
          },
          "Per micro-batch (detached), on the rank holding the last stage; empty elsewhere.")
      .def_readonly("origin", &pp::StepResult::origin)
      .def_readonly("wall", &pp::StepResult::wall)
      .def_readonly("busy", &pp::StepResult::busy)
      .def_readonly("peak_live", &pp::StepResult::peak_live)
      .def_readonly("trace", &pp::StepResult::trace, "With ExecutorOptions(record_trace=True).");

  py::class_<pp::PipelineExecutor, std::shared_ptr<pp::PipelineExecutor>>(
      m, "PipelineExecutor", "Runs this rank's list of a Schedule over the pipeline group (executor.h).")
      .def(py::init<comm::ProcessGroupPtr, pp::ExecutorOptions>(), py::arg("group"),
           py::arg("options") = pp::ExecutorOptions{})
      .def("run", &pp::PipelineExecutor::run, py::arg("schedule"), py::arg("callbacks"), Release(),
           "Collective over the group. Releases the GIL; the callbacks take it back (Note [Python stage callbacks]).")
      .def_property_readonly("group", &pp::PipelineExecutor::group)
      .def_property_readonly("options", &pp::PipelineExecutor::options);
}

}  // namespace

void bind_pipeline(py::module_& m) {
  auto pipeline = m.def_submodule("pipeline", "Pipeline parallelism (torus::pp).");
  bind_schedules(pipeline);
  bind_partition(pipeline);
  bind_executor(pipeline);
}

}  // namespace torus::python
