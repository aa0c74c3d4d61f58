// The layout planner (planner.h, Note [Planner model]).
#include "torus/plan/planner.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "core/log.h"
#include "torus/core/error.h"
#include "torus/parallel/pipeline/schedule.h"
#include "torus/engine/memory_plan.h"
#include "torus/run/metrics.h"
#include "torus/engine/model.h"
#include "torus/run/peak_flops.h"
#include "torus/run/train_loop.h"
#include "torus/run/registry.h"

namespace torus::plan {
namespace {

using Json = nlohmann::json;

// What the cost model reads of the model, once per recompute policy.
struct ModelFacts {
  std::shared_ptr<engine::Model> model;
  int64_t layers = 0, hidden = 0, heads = 0, vocab = 0, moe_blocks = 0, top_k = 0;
  double flops_per_token = 0;
  int64_t num_parameters = 0;
};

ModelFacts facts_of(const run::RunConfig& c) {
  ModelFacts f;
  f.model = run::make_model(c);
  const Json j = Json::parse(f.model->config_json());
  f.layers = j.value("num_layers", int64_t{0});
  f.hidden = j.value("hidden", int64_t{0});
  f.heads = j.value("num_heads", int64_t{0});
  f.vocab = j.value("vocab_size", int64_t{0});
  const int64_t every = j.value("moe_every", int64_t{0});
  f.moe_blocks = every > 0 ? f.layers / every : 0;
  f.top_k = j.value("top_k", int64_t{0});
  f.flops_per_token = f.model->flops_per_token(c.seq);
  f.num_parameters = f.model->num_parameters();
  return f;
}

std::vector<int> divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(static_cast<int>(d));
  }
  return out;
}

double act_bytes_of(const run::RunConfig& c) {
  if (c.precision == "f32") return c.autocast ? 2.0 : 4.0;
  if (c.precision == "f64") return 8.0;
  return 2.0;
}

// Bandwidth (bytes/s per device) and latency of a group of `size` ranks
// whose members are `stride` ranks apart (tp innermost: comm/mesh_layout.h).
struct Link {
  double bw = 0, latency = 0;
};
Link link_of(const Hardware& hw, int nodes, int64_t stride, int64_t size) {
  const bool crosses = nodes > 1 && stride * size > hw.devices_per_node;
  if (crosses) return {hw.network_bw / hw.devices_per_node, hw.network_latency};
  return {hw.intra_node_bw, hw.intra_latency};
}

MemoryBreakdown breakdown_of(const engine::MemoryEstimate& e) {
  MemoryBreakdown m;
  m.parameters = static_cast<double>(e.parameters);
  m.gradients = static_cast<double>(e.gradients);
  m.optimizer = static_cast<double>(e.optimizer);
  m.activations = static_cast<double>(e.activations);
  m.buffers = static_cast<double>(e.buffers);
  m.host_optimizer = static_cast<double>(e.host_optimizer);
  m.host_parameters = static_cast<double>(e.host_parameters);
  return m;
}

