// Bindings of torus::train (torus._C.train): the training engine (Trainer,
// GPTTrainer), the training loop (TrainLoop) with its option table
// (RunConfig) and its memory estimate, and the utilities of a training run (learning-rate schedule,
// byte corpus and batch sampler, step line and memory).
//
// GPTTrainer's constructor, train_step, evaluate and gather_local_parameters
// communicate and take long: they release the GIL. Batches from Python reach
// C++ through unpy (Note [Tensors from Python], bind_comm.cpp).
#include <ATen/Functions.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/operators.h>

#include "bindings.h"
#include "torus/checkpoint/checkpoint.h"
#include "torus/comm/process_group.h"
#include "torus/core/error.h"
#include "torus/models/gpt.h"
#include "torus/parallel/data/zero.h"
#include "torus/engine/checkpointing.h"
#include "torus/run/corpus.h"
#include "torus/engine/gpt_model.h"
#include "torus/run/lr_schedule.h"
#include "torus/engine/memory_plan.h"
#include "torus/run/metrics.h"
#include "torus/plan/planner.h"
#include "torus/run/run_config.h"
#include "torus/run/train_loop.h"
#include "torus/engine/trainer.h"

namespace py = pybind11;

namespace torus::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

pp::ScheduleKind kind_of(const py::object& kind) {
  if (py::isinstance<py::str>(kind)) return pp::schedule_kind_from_name(kind.cast<std::string>());
  return kind.cast<pp::ScheduleKind>();
}

// torus.models.GPTConfig (the Python dataclass) or torus._C.models.GPTConfig.
models::GPTConfig native_config(const py::object& config) {
  if (py::hasattr(config, "to_native")) return config.attr("to_native")().cast<models::GPTConfig>();
  return config.cast<models::GPTConfig>();
}

// The bytes of a buffer (bytes, bytearray, memoryview, a uint8 array).
std::vector<uint8_t> buffer_bytes(const py::buffer& b) {
  py::buffer_info info = b.request();
  if (info.ndim > 1) {
    for (py::ssize_t d = info.ndim - 1, expect = info.itemsize; d >= 0; --d) {
      if (info.strides[d] != expect) throw torus::InvalidArgument("the data buffer must be contiguous");
      expect *= info.shape[d];
    }
  } else if (info.ndim == 1 && info.strides[0] != info.itemsize) {
    throw torus::InvalidArgument("the data buffer must be contiguous");
  }
  const size_t n = static_cast<size_t>(info.size * info.itemsize);
  std::vector<uint8_t> out(n);
  if (n > 0) std::memcpy(out.data(), info.ptr, n);
  return out;
}

py::bytes to_bytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

