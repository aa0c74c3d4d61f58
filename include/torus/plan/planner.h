// torus/plan/planner.h — chooses a run's layout before it starts: tp, pp,
// dp, ep, sequence parallelism, pipeline schedule and chunks, ZeRO stage,
// offload, recompute policy and micro-batch size, for a model, a global
// batch, a hardware preset (hardware.h) and a node count.
//
//   plan::PlanRequest req;
//   run::parse_run_config(argc, argv, req.run);      // model, --seq, --batch, --precision, ...
//   req.hardware = *plan::find_hardware("h100-80gb");
//   req.nodes = 16;
//   plan::Plan p = plan::make_plan(req);                // every layout, ranked
//   std::cout << plan::plan_table(p, 10);
//
// Note [Planner model]: a layout is kept when its memory per device fits and
// ranked by its predicted step time.
//   memory: the training engine's own estimate (engine/memory_plan.h, Note
//     [Memory estimate]) of the model adapter the run would build
//     (run::make_model) — the numbers a run's memory pre-check prints —
//     against 90% of the device's memory (the rest: the runtime's context,
//     allocator slack, communication buffers) and, for offloaded state, the
//     node's host memory / devices per node.
//   compute: the model FLOPs of a step (Model::flops_per_token x tokens) plus
//     recompute (full: one more forward of the blocks; selective: the
//     attention core's forward) over devices x peak x efficiency.
//   pipeline bubble: the schedule's closed form (pp/schedule.h:
//     closed_form_bubble) — the step is compute / (1 - bubble).
//   tp: per block and micro-batch 4 all-reduces (or all-gather +
//     reduce-scatter with SP, the same bytes) of b s h activations, 6 with
//     full recompute; ring traffic 2 (t-1)/t of the message; NVLink inside a
//     node, the node's network share per device across nodes.
//   pp: each micro-batch's activation (and its gradient) crosses each stage
//     boundary once per chunk.
//   dp: gradients (G bytes) and parameters (P bytes) of the rank's Ψ / (tp
//     pp) parameters, traffic (N-1)/N of: ZeRO-0 an all-reduce (2 G Ψ);
//     ZeRO-1 reduce-scatter + all-gather ((G + P) Ψ); ZeRO-2 a
//     reduce-scatter per micro-batch ((m G + P) Ψ, Note [ZeRO-2 and
//     micro-batches]); ZeRO-3 per micro-batch a reduce-scatter and two
//     gathers (m (G + 2P) Ψ, three with full recompute). Not overlapped with
//     compute (an upper bound: Torus overlaps bucket reductions with
//     backward).
//   ep: 4 all-to-alls (dispatch, combine; forward and backward) per MoE
//     block and micro-batch of b s h k activations, (ep-1)/ep of them moved.
//   offload: gradient shards to the host and parameter shards back over the
//     host link, the CPU Adam pass at host-link speed.
// Communication times add (no overlap between dimensions); each collective
// step adds the link's latency. What the model leaves out: kernel
// efficiency that varies with shape (one efficiency for every matmul),
// overlap, the memory of communication libraries, stragglers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torus/comm/process_group.h"
#include "torus/parallel/layout.h"
#include "torus/plan/hardware.h"
#include "torus/run/run_config.h"

namespace torus::plan {

struct PlanRequest {
  // The run: model (preset and shape options), --seq, --batch (the global
  // batch in sequences), --precision, --grad-dtype, --optimizer, MoE
  // options. Its layout options are what the planner replaces.
  run::RunConfig run;
  Hardware hardware;  // resolved: `cpu` measured (measure_cpu_host)
  int nodes = 1;
  double efficiency = 0;       // 0: the hardware's
  double memory_fraction = 0.9;  // of the device's memory a layout may use
  // The search space (empty: the default of each).
  std::vector<int> zero_stages;               // default 0, 1, 2, 3
  std::vector<std::string> recompute;         // default none, selective, full
  std::vector<std::string> schedules;         // default 1f1b, interleaved, zb-h1
  std::vector<int64_t> micro_batch_rows;      // default 1, 2, 4, 8
  bool allow_offload = true;                  // never on `cpu` (host and device are one memory)
};

// Bytes per device (device memory) and per device's share of the host
// (offloaded state), by kind (Note [Memory estimate]).
struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0;
  double host_optimizer = 0, host_parameters = 0;
  double device() const { return parameters + gradients + optimizer + activations + buffers; }
  double host() const { return host_optimizer + host_parameters; }
};