// Everything about one layout (Note [Planner model]); `c` carries it.
Candidate evaluate(const PlanRequest& req, const ModelFacts& f, const run::RunConfig& c, int64_t devices) {
  const Hardware& hw = req.hardware;
  Candidate k;
  k.config = c;
  const engine::ParallelLayout l = run::run_layout(c, static_cast<int>(devices));
  {
    engine::ModelLayout ml;
    ml.tp = l.tp;
    ml.sequence_parallel = l.sequence_parallel;
    ml.num_stages = l.num_stages();
    ml.blocks_per_stage = l.layers_per_stage;
    ml.ep = l.ep;
    f.model->validate(ml);
    f.model->validate_sequence(c.seq, ml);
  }
  const int64_t b = run::run_micro_batch_rows(c, l);
  k.micro_batch_rows = b;
  const engine::TrainerOptions opts = run::run_trainer_options(c);
  const engine::OptimizerConfig optim = run::run_optimizer(c);
  const engine::MemoryEstimate e = engine::estimate_memory(*f.model, l, opts, b, c.seq, optim);
  k.memory = breakdown_of(e);
  const double device_budget = hw.device_memory * req.memory_fraction;
  const double host_budget = hw.devices_per_node > 0 ? hw.host_memory / hw.devices_per_node : 0;
  if (hw.host_link_bw <= 0) {
    // Device and host are one memory (a CPU run): everything counts.
    k.fits = k.memory.device() + k.memory.host() <= device_budget;
    if (!k.fits) {
      k.why_not = fmt::format("needs {} per rank, {} usable", torus::format_bytes(k.memory.device() + k.memory.host()),
                              torus::format_bytes(device_budget));
    }
  } else {
    k.fits = k.memory.device() <= device_budget && k.memory.host() <= host_budget;
    if (k.memory.device() > device_budget) {
      k.why_not = fmt::format("needs {} per device, {} usable", torus::format_bytes(k.memory.device()),
                              torus::format_bytes(device_budget));
    } else if (!k.fits) {
      k.why_not = fmt::format("offload needs {} of host memory per device, {} available",
                              torus::format_bytes(k.memory.host()), torus::format_bytes(host_budget));
    }
  }

  const double eff = req.efficiency > 0 ? req.efficiency : hw.efficiency;
  const bool half = c.precision == "bf16" || c.precision == "fp16" || c.autocast;
  const double peak = half ? hw.peak_flops_16 : hw.peak_flops_32;
  const double tokens = static_cast<double>(c.batch) * static_cast<double>(c.seq);
  const double model_flops = f.flops_per_token * tokens;
  const double h = static_cast<double>(f.hidden), s = static_cast<double>(c.seq), L = static_cast<double>(f.layers);
  const bool full = c.layout.recompute == "full";
  double recompute_flops = 0;
  if (full) {
    recompute_flops = (f.flops_per_token - 6.0 * static_cast<double>(f.vocab) * h) / 3.0 * tokens;
  } else if (c.layout.recompute == "selective") {
    recompute_flops = 4.0 * L * s * h * tokens;  // the attention core's forward
  }
  const double D = static_cast<double>(devices);
  k.compute_s = model_flops / (D * peak * eff);
  k.recompute_s = recompute_flops / (D * peak * eff);
  const double busy = k.compute_s + k.recompute_s;
  k.bubble_fraction = l.pp > 1 ? pp::closed_form_bubble(l.schedule, l.pp, l.num_micro, l.num_chunks) : 0.0;
  k.bubble_s = busy * k.bubble_fraction / (1.0 - k.bubble_fraction);

  const double A = act_bytes_of(c);
  const double m = l.num_micro;
  const double msg = static_cast<double>(b) * s * h * A;  // one micro-batch's activations of width h
  const double blocks_per_rank = L / l.pp;
  if (l.tp > 1) {
    const double t = l.tp;
    const Link tl = link_of(hw, req.nodes, 1, l.tp);
    const double collectives = blocks_per_rank * m * (full ? 6.0 : 4.0);
    k.tp_bytes = collectives * 2.0 * (t - 1) / t * msg;
    k.tp_s = k.tp_bytes / tl.bw + collectives * 2.0 * (t - 1) * tl.latency;
  }
  if (l.pp > 1) {
    const Link pl = link_of(hw, req.nodes, int64_t{l.tp} * l.dp * l.ep, l.pp);
    const double messages = 2.0 * m * l.num_chunks;  // forward activation and backward gradient per chunk
    k.pp_bytes = messages * msg / (l.sequence_parallel ? l.tp : 1);
    k.pp_s = k.pp_bytes / pl.bw + messages * pl.latency;
  }
  const int64_t N = int64_t{l.dp} * l.ep;
  if (N > 1) {
    const Link dl = link_of(hw, req.nodes, l.tp, N);
    const double psi = static_cast<double>(f.num_parameters) / (l.tp * l.pp);
    const double P = static_cast<double>(c10::elementSize(f.model->param_dtype()));
    const double G = opts.grads_in_param_dtype || !(c.precision == "bf16" || c.precision == "fp16") ? P : 4.0;
    const double share = static_cast<double>(N - 1) / N;
    double units = 0;  // bytes of Ψ moved, before the ring factor
    double collectives = 0;
    switch (c.layout.zero) {
      case 0: units = 2 * G; collectives = 1; break;
      case 1: units = G + P; collectives = 2; break;
      case 2: units = m * G + P; collectives = m + 1; break;
      default: units = m * (G + (full ? 3.0 : 2.0) * P); collectives = m * (full ? 4.0 : 3.0); break;
    }
    k.dp_bytes = share * units * psi;
    // Per collective, one latency per ring step (bucketed: per block).
    k.dp_s = k.dp_bytes / dl.bw + collectives * blocks_per_rank * static_cast<double>(N - 1) * dl.latency;
  }
  if (l.ep > 1 && f.moe_blocks > 0) {
    const Link el = link_of(hw, req.nodes, l.tp, l.ep);
    const double moe_per_rank = static_cast<double>(f.moe_blocks) / l.pp;
    const double alltoalls = moe_per_rank * m * 4.0;
    // Each tp rank routes s b / t tokens (the MoE layer splits them over tp
    // when the sequence is not split already).
    k.ep_bytes = alltoalls * msg * static_cast<double>(f.top_k) * (l.ep - 1) / l.ep / l.tp;
    k.ep_s = k.ep_bytes / el.bw + alltoalls * el.latency;
  }
  if (c.layout.expert_tp && l.tp > 1 && f.moe_blocks > 0) {
    // Note [Expert tensor parallelism]: per MoE block and micro-batch, each
    // direction sends this rank's dispatched rows to the other tp ranks and
    // their partial outputs back (two uneven all-to-alls over tp), after an
    // all-gather of the counts: 4 exchanges forward and backward.
    const Link tl = link_of(hw, req.nodes, 1, l.tp);
    const double t = l.tp;
    const double exchanges = static_cast<double>(f.moe_blocks) / l.pp * m * 4.0;
    const double bytes = exchanges * msg * static_cast<double>(f.top_k) * (t - 1) / t;
    k.tp_bytes += bytes;
    k.tp_s += bytes / tl.bw + exchanges * 1.5 * (t - 1) * tl.latency;
  }
  if (c.layout.offload != dp::Offload::kNone && hw.host_link_bw > 0) {
    // Gradient shard down, parameter shard up, the CPU Adam pass over fp32
    // masters and moments (16 bytes a parameter, read and written).
    const double shard = static_cast<double>(f.num_parameters) / (l.tp * l.pp) / l.dp;
    const double P = static_cast<double>(c10::elementSize(f.model->param_dtype()));
    k.offload_s = shard * (4.0 + P) / hw.host_link_bw + shard * 32.0 / hw.host_link_bw;
  }
  k.step_s = busy + k.bubble_s + k.tp_s + k.pp_s + k.dp_s + k.ep_s + k.offload_s;
  k.tokens_per_s = tokens / k.step_s;
  k.model_tflops_per_device = model_flops / k.step_s / D / 1e12;
  k.mfu = model_flops / k.step_s / (D * peak);
  return k;
}