at::Tensor tokens_tensor(const std::vector<int64_t>& tokens, int64_t rows, int64_t cols) {
  at::Tensor t = at::empty({rows, cols}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(t.data_ptr<int64_t>(), tokens.data(), tokens.size() * sizeof(int64_t));
  return t;
}

// A BatchSampler that owns its bytes (the C++ sampler only views them).
class OwningSampler {
 public:
  OwningSampler(std::vector<uint8_t> data, int64_t seq_len, int64_t batch, uint64_t seed, std::string name)
      : data_(std::make_shared<const std::vector<uint8_t>>(std::move(data))),
        sampler_(*data_, seq_len, batch, seed, std::move(name)) {}

  const run::BatchSampler& sampler() const { return sampler_; }
  size_t data_size() const { return data_->size(); }

 private:
  std::shared_ptr<const std::vector<uint8_t>> data_;
  run::BatchSampler sampler_;
};

void bind_layout(py::module_& m) {
  // The one layout value (parallel/layout.h, Note [One layout]).
  py::class_<engine::ParallelLayout>(
      m, "ParallelLayout",
      "How the world is cut (parallel/layout.h): tp x pp x dp x ep, sequence and expert TP, schedule, micro-batches, "
      "chunks, stage cut, ZeRO stage, offload and recompute.")
      .def(py::init([](int tp, int pp, int dp, int ep, bool sequence_parallel, const py::object& schedule,
                       int num_micro, int num_chunks, std::vector<int64_t> layers_per_stage, int zero,
                       const std::string& offload, const std::string& recompute, bool expert_tp) {
             engine::ParallelLayout l;
             l.tp = tp;
             l.pp = pp;
             l.dp = dp;
             l.ep = ep;
             l.sequence_parallel = sequence_parallel;
             l.schedule = kind_of(schedule);
             l.num_micro = num_micro;
             l.num_chunks = num_chunks;
             l.layers_per_stage = std::move(layers_per_stage);
             l.zero = zero;
             l.offload = dp::parse_offload(offload);
             l.recompute = recompute;
             l.expert_tp = expert_tp;
             return l;
           }),
           py::arg("tp") = 1, py::arg("pp") = 1, py::arg("dp") = 1, py::kw_only(), py::arg("ep") = 1,
           py::arg("sequence_parallel") = false, py::arg("schedule") = pp::ScheduleKind::k1F1B,
           py::arg("num_micro") = 1, py::arg("num_chunks") = 1, py::arg("layers_per_stage") = std::vector<int64_t>{},
           py::arg("zero") = 0, py::arg("offload") = "none", py::arg("recompute") = "none",
           py::arg("expert_tp") = false,
           "schedule: a torus.pipeline.ScheduleKind or its name (\"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\"); "
           "dp=0 or num_micro=0: resolved for the world (resolved()); zero: 0-3 (ZeRO over dp); offload: \"none\", "
           "\"optimizer\" or \"optimizer+params\".")
      .def_readwrite("tp", &engine::ParallelLayout::tp)
      .def_readwrite("pp", &engine::ParallelLayout::pp)
      .def_readwrite("dp", &engine::ParallelLayout::dp)
      .def_readwrite("ep", &engine::ParallelLayout::ep, "expert-parallel size (MoE models)")
      .def_readwrite("sequence_parallel", &engine::ParallelLayout::sequence_parallel)
      .def_readwrite("expert_tp", &engine::ParallelLayout::expert_tp)
      .def_property(
          "schedule", [](const engine::ParallelLayout& l) { return l.schedule; },
          [](engine::ParallelLayout& l, const py::object& k) { l.schedule = kind_of(k); })
      .def_readwrite("num_micro", &engine::ParallelLayout::num_micro)
      .def_readwrite("num_chunks", &engine::ParallelLayout::num_chunks)
      .def_readwrite("layers_per_stage", &engine::ParallelLayout::layers_per_stage)
      .def_readwrite("zero", &engine::ParallelLayout::zero)
      .def_property(
          "offload", [](const engine::ParallelLayout& l) { return std::string(dp::offload_name(l.offload)); },
          [](engine::ParallelLayout& l, const std::string& text) { l.offload = dp::parse_offload(text); },
          "\"none\", \"optimizer\" or \"optimizer+params\"")
      .def_readwrite("recompute", &engine::ParallelLayout::recompute)
      .def_property_readonly("num_stages", &engine::ParallelLayout::num_stages)
      .def("resolved", &engine::ParallelLayout::resolved, py::arg("world_size"),
           "A copy with dp and num_micro (when 0) filled in for the world.")
      .def("validate", &engine::ParallelLayout::validate, py::arg("world_size"),
           "Raises torus.InvalidArgument naming the problem.")
      .def("mesh_dims", &engine::ParallelLayout::mesh_dims, "[(\"pp\", n), (\"dp\", n), (\"ep\", n), (\"tp\", n)]")
      .def("to_json", &engine::ParallelLayout::to_json)
      .def_static(
          "from_json", [](const std::string& text) { return engine::ParallelLayout{}.with_json(text); },
          py::arg("text"), "A layout from its JSON (keys absent keep the defaults).")
      .def("args", &engine::ParallelLayout::args, "The layout as torus-train arguments.")
      .def("describe", &engine::ParallelLayout::describe, "\"tp=2 pp=2 dp=2, 1f1b, m=4\"")
      .def(py::self == py::self)
      .def("__repr__",
           [](const engine::ParallelLayout& l) { return "<torus.train.ParallelLayout " + l.describe() + ">"; });

  py::class_<engine::OptimizerConfig>(m, "OptimizerConfig", "The trainer's optimizer and global-norm clipping.")
      .def(py::init([](std::string name, double lr, double weight_decay, double beta1, double beta2, double eps,
                       double momentum, bool nesterov, double grad_clip) {
             engine::OptimizerConfig c;
             c.name = std::move(name);
             c.lr = lr;
             c.weight_decay = weight_decay;
             c.beta1 = beta1;
             c.beta2 = beta2;
             c.eps = eps;
             c.momentum = momentum;
             c.nesterov = nesterov;
             c.grad_clip = grad_clip;
             return c;
           }),
           py::kw_only(), py::arg("name") = "adamw", py::arg("lr") = 3e-4, py::arg("weight_decay") = 0.1,
           py::arg("beta1") = 0.9, py::arg("beta2") = 0.95, py::arg("eps") = 1e-8, py::arg("momentum") = 0.0,
           py::arg("nesterov") = false, py::arg("grad_clip") = 1.0)
      .def_readwrite("name", &engine::OptimizerConfig::name, "sgd, adam or adamw")
      .def_readwrite("momentum", &engine::OptimizerConfig::momentum)
      .def_readwrite("nesterov", &engine::OptimizerConfig::nesterov)
      .def_readwrite("lr", &engine::OptimizerConfig::lr)
      .def_readwrite("weight_decay", &engine::OptimizerConfig::weight_decay)
      .def_readwrite("beta1", &engine::OptimizerConfig::beta1)
      .def_readwrite("beta2", &engine::OptimizerConfig::beta2)
      .def_readwrite("eps", &engine::OptimizerConfig::eps)
      .def_readwrite("grad_clip", &engine::OptimizerConfig::grad_clip, "max global L2 norm; 0: no clipping");

  py::class_<engine::TrainerOptions>(m, "TrainerOptions")
      .def(py::init([](int64_t bucket_cap_bytes, bool overlap_grad_sync, int recv_prefetch, bool record_trace,
                       int zero_prefetch) {
             engine::TrainerOptions o;
             o.bucket_cap_bytes = bucket_cap_bytes;
             o.overlap_grad_sync = overlap_grad_sync;
             o.recv_prefetch = recv_prefetch;
             o.record_trace = record_trace;
             o.zero_prefetch = zero_prefetch;
             return o;
           }),
           py::kw_only(), py::arg("bucket_cap_bytes") = int64_t{25} << 20, py::arg("overlap_grad_sync") = true,
           py::arg("recv_prefetch") = 2, py::arg("record_trace") = false, py::arg("zero_prefetch") = 1,
           "zero_prefetch: ZeRO-3 blocks gathered ahead (the ZeRO stage and offload are the layout's).")
      .def_readwrite("bucket_cap_bytes", &engine::TrainerOptions::bucket_cap_bytes)
      .def_readwrite("overlap_grad_sync", &engine::TrainerOptions::overlap_grad_sync)
      .def_readwrite("recv_prefetch", &engine::TrainerOptions::recv_prefetch)
      .def_readwrite("record_trace", &engine::TrainerOptions::record_trace)
      .def_readwrite("zero_prefetch", &engine::TrainerOptions::zero_prefetch);

  py::class_<engine::MemoryEstimate>(m, "MemoryEstimate",
                                    "Bytes a rank will keep, by kind (memory_plan.h, Note [Memory estimate]).")
      .def_readonly("parameters", &engine::MemoryEstimate::parameters)
      .def_readonly("gradients", &engine::MemoryEstimate::gradients)
      .def_readonly("optimizer", &engine::MemoryEstimate::optimizer)
      .def_readonly("activations", &engine::MemoryEstimate::activations)
      .def_readonly("buffers", &engine::MemoryEstimate::buffers)
      .def_readonly("host_optimizer", &engine::MemoryEstimate::host_optimizer)
      .def_readonly("host_parameters", &engine::MemoryEstimate::host_parameters)
      .def("device_bytes", &engine::MemoryEstimate::device_bytes)
      .def("host_bytes", &engine::MemoryEstimate::host_bytes)
      .def("describe", &engine::MemoryEstimate::describe)
      .def("__repr__",
           [](const engine::MemoryEstimate& e) { return "<torus.train.MemoryEstimate " + e.describe() + ">"; });

  py::class_<engine::StepStats>(m, "StepStats", "What one train_step did (the same on every rank, times aside).")
      .def_readonly("step", &engine::StepStats::step)
      .def_readonly("loss", &engine::StepStats::loss)
      .def_readonly("grad_norm", &engine::StepStats::grad_norm)
      .def_readonly("clip_coefficient", &engine::StepStats::clip_coefficient)
      .def_readonly("skipped", &engine::StepStats::skipped)
      .def_readonly("seconds", &engine::StepStats::seconds)
      .def_readonly("pipeline_seconds", &engine::StepStats::pipeline_seconds)
      .def_readonly("sync_seconds", &engine::StepStats::sync_seconds)
      .def_readonly("tokens", &engine::StepStats::tokens)
      .def_readonly("peak_live", &engine::StepStats::peak_live)
      .def_readonly("loss_scale", &engine::StepStats::loss_scale)
      .def_readonly("overflow", &engine::StepStats::overflow)
      .def_readonly("skipped_steps", &engine::StepStats::skipped_steps)
      .def_property_readonly(
          "routing",
          [](const engine::StepStats& s) {
            py::list layers;
            for (const auto& l : s.routing.layers) {
              py::dict d;
              d["layer"] = l.layer;
              d["tokens_per_expert"] = l.tokens_per_expert;
              d["assignments"] = l.assignments;
              d["dropped"] = l.dropped;
              d["drop_rate"] = l.drop_rate();
              d["imbalance"] = l.imbalance();
              d["aux_loss"] = l.mean_aux_loss();
              d["z_loss"] = l.mean_z_loss();
              layers.append(d);
            }
            return layers;
          },
          "MoE models: the step's routing statistics, one dict per MoE layer (empty for a dense model)")
      .def("__repr__", [](const engine::StepStats& s) {
        return "<torus.train.StepStats step " + std::to_string(s.step) + " loss " + std::to_string(s.loss) +
               " grad_norm " + std::to_string(s.grad_norm) + (s.skipped ? " skipped" : "") + ">";
      });
}

void bind_trainer(py::module_& m) {
  using engine::GPTTrainer;
  using engine::Trainer;
  py::class_<Trainer, std::shared_ptr<Trainer>>(
      m, "Trainer", "The training engine over a model adapter (trainer.h); GPTTrainer is one over the GPT.")
      .def(
          "train_step",
          [](Trainer& t, const at::Tensor& batch, double lr) {
            at::Tensor b = unpy(batch);
            py::gil_scoped_release release;
            return t.train_step(b, lr);
          },
          py::arg("batch"), py::arg("lr") = -1.0,
          "One optimizer step on [global_batch, seq + 1] int64 tokens, the same on every rank. lr < 0: the "
          "OptimizerConfig's. Collective; releases the GIL.")
      .def(
          "local_rows", [](const Trainer& t, int64_t global_batch) { return t.local_rows(global_batch); },
          py::arg("global_batch"),
          "The rows of a global batch this rank's data rank trains on, in the order train_step_local takes them.")
      .def(
          "train_step_local",
          [](Trainer& t, const at::Tensor& rows, int64_t global_batch, double lr) {
            engine::LocalBatch b{unpy(rows), global_batch};
            py::gil_scoped_release release;
            return t.train_step(b, lr);
          },
          py::arg("rows"), py::arg("global_batch"), py::arg("lr") = -1.0,
          "train_step where this rank holds only its rows: rows[i] is row local_rows(global_batch)[i] of the global "
          "batch. The same step as train_step on the whole batch. Collective; releases the GIL.")
      .def(
          "evaluate_local",
          [](Trainer& t, const at::Tensor& rows, int64_t global_batch) {
            engine::LocalBatch b{unpy(rows), global_batch};
            py::gil_scoped_release release;
            return t.evaluate(b);
          },
          py::arg("rows"), py::arg("global_batch"), "evaluate on this rank's rows (as train_step_local).")
      .def(
          "evaluate",
          [](Trainer& t, const at::Tensor& batch) {
            at::Tensor b = unpy(batch);
            py::gil_scoped_release release;
            return t.evaluate(b);
          },
          py::arg("batch"),
          "Mean token loss without gradients (a forward-only schedule). Collective; releases the GIL.")
      .def(
          "logits",
          [](Trainer& t, const at::Tensor& batch) {
            at::Tensor b = unpy(batch);
            py::gil_scoped_release release;
            return t.logits(b);
          },
          py::arg("batch"),
          "Logits [batch, seq, vocab] of `batch` ([batch, seq + 1] tokens) without gradients, gathered over "
          "tp and the data ranks (f32, or f64 for f64 models; on the host), the same on every rank: for "
          "comparisons with another implementation. Collective; releases the GIL.")
      .def(
          "gather_local_parameters",
          [](const Trainer& t) {
            std::map<std::string, at::Tensor> params;
            {
              py::gil_scoped_release release;
              params = t.gather_local_parameters();
              for (auto& [name, p] : params) p = p.detach().clone();
            }
            py::dict out;
            for (auto& [name, p] : params) out[py::str(name)] = std::move(p);
            return out;
          },
          "Copies of the full (TP-gathered) parameters this rank holds, by global name. Collective over tp.")
      .def(
          "state_dict",
          [](const Trainer& t) {
            py::dict out;
            for (const auto& [key, st] : t.state_dict()) out[py::str(key)] = st.tensor.detach();
            return out;
          },
          "This rank's state by global name (model.*, optim.*, scaler.*, rng.*, engine.*), aliasing the live "
          "tensors (clone to keep a snapshot). Under ZeRO, a ZeRO-sharded tensor is this rank's flat segment.")
      .def("num_parameters", &Trainer::num_parameters)
      .def("flops_per_token", &Trainer::flops_per_token, py::arg("seq_len"))
      .def("is_logging_rank", &Trainer::is_logging_rank)
      .def("describe_stages", &Trainer::describe_stages)
      .def("schedule", &Trainer::schedule, "This step's pipeline schedule (a copy).")
      .def_property_readonly("layout", &Trainer::layout)
      .def("steps_taken", &Trainer::steps_taken)
      .def("last_pipeline_result", &Trainer::last_pipeline_result, "The executor's StepResult of the last step.")
      .def(
          "group", [](const Trainer& t, const std::string& dim) { return t.mesh().group(dim); }, py::arg("dim"),
          "The mesh group along \"pp\", \"dp\" or \"tp\".")
      .def(
          "coord", [](const Trainer& t, const std::string& dim) { return t.mesh().coord(dim); }, py::arg("dim"),
          "This rank's coordinate along a mesh dimension.");

  py::class_<GPTTrainer, Trainer, std::shared_ptr<GPTTrainer>>(m, "GPTTrainer",
                                                               "The engine over the reference GPT (gpt_model.h).")
      .def(py::init([](comm::ProcessGroupPtr world, const py::object& config, engine::ParallelLayout layout,
                       engine::OptimizerConfig optim, engine::TrainerOptions options) {
             models::GPTConfig native = native_config(config);
             py::gil_scoped_release release;
             return std::make_shared<GPTTrainer>(std::move(world), std::move(native), std::move(layout), optim,
                                                 options);
           }),
           py::arg("world"), py::arg("config"), py::arg("layout"), py::arg("optim") = engine::OptimizerConfig{},
           py::arg("options") = engine::TrainerOptions{},
           "Collective over world. config: torus.models.GPTConfig (or the native one).")
      .def_property_readonly("model_config", &GPTTrainer::model_config);
}

// Python keyword arguments -> `--name=value` flags for the one option table.
std::vector<std::string> kwargs_to_flags(const py::kwargs& kwargs) {
  std::vector<std::string> args;
  for (const auto& [key, value] : kwargs) {
    std::string name = py::str(key);
    std::string text;
    if (py::isinstance<py::bool_>(value)) {
      text = value.cast<bool>() ? "true" : "false";
    } else if (py::isinstance<py::float_>(value)) {
      text = py::repr(value).cast<std::string>();
    } else {
      text = py::str(value).cast<std::string>();
    }
    args.push_back("--" + name + "=" + text);
  }
  return args;
}

void bind_loop(py::module_& m) {
  py::class_<run::RunConfig>(m, "RunConfig",
                               "Every option of a training run (run_config.h); keywords are the options of "
                               "torus-train with dashes written as underscores.")
      .def(py::init([](const py::kwargs& kwargs) {
             run::RunConfig c;
             run::parse_run_config(kwargs_to_flags(kwargs), c);
             return c;
           }),
           "RunConfig(tp=2, pp=2, precision=\"bf16\", ...): parsed by the same table as the command line.")
      .def_static(
          "from_args",
          [](const std::vector<std::string>& args) -> py::object {
            run::RunConfig c;
            if (run::parse_run_config(args, c) == run::ParseOutcome::kHelp) return py::none();
            return py::cast(c);
          },
          py::arg("args"), "Parses command-line flags (config files included); None for --help.")
      .def_readwrite("layout", &run::RunConfig::layout, "the run's layout (ParallelLayout; its fields are options too)")
      .def("validate", &run::RunConfig::validate)
      .def("to_json", &run::RunConfig::to_json)
      .def("values", &run::RunConfig::values, "(name, text) of every option, in table order.")
      .def("__getattr__",
           [](const run::RunConfig& c, const std::string& name) -> py::object {
             std::string dashed = name;
             for (char& ch : dashed) {
               if (ch == '_') ch = '-';
             }
             py::object values = py::module_::import("json").attr("loads")(c.to_json());
             if (!values.contains(py::str(dashed))) throw py::attribute_error("RunConfig has no option '" + name + "'");
             return values[py::str(dashed)];
           })
      .def("__repr__", [](const run::RunConfig& c) { return "<torus.train.RunConfig " + c.to_json() + ">"; });
  m.def("run_config_help", &run::run_config_help, py::arg("program"), py::arg("description") = "");
  m.def("run_option_names", &run::run_option_names);

  py::class_<run::StepRecord>(m, "StepRecord", "One step of a TrainLoop (its metrics record).")
      .def_readonly("step", &run::StepRecord::step)
      .def_readonly("loss", &run::StepRecord::loss)
      .def_readonly("val_loss", &run::StepRecord::val_loss)
      .def_readonly("grad_norm", &run::StepRecord::grad_norm)
      .def_readonly("clip", &run::StepRecord::clip)
      .def_readonly("lr", &run::StepRecord::lr)
      .def_readonly("tokens_per_s", &run::StepRecord::tokens_per_s)
      .def_readonly("mfu", &run::StepRecord::mfu)
      .def_readonly("mem_bytes", &run::StepRecord::mem_bytes)
      .def_readonly("step_s", &run::StepRecord::step_s)
      .def_readonly("skipped", &run::StepRecord::skipped)
      .def_readonly("skipped_steps", &run::StepRecord::skipped_steps)
      .def_readonly("loss_scale", &run::StepRecord::loss_scale);

  py::class_<run::RunSummary>(m, "RunSummary")
      .def_readonly("steps", &run::RunSummary::steps)
      .def_readonly("wall_s", &run::RunSummary::wall_s)
      .def_readonly("tokens_per_s", &run::RunSummary::tokens_per_s)
      .def_readonly("first_loss", &run::RunSummary::first_loss)
      .def_readonly("final_loss", &run::RunSummary::final_loss)
      .def_readonly("final_val_loss", &run::RunSummary::final_val_loss)
      .def_readonly("out_dir", &run::RunSummary::out_dir)
      .def_readonly("peak_rss_bytes", &run::RunSummary::peak_rss_bytes, "this rank's peak resident set size")
      .def_readonly("job_peak_rss_bytes", &run::RunSummary::job_peak_rss_bytes, "the sum of every rank's peak");

  py::class_<run::TrainLoop, std::shared_ptr<run::TrainLoop>>(
      m, "TrainLoop", "The training loop of torus-train (train_loop.h). Lines go to sys.stdout.")
      .def(
          py::init([](comm::ProcessGroupPtr world, run::RunConfig config, std::string program) {
            py::gil_scoped_release release;
            if (config.plan) {  // the planner above the run chooses the layout (plan/planner.h)
              config.validate();
              config.layout = plan::plan_layout(world, config);
              config.plan = false;
            }
            auto loop = std::make_shared<run::TrainLoop>(std::move(world), std::move(config), std::move(program));
            loop->set_line_sink([](std::string_view line) {
              py::gil_scoped_acquire gil;
              py::module_::import("builtins").attr("print")(py::str(line.data(), line.size()), py::arg("flush") = true);
            });
            return loop;
          }),
          py::arg("world"), py::arg("config"), py::arg("program") = "torus-train",
          "Collective: validates the config, loads the data, builds the engine, measures the peak.")
      .def(
          "on_step",
          [](run::TrainLoop& loop, py::function fn) {
            loop.on_step([fn](const run::StepRecord& r) {
              py::gil_scoped_acquire gil;
              fn(r);
            });
          },
          py::arg("fn"), "fn(StepRecord) after every step, on every rank.")
      .def("run", &run::TrainLoop::run, Release(), "Runs every step. Collective; releases the GIL.")
      .def("trainer", &run::TrainLoop::trainer, py::return_value_policy::reference_internal)
      .def_property_readonly("config", &run::TrainLoop::config)
      .def_property_readonly("peak_flops", &run::TrainLoop::peak_flops)
      .def_property_readonly("memory_estimate", &run::TrainLoop::memory_estimate,
                             "The memory pre-check's estimate per rank (a MemoryEstimate).");
}

void bind_data(py::module_& m) {
  py::class_<run::LrSchedule>(m, "LrSchedule", "Linear warm-up, then cosine decay to a floor (lr_schedule.h).")
      .def(py::init([](double peak, double min, int64_t warmup_steps, int64_t total_steps) {
             run::LrSchedule s{peak, min, warmup_steps, total_steps};
             s.validate();
             return s;
           }),
           py::arg("peak") = 3e-4, py::arg("min") = 3e-5, py::arg("warmup_steps") = 0, py::arg("total_steps") = 1)
      .def_readwrite("peak", &run::LrSchedule::peak)
      .def_readwrite("min", &run::LrSchedule::min)
      .def_readwrite("warmup_steps", &run::LrSchedule::warmup_steps)
      .def_readwrite("total_steps", &run::LrSchedule::total_steps)
      .def("validate", &run::LrSchedule::validate)
      .def("at", &run::LrSchedule::at, py::arg("step"), "The rate of 0-based step.")
      .def("__call__", &run::LrSchedule::at, py::arg("step"));

  py::class_<run::CorpusSplit>(m, "CorpusSplit", "Training part and the held-out end of a corpus (bytes).")
      .def_property_readonly("train", [](const run::CorpusSplit& s) { return to_bytes(s.train); })
      .def_property_readonly("val", [](const run::CorpusSplit& s) { return to_bytes(s.val); });

  py::class_<run::Corpus>(m, "Corpus", "A byte corpus: a file, or a directory of files joined by newlines.")
      .def_static("load", &run::Corpus::load, py::arg("path"), Release(), "Reads a file or a directory.")
      .def_static(
          "from_bytes",
          [](const py::buffer& data, std::string source) {
            return run::Corpus::from_bytes(buffer_bytes(data), std::move(source));
          },
          py::arg("data"), py::arg("source") = "<memory>")
      .def_property_readonly(
          "data", [](const run::Corpus& c) { return to_bytes(c.bytes()); }, "The bytes (a copy).")
      .def_property_readonly("source", &run::Corpus::source)
      .def_property_readonly("files", &run::Corpus::files)
      .def("__len__", &run::Corpus::size)
      .def("split", &run::Corpus::split, py::arg("val_fraction"),
           "val: the last round(size * val_fraction) bytes; train: the rest.");
  m.def("default_corpus_path", &run::default_corpus_path);

  py::class_<OwningSampler, std::shared_ptr<OwningSampler>>(
      m, "BatchSampler", "Deterministic windows of seq_len + 1 bytes (Note [Deterministic batches]); owns a copy.")
      .def(py::init([](const py::buffer& data, int64_t seq_len, int64_t batch, uint64_t seed, std::string name) {
             return std::make_shared<OwningSampler>(buffer_bytes(data), seq_len, batch, seed, std::move(name));
           }),
           py::arg("data"), py::arg("seq_len"), py::arg("batch"), py::arg("seed"), py::arg("name") = "corpus")
      .def_property_readonly("seq_len", [](const OwningSampler& s) { return s.sampler().seq_len(); })
      .def_property_readonly("batch_size", [](const OwningSampler& s) { return s.sampler().batch_size(); })
      .def_property_readonly("window", [](const OwningSampler& s) { return s.sampler().window(); })
      .def_property_readonly("num_offsets", [](const OwningSampler& s) { return s.sampler().num_offsets(); })
      .def("__len__", &OwningSampler::data_size)
      .def(
          "offset", [](const OwningSampler& s, int64_t step, int64_t row) { return s.sampler().offset(step, row); },
          py::arg("step"), py::arg("row"))
      .def(
          "batch",
          [](const OwningSampler& s, int64_t step) {
            const auto& b = s.sampler();
            return tokens_tensor(b.batch(step), b.batch_size(), b.window());
          },
          py::arg("step"), "The batch of step: an int64 tensor [batch, seq_len + 1].")
      .def(
          "rows",
          [](const OwningSampler& s, int64_t step, int64_t first_row, int64_t count) {
            const auto& b = s.sampler();
            return tokens_tensor(b.rows(step, first_row, count), count, b.window());
          },
          py::arg("step"), py::arg("first_row"), py::arg("count"), "Rows of the batch of step: [count, seq_len + 1].");
}

void bind_report(py::module_& m) {
  m.def(
      "format_step_line",
      [](int64_t step, std::optional<double> loss, std::optional<double> val_loss, std::optional<double> grad_norm,
         std::optional<double> lr, std::optional<double> tokens_per_s, std::optional<double> mfu,
         std::optional<double> mem_bytes) {
        run::StepLine s;
        s.step = step;
        s.loss = loss.value_or(kNaN);
        s.val_loss = val_loss.value_or(kNaN);
        s.grad_norm = grad_norm.value_or(kNaN);
        s.lr = lr.value_or(kNaN);
        s.tokens_per_s = tokens_per_s.value_or(kNaN);
        s.mfu = mfu.value_or(kNaN);
        s.mem_bytes = mem_bytes.value_or(kNaN);
        return run::format_step_line(s);
      },
      py::arg("step"), py::kw_only(), py::arg("loss") = py::none(), py::arg("val_loss") = py::none(),
      py::arg("grad_norm") = py::none(), py::arg("lr") = py::none(), py::arg("tokens_per_s") = py::none(),
      py::arg("mfu") = py::none(), py::arg("mem_bytes") = py::none(),
      "\"step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB\"; "
      "fields that are None or NaN are left out; mfu is a fraction.");
  m.def("format_bytes", &torus::format_bytes, py::arg("bytes"));
  m.def("format_duration", &torus::format_duration, py::arg("seconds"));
  m.def("peak_rss_bytes", &run::peak_rss_bytes, "Peak resident set size of this process.");
  m.def("current_rss_bytes", &run::current_rss_bytes);
  m.def("render_progress", &run::ProgressBar::render, py::arg("done"), py::arg("total"), py::arg("tokens_per_s"),
        py::arg("eta_s"), py::arg("width") = 30,
        "The text of one progress bar: \"[####....] 40/200 step | 1520 tok/s | eta 1m12s\".");
}

// torus._C.checkpoint (python/torus/checkpoint.py documents it).
void bind_checkpoint(py::module_& m) {
  using engine::Trainer;
  py::class_<engine::Checkpointer, std::shared_ptr<engine::Checkpointer>>(
      m, "Checkpointer", "Saves a trainer's checkpoints (engine/checkpointing.h). Collective.")
      .def(py::init([](comm::ProcessGroupPtr world, std::shared_ptr<Trainer> trainer, const std::string& dir,
                       int64_t every, int keep_last, bool async_save, double peer_timeout_s,
                       const std::string& precision, const std::string& model, const std::string& data) {
             engine::CheckpointPolicy p;
             p.dir = dir;
             p.every = every;
             p.keep_last = keep_last;
             p.async = async_save;
             p.peer_timeout_s = peer_timeout_s;
             engine::RunDescription d;
             d.layout = engine::layout_json(*trainer, precision);
             d.model = model;
             d.data = data;
             py::gil_scoped_release release;
             auto c = std::shared_ptr<engine::Checkpointer>(new engine::Checkpointer(world, *trainer, p, d),
                                                           [trainer](engine::Checkpointer* x) { delete x; });
             return c;
           }),
           py::arg("world"), py::arg("trainer"), py::arg("dir"), py::arg("every") = 0, py::arg("keep_last") = 0,
           py::arg("async_save") = false, py::arg("peer_timeout_s") = 600.0,
           py::arg("precision") = "f32", py::arg("model") = "{}", py::arg("data") = "{}")
      .def("save", &engine::Checkpointer::save, py::arg("step"), py::arg("metrics") = "{}", Release(),
           "Saves now (collective; async: returns after the snapshot).")
      .def("after_step", &engine::Checkpointer::after_step, py::arg("step"), py::arg("last"), py::arg("metrics") = "{}",
           Release())
      .def("wait", &engine::Checkpointer::wait, Release(),
           "Waits for a background save and agrees on its success (collective).")
      .def_property_readonly("last_stall_s", &engine::Checkpointer::last_stall_s)
      .def_property_readonly("last_save_s", &engine::Checkpointer::last_save_s)
      .def_property_readonly("last_path", &engine::Checkpointer::last_path)
      .def_property_readonly("run_id", &engine::Checkpointer::run_id);

  m.def(
      "resume",
      [](const comm::ProcessGroupPtr& world, Trainer& trainer, const std::string& spec, const std::string& dir,
         const std::string& precision) {
        engine::LoadReport r;
        {
          py::gil_scoped_release release;
          r = engine::resume(world, trainer, spec, dir, engine::layout_json(trainer, precision));
        }
        py::dict d;
        d["path"] = r.path;
        d["step"] = r.step;
        d["same_layout"] = r.same_layout;
        d["kept"] = r.kept;
        return d;
      },
      py::arg("world"), py::arg("trainer"), py::arg("spec"), py::arg("dir") = "",
      py::arg("precision") = "f32",
      "Loads a checkpoint into the trainer in any layout (collective); spec: 'auto' or a path.");
  m.def(
      "list",
      [](const std::string& dir) {
        py::list out;
        for (const auto& l : ckpt::list_checkpoints(dir)) {
          py::dict d;
          d["path"] = l.path;
          d["step"] = l.step;
          d["complete"] = l.complete;
          d["problem"] = l.problem;
          out.append(d);
        }
        return out;
      },
      py::arg("dir"), "The checkpoints in a save directory, oldest first.");
  m.def(
      "verify",
      [](const std::string& path) {
        py::gil_scoped_release release;
        const auto ck = ckpt::Checkpoint::open(path);
        ck.verify();
        for (const auto& [name, t] : ck.tensors()) (void)ck.read_full(name);
        return ck.info().step;
      },
      py::arg("path"), "Checks every file's SHA-256 and header; returns the step. Raises CheckpointError.");
  m.def(
      "export",
      [](const std::string& path, const std::string& out, const std::string& prefix) {
        py::gil_scoped_release release;
        const auto ck = ckpt::Checkpoint::open(path);
        return ckpt::export_safetensors(ck, out, prefix);
      },
      py::arg("path"), py::arg("out"), py::arg("prefix") = "model.",
      "One consolidated safetensors file of the full tensors named prefix* (without it).");
}

}  // namespace

void bind_train(py::module_& m) {
  auto checkpoint = m.def_submodule("checkpoint", "Sharded checkpoints (torus::ckpt, torus::train checkpointing).");
  bind_checkpoint(checkpoint);
  auto train = m.def_submodule("train", "The training engine, loop and utilities (torus::train).");
  bind_layout(train);
  bind_trainer(train);
  bind_loop(train);
  bind_data(train);
  bind_report(train);
}

}  // namespace torus::python
