// Bindings of torus::optim (torus._C.optim): ParamGroup, OptimizerSpec,
// make_optimizer and the Optimizer interface behind torus.optim.SGD, Adam,
// AdamW, CpuAdam and CpuAdamW (python/torus/optim.py, which gives them
// torch.optim's interface), and the CPU Adam kernel on tensor lists
// (cpu_adam_step; cpu_adam.h).
//
// Parameters, gradients and state cross as new TensorImpls over the same
// storage (unpy, Note [Tensors from Python], bind_comm.cpp), because the
// optimizer keeps them. Such a tensor has no autograd link to the caller's,
// so the caller's p.grad is invisible here: step() takes the gradients as an
// argument (one list per group, None to skip) and hands them to the
// optimizer through a grad provider keyed by the optimizer's own parameter
// tensors, for the duration of that step only. step() and load_state_dict()
// release the GIL.
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "bindings.h"
#include "torus/core/error.h"
#include "torus/optim/cpu_adam.h"
#include "torus/optim/optimizer.h"

namespace py = pybind11;

namespace torus::python {
namespace {

using namespace torus::optim;

// Restores "no provider" when a step ends, also by an exception.
class ProviderScope {
 public:
  ProviderScope(Optimizer& opt, GradProvider provider) : opt_(opt) { opt_.set_grad_provider(std::move(provider)); }
  ~ProviderScope() { opt_.set_grad_provider(nullptr); }
  ProviderScope(const ProviderScope&) = delete;
  ProviderScope& operator=(const ProviderScope&) = delete;

 private:
  Optimizer& opt_;
};

void step_with(Optimizer& opt, const std::vector<std::vector<std::optional<at::Tensor>>>& grads, double lr) {
  const auto& groups = opt.groups();
  if (grads.size() != groups.size()) {
    throw InvalidArgument("Optimizer.step: " + std::to_string(grads.size()) + " gradient lists for " +
                          std::to_string(groups.size()) + " parameter groups");
  }
  std::unordered_map<const void*, at::Tensor> by_param;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (grads[g].size() != groups[g].params.size()) {
      throw InvalidArgument("Optimizer.step: group " + std::to_string(g) + " has " +
                            std::to_string(groups[g].params.size()) + " parameters but " +
                            std::to_string(grads[g].size()) + " gradients");
    }
    for (size_t i = 0; i < grads[g].size(); ++i) {
      if (grads[g][i]) by_param.emplace(groups[g].params[i].unsafeGetTensorImpl(), unpy(*grads[g][i]));
    }
  }
  py::gil_scoped_release release;
  ProviderScope scope(opt, [&by_param](const at::Tensor& p) {
    auto it = by_param.find(p.unsafeGetTensorImpl());
    return it == by_param.end() ? at::Tensor() : it->second;
  });
  opt.step(lr);
}

std::vector<at::Tensor> unpy_all(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t.defined() ? unpy(t) : t);
  return out;
}

void cpu_adam_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                   const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int64_t step, bool decoupled,
                   double grad_scale, const std::optional<at::Tensor>& found_inf,
                   const std::optional<std::vector<std::optional<at::Tensor>>>& param_outs, int threads,
                   const std::string& isa) {
  cpu::AdamHyper h{.lr = lr,
                   .beta1 = beta1,
                   .beta2 = beta2,
                   .eps = eps,
                   .weight_decay = weight_decay,
                   .decoupled = decoupled,
                   .step = step,
                   .grad_scale = static_cast<float>(grad_scale)};
  if (found_inf) {
    if (!found_inf->device().is_cpu() || found_inf->scalar_type() != at::kFloat || found_inf->numel() != 1) {
      throw InvalidArgument("cpu_adam_step: found_inf must be a one-element float32 CPU tensor");
    }
    h.found_inf = found_inf->data_ptr<float>();
  }
  std::vector<at::Tensor> outs;
  if (param_outs) {
    for (const auto& o : *param_outs) outs.push_back(o ? unpy(*o) : at::Tensor());
  }
  const auto p = unpy_all(params), g = unpy_all(grads), m = unpy_all(exp_avgs), v = unpy_all(exp_avg_sqs);
  const cpu::Isa which = cpu::parse_isa(isa);
  py::gil_scoped_release release;
  cpu::adam_update(h, p, g, m, v, outs, threads, which);
}

}  // namespace