std::vector<std::string> or_default(const std::vector<std::string>& v, std::vector<std::string> d) {
  return v.empty() ? d : v;
}

void check_request(const PlanRequest& r) {
  TORUS_CHECK(r.nodes >= 1, InvalidArgument, "planner: --nodes must be >= 1, got {}", r.nodes);
  TORUS_CHECK(r.hardware.devices_per_node >= 1, InvalidArgument,
              "planner: hardware '{}' has no devices per node (cpu: measure it first)", r.hardware.name);
  TORUS_CHECK(r.hardware.device_memory > 0 && (r.hardware.peak_flops_16 > 0 || r.hardware.peak_flops_32 > 0),
              InvalidArgument, "planner: hardware '{}' has no memory or peak", r.hardware.name);
  TORUS_CHECK(r.memory_fraction > 0 && r.memory_fraction <= 1, InvalidArgument,
              "planner: the usable memory fraction must be in (0, 1], got {}", r.memory_fraction);
  TORUS_CHECK(r.efficiency >= 0 && r.efficiency <= 1, InvalidArgument,
              "planner: --efficiency must be in (0, 1] (0: the hardware's), got {}", r.efficiency);
  r.run.validate();
}

std::string gb(double bytes) { return fmt::format("{:.1f}", bytes / 1e9); }