struct Candidate {
  run::RunConfig config;  // the request's run with this layout's options applied
  int64_t micro_batch_rows = 1;  // b: rows of a micro-batch
  MemoryBreakdown memory;
  bool fits = false;
  std::string why_not;  // when it does not fit
  // Seconds per step, by part (Note [Planner model]).
  double compute_s = 0, recompute_s = 0, bubble_s = 0, tp_s = 0, pp_s = 0, dp_s = 0, ep_s = 0, offload_s = 0;
  double bubble_fraction = 0;
  // Bytes each device sends per step, by dimension.
  double tp_bytes = 0, pp_bytes = 0, dp_bytes = 0, ep_bytes = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  double model_tflops_per_device = 0;  // model FLOPs (no recompute) per device per second / 1e12
  double mfu = 0;                      // of the hardware's peak
  // "tp=8 pp=2 dp=4 zero=1 recompute=full 1f1b m=8 b=2" (ep, sp, offload, chunks when used).
  std::string layout() const;
};

struct Plan {
  PlanRequest request;
  int64_t devices = 0;
  int64_t num_parameters = 0;
  double flops_per_token = 0;  // model FLOPs of one token, forward and backward
  int evaluated = 0;           // layouts considered
  int invalid = 0;             // of them, layouts the model or the engine refuses (heads % tp, ...)
  std::vector<Candidate> candidates;  // every valid layout: those that fit first, each group by step time
  // The fastest layout that fits, or nullptr.
  const Candidate* best() const;
};

// Every layout of the search space on request.nodes x devices_per_node
// devices, ranked. Throws InvalidArgument for a bad request (nodes < 1, a
// batch that no layout divides, an unknown model, ...). Pure: no
// communication, allocates no tensors.
Plan make_plan(const PlanRequest& request);

// One layout, given as the run's own options (request.run's tp, pp, dp, ep,
// sp, schedule, chunks, zero, offload, recompute, micro-batches), through
// the same model: for comparing a published or hand-made layout with the
// planner's choice. Throws InvalidArgument when the layout is invalid.
Candidate evaluate_layout(const PlanRequest& request);

// The table of the first `top` candidates, one line each, then the best
// one explained part by part.
std::string plan_table(const Plan& plan, int top = 10);
// The plan as JSON text: request, then the first `top` candidates with
// every field above (bytes, seconds).
std::string plan_json(const Plan& plan, int top = 10);
// A candidate part by part: memory by kind, compute, bubble, each
// dimension's bytes and seconds.
std::string explain(const Candidate& c, const Plan& plan);

// --plan of a run (Note [Plan above the run]): rank 0 plans for the world
// (its hosts x ranks per host; on CPU this host measured, else the
// --plan-hardware preset) and publishes the chosen layout through the store
// as layout JSON, so that every rank gets the same value; the stage cut is
// left to the model. A plan that finds nothing that fits, or a world that is
// not whole nodes of the preset, fails on every rank with rank 0's message
// (InvalidArgument). An unknown --plan-hardware fails before any
// communication. Collective over `world`. The front ends (torus-train, the
// Python binding) call it and hand the layout to the loop.
parallel::Layout plan_layout(const comm::ProcessGroupPtr& world, const run::RunConfig& run);

// The ZeRO paper's memory table (Rajbhandari et al. 2020, Table 1): model
// states per device of `psi` parameters in 16-bit with gradients in the
// parameter dtype and Adam with fp32 masters (K = 12), on `nd` data-parallel
// devices, for stages 0-3, through the engine's estimate (a generic model of
// psi parameters): bytes.
struct ZeroRow {
  int64_t nd = 1;
  double stage[4] = {0, 0, 0, 0};
};
std::vector<ZeroRow> zero_memory_table(int64_t psi, const std::vector<int64_t>& nd);

// The `cpu` preset filled in for this host with `ranks_per_node` ranks:
// each rank's share of the host's GEMM FLOP/s (measured, in the run's
// precision and in f32, run/peak_flops.h) and of MemAvailable.
Hardware measure_cpu_host(int ranks_per_node, const std::string& precision);

}  // namespace torus::plan
