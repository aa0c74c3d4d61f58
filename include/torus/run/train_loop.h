// torus/run/train_loop.h — the training loop that torus-train and Python
// both drive: data, learning-rate schedule, gradient accumulation (the
// micro-batches of a step), evaluation cadence, the step line, metrics JSONL,
// TensorBoard scalars, progress and the end-of-run summary.
//
//   auto world = torus::init();
//   torus::run::RunConfig cfg;                      // or parse_run_config(argc, argv, cfg)
//   cfg.tp = 2; cfg.pp = 2; cfg.steps = 200;
//   torus::run::TrainLoop loop(world, cfg);         // collective: builds the engine
//   torus::run::RunSummary s = loop.run();          // collective: every step
//
// What a run writes (on the logging rank: last pipeline stage, dp 0, tp 0):
//  * lines through the sink (set_line_sink; default: the logger at info):
//    a header (layout, model, stages, data, peak), one line per
//    --log-interval steps, e.g.
//      step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB
//    and a final summary line;
//  * <out>/metrics.jsonl: one "config" record (every option, the layout, the
//    parameter count, the peak), one "step" record per step, one "end"
//    record. Records of the C++ and the Python front end are identical for
//    the same options, apart from times;
//  * <out>/tb/events.out.tfevents.*: scalars train/loss, val/loss,
//    train/lr, train/grad_norm, train/loss_scale (fp16), perf/tokens_per_s,
//    perf/mfu, mem/peak_rss_bytes (--tensorboard);
//  * a progress bar on stderr when it is a terminal (--progress);
//  * at the end, on every rank through the logger, and on the logging rank
//    through the sink and into the "end" record (peak_rss_bytes,
//    job_peak_rss_bytes): "peak resident memory: X GiB on this rank, Y GiB
//    over the job" (the sum of every rank's peak, one all-reduce).
//
// Note [Memory pre-check]: before the Trainer allocates anything, the loop
// estimates each rank's memory (memory_plan.h, Note [Memory estimate]),
// logs it at info level, and compares it with the memory a rank has (the
// device's on CUDA, the host's MemAvailable / ranks on this host on CPU):
// a run that does not fit throws InvalidArgument naming the estimate by
// kind and the memory available and suggesting --zero, --offload or
// --force; --force starts it anyway with a warning. No communication.
// `python3 -m torus.plot <out>` draws the curves from metrics.jsonl.
//
// Note [Honest MFU]: MFU = model FLOPs per second / the job's peak. Model
// FLOPs come from Model::flops_per_token (recompute not counted) times the
// global tokens per second of the step. The peak: --peak-tflops if given;
// on CUDA the device's documented dense peak for the parameter dtype
// (peak_flops.h) times the ranks; on CPU measured once per host with every
// core busy — local rank 0 of each host runs a GEMM of the run's dtype on
// all cores while the host's other ranks wait — summed over hosts, and kept
// per host for later runs (Note [Stable CPU peak] in peak_flops.h). The
// config record's "peak_source" says which: "--peak-tflops", "datasheet
// <device>", "measured" or "cached from <date>". Measured
// this way an MFU above 100% cannot happen unless the GEMM measurement is
// slower than the model, which the loop reports as a warning.
//
// Errors: a bad config throws InvalidArgument before any communication; a
// failed peer ends in CommError / TimeoutError from run().
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "torus/comm/process_group.h"
#include "torus/parallel/expert/routing_stats.h"
#include "torus/engine/memory_plan.h"
#include "torus/run/run_config.h"
#include "torus/engine/trainer.h"

namespace torus::run {

// What TrainLoop builds the engine with, from a run's options. Pure; throw
// InvalidArgument for options that do not fit (run_layout: tp x pp that
// does not divide the world, and ParallelLayout::validate).
engine::ParallelLayout run_layout(const RunConfig& config, int world_size);
engine::OptimizerConfig run_optimizer(const RunConfig& config);
engine::TrainerOptions run_trainer_options(const RunConfig& config);
// Rows of one micro-batch on a dp rank: batch / (dp x micro-batches),
// rounded up.
int64_t run_micro_batch_rows(const RunConfig& config, const engine::ParallelLayout& layout);

// Note [Memory pre-check] for `model` built from `config` and laid out as
// `layout`, against `available` (available_memory_per_rank in a run;
// anything in tests): returns the estimate, throws InvalidArgument when it
// does not fit unless config.force (then a warning). No communication.
engine::MemoryEstimate precheck_memory(const RunConfig& config, const engine::Model& model, const engine::ParallelLayout& layout,
                               const engine::MemoryBudget& available);

// One step as the loop records it (the JSONL "step" record).
struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: no evaluation this step
  double grad_norm = 0;
  double clip = 1;
  double lr = 0;
  double tokens_per_s = 0;
  double mfu = std::numeric_limits<double>::quiet_NaN();
  double mem_bytes = 0;  // peak resident set size, max over ranks
  double step_s = 0;
  double data_s = 0;  // reading this rank's rows of the batch (rank 0's in the log), outside step_s
  double pipeline_s = 0;
  double sync_s = 0;
  bool skipped = false;
  int64_t skipped_steps = 0;  // so far
  double loss_scale = 1;      // fp16: the scale of this step's backward
  int peak_live_micro = 0;
  ep::RoutingSummary routing;  // MoE: the step's routing statistics (empty: dense)
};

struct RunSummary {
  int64_t steps = 0;
  double wall_s = 0;
  double tokens_per_s = 0;   // tokens of the run / seconds inside train_step
  double data_fraction = 0;  // seconds reading batches / seconds inside train_step, max over ranks
  double first_loss = 0;
  double final_loss = 0;
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();
  std::string out_dir;
  int64_t peak_rss_bytes = 0;      // this rank's peak resident set size
  int64_t job_peak_rss_bytes = 0;  // the sum of every rank's peak
};

class TrainLoop {
 public:
  // Validates the config (InvalidArgument, before any communication), loads
  // the corpus, builds the model adapter named by config.model, runs the
  // memory pre-check (Note [Memory pre-check]), then builds the engine over
  // `world` (collective) and measures the peak (collective).
  TrainLoop(comm::ProcessGroupPtr world, RunConfig config, std::string program = "torus-train");
  ~TrainLoop();
  TrainLoop(const TrainLoop&) = delete;
  TrainLoop& operator=(const TrainLoop&) = delete;

  // Where the header, step and summary lines go (the logging rank only).
  void set_line_sink(std::function<void(std::string_view)> sink);
  // Called on every rank after every step (after the record is written).
  void on_step(std::function<void(const StepRecord&)> observer);
  // Called on every rank before every step with its 0-based index.
  void on_step_begin(std::function<void(int64_t)> observer);

  // Runs config.steps steps. Collective. Returns the same summary on every
  // rank (losses from the logging rank).
  RunSummary run();

  engine::Trainer& trainer();
  const RunConfig& config() const;
  // The job's peak FLOP/s used for MFU (Note [Honest MFU]); 0: unknown.
  double peak_flops() const;
  // This rank's memory estimate and the memory it has (Note [Memory pre-check]).
  const engine::MemoryEstimate& memory_estimate() const;
  const engine::MemoryBudget& memory_available() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torus::run
