// Bindings of the parallel modules and the reference GPT (torus._C.tp,
// torus._C.dp, torus._C.models, torus._C.ParallelGroups).
//
// The Python layers (python/torus/parallel.py, models.py) are torch.nn.Modules
// whose parameters live in Python; their forward calls the functional forms
// bound here, so every collective runs inside the C++ autograd functions.
// Every call that may communicate releases the GIL. A group argument of None
// is a group of one rank (no communication).
#include <optional>
#include <tuple>

#include "bindings.h"
#include "torus/core/error.h"
#include "torus/models/gpt.h"
#include "torus/parallel/data/ddp.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/cross_entropy.h"
#include "torus/parallel/tensor/layers.h"
#include "torus/parallel/tensor/mappings.h"
#include "torus/parallel/tensor/random.h"
#include "torus/parallel/tensor/sharding.h"

namespace py = pybind11;

namespace torus::python {
namespace {

using comm::ProcessGroupPtr;
using Release = py::call_guard<py::gil_scoped_release>;

at::Tensor opt(const std::optional<at::Tensor>& t) {
  return t ? *t : at::Tensor();
}

tp::InitSpec::Kind init_kind(const std::string& kind) {
  if (kind == "normal") return tp::InitSpec::Kind::kNormal;
  if (kind == "zeros") return tp::InitSpec::Kind::kZeros;
  if (kind == "ones") return tp::InitSpec::Kind::kOnes;
  throw torus::InvalidArgument("init kind must be 'normal', 'zeros' or 'ones', got '" + kind + "'");
}

void bind_tp(py::module_& m) {
  auto tp = m.def_submodule("tp", "Tensor and sequence parallelism (torus::tp).");
  const char* mapping_doc = "Region mapping (autograd); see torus/parallel/tensor/mappings.h.";
  tp.def("copy_to_tp_region", &tp::copy_to_tp_region, py::arg("x"), py::arg("group"), Release(), mapping_doc);
  tp.def("reduce_from_tp_region", &tp::reduce_from_tp_region, py::arg("x"), py::arg("group"), Release(), mapping_doc);
  tp.def("scatter_to_tp_region", &tp::scatter_to_tp_region, py::arg("x"), py::arg("group"), Release(), mapping_doc);
  tp.def("gather_from_tp_region", &tp::gather_from_tp_region, py::arg("x"), py::arg("group"), Release(), mapping_doc);
  tp.def("scatter_to_sequence_region", &tp::scatter_to_sequence_region, py::arg("x"), py::arg("group"), Release(),
         mapping_doc);
  tp.def("gather_from_sequence_region", &tp::gather_from_sequence_region, py::arg("x"), py::arg("group"),
         py::arg("partial_grad") = true, Release(), mapping_doc);
  tp.def("reduce_scatter_to_sequence_region", &tp::reduce_scatter_to_sequence_region, py::arg("x"), py::arg("group"),
         Release(), mapping_doc);
  tp.def("all_gather_along", &tp::all_gather_along, py::arg("x"), py::arg("dim"), py::arg("group"), Release(),
         "All-gather along a dimension (not differentiable).");

  tp.def(
      "column_parallel_linear",
      [](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, const ProcessGroupPtr& g,
         bool gather_output, bool sequence_parallel) {
        return tp::column_parallel_linear(x, w, opt(b), g, {gather_output, sequence_parallel});
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("group"), py::arg("gather_output") = false,
      py::arg("sequence_parallel") = false, Release());
  tp.def(
      "row_parallel_linear",
      [](const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, const ProcessGroupPtr& g,
         bool input_is_parallel, bool sequence_parallel) {
        return tp::row_parallel_linear(x, w, opt(b), g, {input_is_parallel, sequence_parallel});
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("group"), py::arg("input_is_parallel") = true,
      py::arg("sequence_parallel") = false, Release());
  tp.def("vocab_parallel_embedding", &tp::vocab_parallel_embedding, py::arg("tokens"), py::arg("weight"),
         py::arg("group"), py::arg("reduce_scatter_output") = false, Release());
  tp.def(
      "vocab_parallel_cross_entropy",
      [](const at::Tensor& logits, const at::Tensor& targets, const ProcessGroupPtr& g, int64_t vocab_size,
         int64_t ignore_index) {
        return tp::vocab_parallel_cross_entropy(logits, targets, g, {vocab_size, ignore_index});
      },
      py::arg("logits"), py::arg("targets"), py::arg("group"), py::arg("vocab_size") = -1,
      py::arg("ignore_index") = -100, Release(), "Per-token loss; the logits' vocabulary is split over TP.");

  tp.def("derive_seed", &tp::derive_seed, py::arg("seed"), py::arg("name"));
  tp.def("pad_vocab", &tp::pad_vocab, py::arg("vocab"), py::arg("tp_size"), py::arg("multiple") = 1);
  tp.def(
      "init_shard",
      [](std::vector<int64_t> shape, int dim, int64_t full_size, int64_t padded, const std::string& kind, double std,
         uint64_t seed, int rank, int size, at::ScalarType dtype) {
        tp::ShardSpec spec{dim, full_size, false};
        return tp::init_shard(shape, spec, padded, {init_kind(kind), std, seed}, rank, size,
                              at::TensorOptions().dtype(dtype));
      },
      py::arg("shape"), py::arg("dim"), py::arg("full_size"), py::arg("padded"), py::arg("kind"), py::arg("std"),
      py::arg("seed"), py::arg("rank"), py::arg("size"), py::arg("dtype"),
      "This rank's shard of a layout-independent initial value (on the CPU).");
  tp.def(
      "gather_full",
      [](const at::Tensor& shard, int dim, int64_t full_size, const ProcessGroupPtr& g) {
        return tp::gather_full(shard, tp::ShardSpec{dim, full_size, false}, g);
      },
      py::arg("shard"), py::arg("dim"), py::arg("full_size"), py::arg("group"), Release());

  py::enum_<tp::RngRegion>(tp, "RngRegion", "Note [Dropout RNG rule]")
      .value("REPLICATED", tp::RngRegion::kReplicated)
      .value("SHARDED", tp::RngRegion::kSharded);
  py::class_<tp::RngTracker, std::shared_ptr<tp::RngTracker>>(tp, "RngTracker",
                                                              "The dropout streams of one model replica.")
      .def(py::init<uint64_t, int, c10::Device, int>(), py::arg("seed"), py::arg("tp_rank"),
           py::arg("device") = c10::Device(c10::kCPU), py::arg("stage") = 0)
      .def(
          "generator", [](tp::RngTracker& t, tp::RngRegion r) { return t.generator(r); }, py::arg("region"))
      .def("get_state",
           [](const tp::RngTracker& t) {
             auto s = t.get_state();
             return std::make_tuple(s.replicated, s.sharded);
           })
      .def("set_state", [](tp::RngTracker& t, const std::tuple<at::Tensor, at::Tensor>& s) {
        t.set_state({std::get<0>(s), std::get<1>(s)});
      });
  tp.def(
      "dropout",
      [](const at::Tensor& x, double p, bool training, tp::RngTracker& tracker, tp::RngRegion region) {
        return tp::dropout(x, p, training, tracker.generator(region));
      },
      py::arg("x"), py::arg("p"), py::arg("training"), py::arg("tracker"), py::arg("region"));
}

void bind_dp(py::module_& m) {
  auto dp = m.def_submodule("dp", "Data parallelism (torus::dp).");
  using DDP = dp::DistributedDataParallel;
  py::class_<DDP, std::shared_ptr<DDP>>(dp, "DistributedDataParallel",
                                        "Gradient buckets reduced from backward hooks; see torus/parallel/data/ddp.h.")
      .def(py::init([](const std::vector<std::tuple<std::string, at::Tensor, int, int64_t, bool>>& params,
                       const parallel::ParallelGroups& groups, int64_t bucket_cap_bytes, int64_t first_bucket_cap_bytes,
                       bool average, bool overlap, bool finish_in_backward, bool broadcast_parameters,
                       bool shared_host_buckets) {
             std::vector<dp::NamedParameter> named;
             for (const auto& [name, tensor, dim, full_size, partial] : params) {
               named.push_back({name, tensor, {dim, full_size, partial}});
             }
             dp::DDPOptions o{bucket_cap_bytes, first_bucket_cap_bytes, average,
                              overlap,          finish_in_backward,     broadcast_parameters,
                              shared_host_buckets};
             py::gil_scoped_release release;
             return std::make_shared<DDP>(std::move(named), groups, o);
           }),
           py::arg("params"), py::arg("groups"), py::arg("bucket_cap_bytes") = int64_t{25} << 20,
           py::arg("first_bucket_cap_bytes") = int64_t{1} << 20, py::arg("average") = true, py::arg("overlap") = true,
           py::arg("finish_in_backward") = true, py::arg("broadcast_parameters") = true,
           py::arg("shared_host_buckets") = true,
           "params: (name, tensor, shard dim, full size, gradient partial over TP) tuples.")
      .def("start_grad_sync", &DDP::start_grad_sync, Release())
      .def("finish_grad_sync", &DDP::finish_grad_sync, Release())
      .def("zero_grad", &DDP::zero_grad, py::arg("set_to_none") = false, Release())
      .def("broadcast_parameters", &DDP::broadcast_parameters, Release())
      .def_property("grad_sync_enabled", &DDP::grad_sync_enabled, &DDP::set_grad_sync_enabled)
      .def("stats",
           [](const DDP& d) {
             auto s = d.stats();
             py::dict out;
             out["syncs"] = s.syncs;
             out["buckets_started_in_backward"] = s.buckets_started_in_backward;
             out["buckets_started_late"] = s.buckets_started_late;
             out["grads_restored"] = s.grads_restored;
             return out;
           })
      .def("buckets", [](const DDP& d) {
        py::list out;
        for (const auto& b : d.buckets()) {
          py::list names;
          for (const auto& s : b.slots) names.append(s.name);
          py::dict e;
          e["index"] = b.index;
          e["numel"] = b.flat.numel();
          e["group_size"] = b.group->size();
          e["params"] = names;
          out.append(e);
        }
        return out;
      });
}

void bind_models(py::module_& m) {
  auto models = m.def_submodule("models", "The reference GPT in C++ (torus::models).");
  using ep::MoEConfig;
  py::class_<MoEConfig>(models, "MoEConfig",
                        "A mixture-of-experts layer (parallel/expert/moe.h); the GPT fills in sizes and seeds.")
      .def(py::init<>())
      .def_readwrite("num_experts", &MoEConfig::num_experts)
      .def_readwrite("top_k", &MoEConfig::top_k)
      .def_readwrite("capacity_factor", &MoEConfig::capacity_factor, "0: dropless")
      .def_readwrite("aux_loss_weight", &MoEConfig::aux_loss_weight)
      .def_readwrite("z_loss_weight", &MoEConfig::z_loss_weight)
      .def_readwrite("aux_loss_free", &MoEConfig::aux_loss_free)
      .def_readwrite("bias_update_rate", &MoEConfig::bias_update_rate)
      .def_readwrite("jitter", &MoEConfig::jitter)
      .def_readwrite("normalize_gates", &MoEConfig::normalize_gates)
      .def_readwrite("expert_tensor_parallel", &MoEConfig::expert_tensor_parallel,
                     "split each expert's MLP over TP instead of holding whole experts on every TP rank")
      .def_readwrite("ffn_hidden", &MoEConfig::ffn_hidden, "each expert's MLP width (0: the GPT's ffn)");
  using models::GPTConfig;
  py::class_<GPTConfig>(models, "GPTConfig")
      .def(py::init<>())
      .def_readwrite("vocab_size", &GPTConfig::vocab_size)
      .def_readwrite("max_seq_len", &GPTConfig::max_seq_len)
      .def_readwrite("num_layers", &GPTConfig::num_layers)
      .def_readwrite("hidden", &GPTConfig::hidden)
      .def_readwrite("num_heads", &GPTConfig::num_heads)
      .def_readwrite("ffn_hidden", &GPTConfig::ffn_hidden)
      .def_readwrite("dropout", &GPTConfig::dropout)
      .def_readwrite("attention_dropout", &GPTConfig::attention_dropout)
      .def_readwrite("layernorm_eps", &GPTConfig::layernorm_eps)
      .def_readwrite("tie_embeddings", &GPTConfig::tie_embeddings)
      .def_readwrite("sequence_parallel", &GPTConfig::sequence_parallel)
      .def_readwrite("vocab_pad_multiple", &GPTConfig::vocab_pad_multiple)
      .def_readwrite("init_std", &GPTConfig::init_std)
      .def_readwrite("seed", &GPTConfig::seed)
      .def_readwrite("dtype", &GPTConfig::dtype)
      .def_readwrite("device", &GPTConfig::device)
      .def_readwrite("moe_every", &GPTConfig::moe_every, "every K-th block has an MoE MLP (0: dense)")
      .def_readwrite("moe", &GPTConfig::moe, "the MoE layers' settings (a torus.models.MoEConfig)")
      .def_property(
          "recompute", [](const GPTConfig& c) { return c.recompute.name(); },
          [](GPTConfig& c, const std::string& policy) { c.recompute = recompute::Policy::parse(policy); },
          "activation recompute: \"none\", \"full\", \"every:K\" or \"selective\" (docs/recompute.md)")
      .def("validate", &GPTConfig::validate, py::arg("tp_size"))
      .def("validate_sequence", &GPTConfig::validate_sequence, py::arg("seq_len"), py::arg("tp_size"))
      .def_static("tiny", &GPTConfig::tiny)
      .def_static("small", &GPTConfig::small)
      .def_static("gpt2", &GPTConfig::gpt2);
  py::class_<models::GPT, std::shared_ptr<models::GPT>>(
      models, "GPT", "The C++ GPT (a torch::nn::Module); torus.models.GPT is its Python twin.")
      .def(py::init<const GPTConfig&, const parallel::ParallelGroups&>(), py::arg("config"),
           py::arg("groups") = parallel::ParallelGroups{})
      .def("forward", &models::GPT::forward, py::arg("tokens"), Release())
      .def("loss", &models::GPT::loss, py::arg("tokens"), py::arg("labels"), Release())
      .def(
          "train", [](models::GPT& g, bool on) { g.train(on); }, py::arg("mode") = true)
      .def("eval", [](models::GPT& g) { g.eval(); })
      .def("named_parameters", [](const models::GPT& g) {
        py::dict out;
        for (const auto& p : g.named_parameters()) out[py::str(p.key())] = p.value();
        return out;
      });
}

}  // namespace

void bind_parallel(py::module_& m) {
  py::class_<parallel::ParallelGroups>(m, "ParallelGroups",
                                       "The groups a parallel module talks over (None: a group of one rank).")
      .def(py::init([](ProcessGroupPtr tp, ProcessGroupPtr dp, ProcessGroupPtr dp_tp) {
             return parallel::ParallelGroups{std::move(tp), std::move(dp), std::move(dp_tp)};
           }),
           py::arg("tp") = nullptr, py::arg("dp") = nullptr, py::arg("dp_tp") = nullptr)
      .def_static("from_mesh", &parallel::ParallelGroups::from_mesh, py::arg("mesh"))
      .def_readwrite("tp", &parallel::ParallelGroups::tp)
      .def_readwrite("dp", &parallel::ParallelGroups::dp)
      .def_readwrite("dp_tp", &parallel::ParallelGroups::dp_tp)
      .def_property_readonly("tp_size", &parallel::ParallelGroups::tp_size)
      .def_property_readonly("tp_rank", &parallel::ParallelGroups::tp_rank)
      .def_property_readonly("dp_size", &parallel::ParallelGroups::dp_size)
      .def_property_readonly("dp_rank", &parallel::ParallelGroups::dp_rank);
  bind_tp(m);
  bind_dp(m);
  bind_models(m);
}

}  // namespace torus::python