void bind_optim(py::module_& root) {
  auto m = root.def_submodule("optim", "Optimizers (torus::optim); see torus/optim/optimizer.h.");

  py::enum_<MasterWeights>(m, "MasterWeights", "Which parameters get an fp32 master copy (Note [Master weights]).")
      .value("HALF", MasterWeights::kHalf)
      .value("ALWAYS", MasterWeights::kAlways)
      .value("NEVER", MasterWeights::kNever);

  py::class_<ParamGroup>(m, "ParamGroup", "Parameters with optional overrides of the optimizer's options.")
      .def(py::init<>())
      .def_property(
          "params",
          [](const ParamGroup& g) {
            std::vector<at::Tensor> out;
            for (const auto& p : g.params) out.push_back(unpy(p));
            return out;
          },
          [](ParamGroup& g, const std::vector<at::Tensor>& params) {
            g.params.clear();
            for (const auto& p : params) g.params.push_back(unpy(p));
          })
      .def_readwrite("weight_decay", &ParamGroup::weight_decay)
      .def_readwrite("lr_scale", &ParamGroup::lr_scale)
      .def_readwrite("beta1", &ParamGroup::beta1)
      .def_readwrite("beta2", &ParamGroup::beta2)
      .def_readwrite("eps", &ParamGroup::eps)
      .def_readwrite("momentum", &ParamGroup::momentum)
      .def_readwrite("dampening", &ParamGroup::dampening)
      .def_readwrite("nesterov", &ParamGroup::nesterov)
      .def_readwrite("names", &ParamGroup::names);

  py::class_<OptimizerSpec>(m, "OptimizerSpec", "An optimizer by name and options (make_optimizer).")
      .def(py::init<>())
      .def_readwrite("name", &OptimizerSpec::name)
      .def_readwrite("lr", &OptimizerSpec::lr)
      .def_readwrite("beta1", &OptimizerSpec::beta1)
      .def_readwrite("beta2", &OptimizerSpec::beta2)
      .def_readwrite("eps", &OptimizerSpec::eps)
      .def_readwrite("momentum", &OptimizerSpec::momentum)
      .def_readwrite("dampening", &OptimizerSpec::dampening)
      .def_readwrite("nesterov", &OptimizerSpec::nesterov)
      .def_readwrite("weight_decay", &OptimizerSpec::weight_decay)
      .def_property(
          "master_weights", [](const OptimizerSpec& s) { return s.options.master_weights; },
          [](OptimizerSpec& s, MasterWeights w) { s.options.master_weights = w; })
      .def("validate", &OptimizerSpec::validate);

  py::class_<Optimizer, std::shared_ptr<Optimizer>>(m, "Optimizer", "torus::optim::Optimizer (optimizer.h).")
      .def_property_readonly("name", &Optimizer::name)
      .def("step", &step_with, py::arg("grads"), py::arg("lr") = -1.0,
           "One update with the given gradients: a list per group, None to skip a parameter. lr >= 0: set_lr(lr) "
           "first. Releases the GIL.")
      .def("set_lr", &Optimizer::set_lr, py::arg("lr"))
      .def_property_readonly("lr", &Optimizer::lr)
      .def("group_lr", &Optimizer::group_lr, py::arg("group"))
      .def("hyperparameters", &Optimizer::hyperparameters, py::arg("group"))
      .def_property_readonly("step_count", py::overload_cast<>(&Optimizer::step_count, py::const_))
      .def("param_step_count", py::overload_cast<size_t, size_t>(&Optimizer::step_count, py::const_), py::arg("group"),
           py::arg("index"))
      .def("init_state", &Optimizer::init_state, py::call_guard<py::gil_scoped_release>())
      .def(
          "state_dict",
          [](const Optimizer& o) {
            std::map<std::string, at::Tensor> out;
            for (const auto& [k, v] : o.state_dict()) out.emplace(k, unpy(v));
            return out;
          },
          "The state by '<name>.<state>' and 'step_count'; the tensors alias the live state.")
      .def(
          "load_state_dict",
          [](Optimizer& o, const std::map<std::string, at::Tensor>& state) {
            std::map<std::string, at::Tensor> in;
            for (const auto& [k, v] : state) in.emplace(k, unpy(v));
            py::gil_scoped_release release;
            o.load_state_dict(in);
          },
          py::arg("state"), "Replaces the whole state with copies of `state` (checked first). Releases the GIL.")
      .def_property_readonly("num_groups", &Optimizer::num_groups)
      .def("param_name", &Optimizer::param_name, py::arg("group"), py::arg("index"))
      .def("has_master", &Optimizer::has_master, py::arg("group"), py::arg("index"))
      .def(
          "state",
          [](const Optimizer& o, size_t g, size_t i, const std::string& name) -> py::object {
            at::Tensor t = o.state(g, i, name);
            if (!t.defined()) return py::none();
            return py::cast(unpy(t));
          },
          py::arg("group"), py::arg("index"), py::arg("name"), "A state tensor (aliasing the live state), or None.")
      .def("buffer_names", &Optimizer::buffer_names, py::arg("group"));

  py::class_<detail::CpuAdamBase, Optimizer, std::shared_ptr<detail::CpuAdamBase>>(
      m, "CpuAdamBase", "CpuAdam and CpuAdamW (cpu_adam.h): Adam on Torus's CPU kernel.")
      .def(
          "set_grad_scale",
          [](detail::CpuAdamBase& o, double scale, const std::optional<at::Tensor>& found_inf) {
            o.set_grad_scale(scale, found_inf ? unpy(*found_inf) : at::Tensor());
          },
          py::arg("grad_scale"), py::arg("found_inf") = py::none(),
          "Multiplies every gradient by grad_scale inside the update; a non-zero found_inf (one-element float32 "
          "CPU tensor, read at each step) makes step() change nothing.")
      .def_property_readonly("grad_scale", &detail::CpuAdamBase::grad_scale);
  py::class_<CpuAdam, detail::CpuAdamBase, std::shared_ptr<CpuAdam>>(m, "CpuAdam");
  py::class_<CpuAdamW, detail::CpuAdamBase, std::shared_ptr<CpuAdamW>>(m, "CpuAdamW");

  m.def("cpu_adam_step", &cpu_adam_step, py::arg("params"), py::arg("grads"), py::arg("exp_avgs"),
        py::arg("exp_avg_sqs"), py::kw_only(), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("step"), py::arg("decoupled"), py::arg("grad_scale") = 1.0,
        py::arg("found_inf") = py::none(), py::arg("param_outs") = py::none(), py::arg("threads") = 0,
        py::arg("isa") = "auto",
        "One CPU Adam/AdamW update of lists of contiguous CPU tensors in one parallel region (cpu_adam.h). "
        "Releases the GIL.");
  m.def(
      "cpu_adam_best_isa", [] { return std::string(cpu::isa_name(cpu::best_isa())); },
      "The fastest CPU Adam path this CPU runs: 'avx512', 'avx2' or 'scalar'.");
  m.def(
      "cpu_adam_isa_supported", [](const std::string& isa) { return cpu::isa_supported(cpu::parse_isa(isa)); },
      py::arg("isa"));

  m.def(
      "make_optimizer",
      [](const OptimizerSpec& spec, std::vector<ParamGroup> groups) -> std::shared_ptr<Optimizer> {
        return make_optimizer(spec, std::move(groups));
      },
      py::arg("spec"), py::arg("groups"));
}

}  // namespace torus::python