// "7.50B", "355M", "12.3K".
std::string count_str(double n) {
  if (n >= 1e12) return fmt::format("{:.3g}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.3g}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.3g}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

Json candidate_json(const Candidate& k) {
  const parallel::Layout& l = k.config.layout;
  Json mesh = Json::array();  // the names of the mesh's dimensions, each a key below
  for (const parallel::LayoutField& f : parallel::layout_fields()) {
    if (f.mesh) mesh.push_back(f.json_key());
  }
  Json j = {{"layout", k.layout()}, {"args", l.args()}, {"mesh", mesh}};
  // Every field of the layout under its JSON key (parallel/layout.h).
  const Json fields = Json::parse(l.to_json());
  for (const auto& [key, value] : fields.items()) j[key] = value;
  j.update(Json{{"micro_batch_rows", k.micro_batch_rows}, {"fits", k.fits}, {"why_not", k.why_not},
              {"memory_bytes", {{"parameters", k.memory.parameters}, {"gradients", k.memory.gradients},
                                {"optimizer", k.memory.optimizer}, {"activations", k.memory.activations},
                                {"buffers", k.memory.buffers}, {"device", k.memory.device()},
                                {"host_optimizer", k.memory.host_optimizer},
                                {"host_parameters", k.memory.host_parameters}, {"host", k.memory.host()}}},
              {"seconds", {{"compute", k.compute_s}, {"recompute", k.recompute_s}, {"bubble", k.bubble_s},
                           {"tp", k.tp_s}, {"pp", k.pp_s}, {"dp", k.dp_s}, {"ep", k.ep_s},
                           {"offload", k.offload_s}, {"step", k.step_s}}},
              {"bytes_sent_per_device", {{"tp", k.tp_bytes}, {"pp", k.pp_bytes}, {"dp", k.dp_bytes},
                                         {"ep", k.ep_bytes}}},
              {"bubble_fraction", k.bubble_fraction}, {"tokens_per_s", k.tokens_per_s},
              {"model_tflops_per_device", k.model_tflops_per_device}, {"mfu", k.mfu}});
  return j;
}

}  // namespace

std::string Candidate::layout() const {
  const parallel::Layout& l = config.layout;
  std::string s = fmt::format("tp={} pp={} dp={}", l.tp, l.pp, l.dp);
  if (l.ep > 1) s += fmt::format(" ep={}", l.ep);
  if (l.sequence_parallel) s += " sp";
  if (l.expert_tp) s += " expert-tp";
  s += fmt::format(" zero={}", l.zero);
  if (l.offload != dp::Offload::kNone) s += " offload=" + std::string(dp::offload_name(l.offload));
  s += " recompute=" + l.recompute;
  if (l.pp > 1) {
    s += " " + std::string(pp::schedule_kind_name(l.schedule)) +
         (l.num_chunks > 1 ? fmt::format(" v={}", l.num_chunks) : std::string());
  }
  s += fmt::format(" m={} b={}", l.num_micro, micro_batch_rows);
  return s;
}

const Candidate* Plan::best() const {
  return !candidates.empty() && candidates.front().fits ? &candidates.front() : nullptr;
}

Candidate evaluate_layout(const PlanRequest& request) {
  check_request(request);
  const int64_t devices = int64_t{request.nodes} * request.hardware.devices_per_node;
  const ModelFacts f = facts_of(request.run);
  return evaluate(request, f, request.run, devices);
}

Plan make_plan(const PlanRequest& request) {
  check_request(request);
  Plan plan;
  plan.request = request;
  const Hardware& hw = request.hardware;
  const int64_t D = int64_t{request.nodes} * hw.devices_per_node;
  plan.devices = D;
  const std::vector<int> zeros = request.zero_stages.empty() ? std::vector<int>{0, 1, 2, 3} : request.zero_stages;
  const std::vector<std::string> recomputes = or_default(request.recompute, {"none", "selective", "full"});
  const std::vector<std::string> schedules = or_default(request.schedules, {"1f1b", "interleaved", "zb-h1"});
  const std::vector<int64_t> rows =
      request.micro_batch_rows.empty() ? std::vector<int64_t>{1, 2, 4, 8} : request.micro_batch_rows;
  const run::RunConfig& base = request.run;
  const int64_t B = base.batch;

  // The model per recompute policy and, for MoE, with and without expert
  // tensor parallelism (its parameter shapes differ).
  const bool moe = base.moe_every > 0;
  const std::vector<bool> expert_tps = moe ? std::vector<bool>{false, true} : std::vector<bool>{base.layout.expert_tp};
  auto model_key = [](const std::string& rc, bool etp) { return rc + (etp ? "+expert-tp" : ""); };
  std::map<std::string, ModelFacts> models;
  std::vector<std::pair<std::string, bool>> model_choices;
  for (const std::string& rc : recomputes) {
    for (bool etp : expert_tps) {
      run::RunConfig c = base;
      c.layout.recompute = rc;
      c.layout.expert_tp = etp;
      models.emplace(model_key(rc, etp), facts_of(c));
      model_choices.emplace_back(rc, etp);
    }
  }
  const ModelFacts& any = models.begin()->second;
  plan.num_parameters = any.num_parameters;
  plan.flops_per_token = any.flops_per_token;
  const int64_t L = any.layers;

  for (int tp : divisors(hw.devices_per_node)) {  // TP stays inside a node
    if (any.heads > 0 && any.heads % tp != 0) continue;
    for (int pp : divisors(D / tp)) {
      if (pp > L) continue;  // a stage needs a block (uneven cuts are the engine's to balance)
      const int64_t rest = D / (int64_t{tp} * pp);
      for (int ep : moe ? divisors(rest) : std::vector<int>{1}) {
        if (moe && base.experts % ep != 0) continue;
        const int64_t dp = rest / ep;
        const int64_t data_ranks = dp * ep;
        for (int64_t b : rows) {
          if (B % (data_ranks * b) != 0) continue;
          const int64_t m = B / (data_ranks * b);
          for (const std::string& sched : pp > 1 ? schedules : std::vector<std::string>{"1f1b"}) {
            const int chunks = sched == "interleaved" ? 2 : 1;
            if (sched == "interleaved" && (L < int64_t{pp} * chunks || m % pp != 0)) continue;
            for (int zero : zeros) {
              std::vector<std::string> offloads = {"none"};
              if (request.allow_offload && hw.host_link_bw > 0 && zero >= 1) offloads.push_back("optimizer");
              for (const std::string& off : offloads) {
                for (const auto& [rc, etp] : model_choices) {
                  if (etp && tp == 1) continue;  // expert TP splits over tp ranks
                  run::RunConfig c = base;
                  c.plan = false;
                  ++plan.evaluated;
                  try {
                    parallel::Layout& l = c.layout;
                    l = parallel::Layout{};
                    l.expert_tp = etp;
                    l.tp = tp;
                    l.pp = pp;
                    l.dp = static_cast<int>(dp);
                    l.ep = ep;
                    l.sequence_parallel = tp > 1;
                    l.schedule = pp::schedule_kind_from_name(sched);
                    l.num_chunks = chunks;
                    l.zero = zero;
                    l.offload = dp::parse_offload(off);
                    l.recompute = rc;
                    l.num_micro = static_cast<int>(m);
                    c.validate();
                    plan.candidates.push_back(evaluate(request, models.at(model_key(rc, etp)), c, D));
                  } catch (const InvalidArgument&) {
                    ++plan.invalid;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  TORUS_CHECK(!plan.candidates.empty(), InvalidArgument,
              "planner: no valid layout of {} devices for a global batch of {} ({} considered: the batch must divide "
              "over dp x ep x micro-batch rows, heads over tp, layers over pp)",
              D, B, plan.evaluated);
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) {
      if (a.step_s != b.step_s) return a.step_s < b.step_s;
      // Equal by the model (which gives every matmul one efficiency):
      // larger micro-batches run larger, more efficient matmuls.
      if (a.micro_batch_rows != b.micro_batch_rows) return a.micro_batch_rows > b.micro_batch_rows;
      return a.memory.device() < b.memory.device();
    }
    return a.memory.device() + a.memory.host() < b.memory.device() + b.memory.host();
  });
  return plan;
}

std::string explain(const Candidate& k, const Plan& plan) {
  const MemoryBreakdown& m = k.memory;
  std::string s = fmt::format("{}\n", k.layout());
  s += fmt::format("  memory per device: parameters {}, gradients {}, optimizer {}, activations {}, buffers {}: {}",
                   torus::format_bytes(m.parameters), torus::format_bytes(m.gradients),
                   torus::format_bytes(m.optimizer), torus::format_bytes(m.activations),
                   torus::format_bytes(m.buffers), torus::format_bytes(m.device()));
  if (m.host() > 0) s += fmt::format("; host (offload) {}", torus::format_bytes(m.host()));
  s += fmt::format(" of {} usable{}\n", torus::format_bytes(plan.request.hardware.device_memory * plan.request.memory_fraction),
                   k.fits ? "" : " — does not fit: " + k.why_not);
  s += fmt::format("  compute {:.3f} s (+ recompute {:.3f} s) at {:.0f}% of {:.3g} TFLOP/s per device\n", k.compute_s,
                   k.recompute_s,
                   100 * (plan.request.efficiency > 0 ? plan.request.efficiency : plan.request.hardware.efficiency),
                   (k.config.precision == "f32" && !k.config.autocast ? plan.request.hardware.peak_flops_32
                                                                       : plan.request.hardware.peak_flops_16) /
                       1e12);
  s += fmt::format("  pipeline bubble {:.1f}% ({}): {:.3f} s\n", 100 * k.bubble_fraction,
                   k.config.layout.pp > 1 ? std::string(pp::schedule_kind_name(k.config.layout.schedule)) : std::string("no pipeline"), k.bubble_s);
  s += fmt::format("  tp {} sent, {:.3f} s; pp {}, {:.3f} s; dp (zero {}) {}, {:.3f} s; ep {}, {:.3f} s; offload {:.3f} s\n",
                   torus::format_bytes(k.tp_bytes), k.tp_s, torus::format_bytes(k.pp_bytes), k.pp_s, k.config.layout.zero,
                   torus::format_bytes(k.dp_bytes), k.dp_s, torus::format_bytes(k.ep_bytes), k.ep_s, k.offload_s);
  s += fmt::format("  step {:.3g} s: {:.0f} tokens/s, {:.3g} model TFLOP/s per device, MFU {:.1f}%\n", k.step_s,
                   k.tokens_per_s, k.model_tflops_per_device, 100 * k.mfu);
  return s;
}

std::string plan_table(const Plan& plan, int top) {
  const PlanRequest& r = plan.request;
  int fitting = 0;
  for (const Candidate& k : plan.candidates) fitting += k.fits ? 1 : 0;
  std::string s = fmt::format(
      "{} parameters, {:.3g} GFLOP per token; {} x {} = {} devices ({}); global batch {} x {} tokens\n"
      "{} layouts considered, {} invalid, {} do not fit, {} fit\n\n",
      count_str(static_cast<double>(plan.num_parameters)), plan.flops_per_token / 1e9, r.nodes,
      r.hardware.devices_per_node, plan.devices, r.hardware.name, r.run.batch, r.run.seq, plan.evaluated,
      plan.invalid, static_cast<int>(plan.candidates.size()) - fitting, fitting);
  s += fmt::format("{:>3}  {:<58} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7} {:>7} {:>8} {:>6}\n", "#", "layout",
                   "mem GB", "step s", "bubble", "tp s", "pp s", "dp s", "ep s", "TFLOP/s", "MFU");
  int shown = 0;
  for (const Candidate& k : plan.candidates) {
    if (shown >= top) break;
    s += fmt::format("{:>3}  {:<58} {:>9} {:>9.3f} {:>7.1f}% {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>8.1f} {:>5.1f}%{}\n",
                     shown + 1, k.layout(), gb(k.memory.device()), k.step_s, 100 * k.bubble_fraction, k.tp_s, k.pp_s,
                     k.dp_s, k.ep_s, k.model_tflops_per_device, 100 * k.mfu, k.fits ? "" : "  (does not fit)");
    ++shown;
  }
  if (const Candidate* b = plan.best()) {
    s += "\nbest: " + explain(*b, plan);
  } else {
    s += "\nno layout fits; the smallest:\n" + explain(plan.candidates.front(), plan);
  }
  return s;
}

std::string plan_json(const Plan& plan, int top) {
  const PlanRequest& r = plan.request;
  Json j;
  j["request"] = {{"run", Json::parse(r.run.to_json())},
                  {"hardware", {{"name", r.hardware.name}, {"devices_per_node", r.hardware.devices_per_node},
                                {"device_memory", r.hardware.device_memory},
                                {"peak_flops_16", r.hardware.peak_flops_16},
                                {"peak_flops_32", r.hardware.peak_flops_32},
                                {"intra_node_bw", r.hardware.intra_node_bw}, {"network_bw", r.hardware.network_bw},
                                {"host_link_bw", r.hardware.host_link_bw}}},
                  {"nodes", r.nodes},
                  {"efficiency", r.efficiency > 0 ? r.efficiency : r.hardware.efficiency},
                  {"memory_fraction", r.memory_fraction}};
  j["devices"] = plan.devices;
  j["parameters"] = plan.num_parameters;
  j["flops_per_token"] = plan.flops_per_token;
  j["evaluated"] = plan.evaluated;
  j["invalid"] = plan.invalid;
  Json list = Json::array();
  for (int i = 0; i < std::min<int>(top, static_cast<int>(plan.candidates.size())); ++i) {
    list.push_back(candidate_json(plan.candidates[static_cast<size_t>(i)]));
  }
  j["candidates"] = list;
  j["best"] = plan.best() ? candidate_json(*plan.best()) : Json(nullptr);
  return j.dump(2);
}

std::vector<ZeroRow> zero_memory_table(int64_t psi, const std::vector<int64_t>& nds) {
  TORUS_CHECK(psi >= 1, InvalidArgument, "zero_memory_table: need >= 1 parameter, got {}", psi);
  std::vector<ZeroRow> out;
  engine::OptimizerConfig adam;
  adam.name = "adam";
  for (int64_t nd : nds) {
    TORUS_CHECK(nd >= 1, InvalidArgument, "zero_memory_table: Nd must be >= 1, got {}", nd);
    ZeroRow row;
    row.nd = nd;
    for (int stage = 0; stage <= 3; ++stage) {
      engine::ParallelLayout l;
      l.dp = static_cast<int>(nd);
      l.num_micro = 1;
      l.zero = stage;
      engine::TrainerOptions o;
      o.grads_in_param_dtype = true;  // the paper's 2-byte gradients
      const engine::MemoryEstimate e = engine::estimate_memory_from_shapes({}, psi, at::kBFloat16, l, o, adam);
      row.stage[stage] = static_cast<double>(e.parameters + e.gradients + e.optimizer + e.host_optimizer +
                                             e.host_parameters);  // model states
    }
    out.push_back(row);
  }
  return out;
}

Hardware measure_cpu_host(int ranks_per_node, const std::string& precision) {
  TORUS_CHECK(ranks_per_node >= 1, InvalidArgument, "planner: ranks per node must be >= 1, got {}", ranks_per_node);
  Hardware hw = *find_hardware("cpu");
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  const double f32 = run::measure_cpu_gemm_flops(at::kFloat, cores);
  double f16 = f32;
  if (precision == "bf16") f16 = std::max(f32, run::measure_cpu_gemm_flops(at::kBFloat16, cores));
  if (precision == "fp16") f16 = std::max(f32, run::measure_cpu_gemm_flops(at::kHalf, cores));
  std::ifstream in("/proc/meminfo");
  std::stringstream text;
  text << in.rdbuf();
  const int64_t avail = engine::parse_mem_available(text.str());
  TORUS_CHECK(avail > 0, Error, "planner: no MemAvailable in /proc/meminfo");
  hw.devices_per_node = ranks_per_node;
  hw.device_memory = static_cast<double>(avail) / ranks_per_node;
  hw.host_memory = 0;
  hw.peak_flops_32 = f32 / ranks_per_node;
  hw.peak_flops_16 = f16 / ranks_per_node;
  const std::string gemm = precision == "bf16" || precision == "fp16"
                               ? fmt::format("the faster of f32 and {}", precision)
                               : std::string("f32");
  hw.description = fmt::format("this host: {} cores, {:.1f} GFLOP/s GEMM ({}), {} available, {} ranks", cores,
                               std::max(f16, f32) / 1e9, gemm, torus::format_bytes(static_cast<double>(avail)),
                               ranks_per_node);
  return hw;
}

}  // namespace torus::plan
