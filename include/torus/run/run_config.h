// torus/run/run_config.h — every option of a training run, in one table.
//
// RunConfig is the value a training run is built from: the model, the
// parallel layout, precision, recompute, optimizer, schedule of the learning
// rate, data, evaluation and output. The option table that fills it is
// written once (src/train/run_config.cpp, on CLI11) and serves every front
// end:
//
//   * the C++ command line:   torus-train --tp 2 --pp 2 --precision bf16
//   * config files:           torus-train --config run.toml   (`name = value` lines)
//   * Python keyword arguments: torus.train.RunConfig(tp=2, pp=2, precision="bf16")
//     (the binding turns each keyword into `--name=value` and calls
//     parse_run_config, so Python accepts exactly what the CLI accepts).
//
//   torus::run::RunConfig cfg;
//   if (torus::run::parse_run_config(argc, argv, cfg) == torus::run::ParseOutcome::kHelp) {
//     std::cout << torus::run::run_config_help("torus-train");
//     return 0;
//   }
//
// Forms: `--name value`, `--name=value`; bools as `--flag`, `--no-flag` or
// `--flag=true|false` (also 1/0, yes/no, on/off). A dash and an underscore
// are the same in option names (`--min_lr` is `--min-lr`), on the command
// line and in config files.
//
// Note [Option precedence]: config files (--config FILE, TOML/INI style
// `name = value` lines, `#` comments) are read first; every flag given on the
// command line overrides the file, wherever it stands. An option given twice
// takes its last value (argparse's and torchrun's rule).
//
// Errors: an unknown option, a missing or malformed value, a value outside
// its set (e.g. --precision f8), an unreadable config file: InvalidArgument
// naming the option. parse_run_config leaves `out` unchanged on error.
// validate() checks the values against each other (no communication).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "torus/parallel/layout.h"

namespace torus::run {

struct RunConfig {
  // --- model -----------------------------------------------------------------
  // A preset by name (model_presets.h); each shape option below, when
  // non-zero, overrides the preset's value.
  std::string model = "gpt";
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;   // Llama: key/value heads (grouped-query attention)
  int64_t ffn = 0;
  int64_t vocab = 0;
  double rope_theta = 0;  // Llama: the rotary base
  int64_t seq = 128;
  double dropout = 0.0;
  bool tie_embeddings = true;
  // Mixture of experts (parallel/expert/moe.h): every moe_every-th block has
  // an MoE MLP (0: a dense model).
  int64_t moe_every = 0;
  int64_t experts = 8;
  int64_t top_k = 2;
  double capacity_factor = 0;    // 0: dropless
  double aux_loss_weight = -1;   // -1: 0.01, or 0 with --aux-loss-free
  double z_loss_weight = 0;
  bool aux_loss_free = false;
  double bias_update_rate = 1e-3;
  double moe_jitter = 0;
  int64_t moe_ffn = 0;           // each expert's MLP width (0: --ffn)

  // --- precision and memory ----------------------------------------------------
  std::string precision = "f32";  // f32 | bf16 | fp16 (f64 for tests)
  bool autocast = false;          // LibTorch autocast over f32 parameters (bf16 on CPU, --precision's half on CUDA)
  std::string grad_dtype = "f32";  // gradient accumulation buffers: f32 | param
  double loss_scale = 0;           // fp16: 0 = dynamic scaling, > 0 = this constant scale
  double initial_loss_scale = 65536;
  int64_t loss_scale_window = 2000;  // clean steps before the scale doubles
  int hysteresis = 1;                // overflows tolerated before the scale halves
  double min_loss_scale = 1;
  int zero_prefetch = 1;         // --zero 3: blocks gathered ahead of the one running
  bool force = false;            // start even when the memory pre-check (memory_plan.h) says it will not fit
  // The planner (plan/planner.h) chooses tp, pp, dp, ep, sp, schedule,
  // chunks, ZeRO stage, offload, recompute and micro-batches for the world
  // and prints its choice before training, replacing those options.
  bool plan = false;
  std::string plan_hardware = "cpu";  // a plan/hardware.h preset; cpu: this host, measured

  // --- layout ------------------------------------------------------------------
  // tp, pp, dp, ep, sp, expert-tp, schedule, micro-batches, chunks,
  // stage-layers, zero, offload, recompute: the one layout value, whose
  // fields are options of this table (parallel/layout.h, Note [One layout]).
  parallel::Layout layout;

  // --- optimizer and schedule ----------------------------------------------------
  std::string optimizer = "adamw";  // sgd | adam | adamw
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup = -1;  // -1: 30 steps, at most steps / 10
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  double grad_clip = 1.0;

  // --- run -----------------------------------------------------------------------
  int64_t steps = 600;
  int64_t batch = 16;  // global batch in sequences
  int64_t seed = 1234;

  // --- data and evaluation ---------------------------------------------------------
  std::string data;  // empty: the default corpus (run/corpus.h); .tok / Megatron prefix: token data (run/token_data.h)
  double val_fraction = 0.1;
  int64_t eval_interval = 100;
  int64_t eval_batches = 2;

  // --- output ----------------------------------------------------------------------
  std::string out = "runs/torus-train";
  int64_t log_interval = 1;
  std::string progress = "auto";  // auto | on | off
  bool tensorboard = true;        // <out>/tb/events.out.tfevents.*
  double peak_tflops = 0;         // the job's peak for MFU (0: the device's, measured once per host on CPU)
  int threads = 0;                // intra-op threads per rank (0: cores / local ranks)

  // --- checkpoints (engine/checkpointing.h, docs/checkpoint.md) ----------------------
  std::string save_dir;     // empty: <out>/checkpoints
  int64_t save_every = 0;   // save every N steps (0: no periodic saves); > 0 also saves at the end
  bool save_final = false;  // save at the end of the run (implied by --save-every > 0)
  int keep_last = 0;        // keep the newest K complete checkpoints (0: all)
  bool async_save = false;  // snapshot to host memory, write in a background thread
  std::string resume;       // empty: start fresh; auto: the newest good checkpoint in --save-dir; or a path
  std::string init_from;    // a plain safetensors state dict of the model's global names (start of a run)
  double save_timeout = 600;  // rank 0: seconds to wait for every rank's files of a save

  // --- fault injection (tests) -----------------------------------------------------
  int fail_rank = -1;
  int64_t fail_step = -1;

  // Throws InvalidArgument naming the option when values do not fit together
  // (ranges, enumerations, the warm-up against the steps, ...). Pure.
  void validate() const;
  // The warm-up actually used: `warmup`, or min(30, steps / 10) when -1.
  int64_t warmup_steps() const;
  // Whether this run writes checkpoints (--save-every > 0 or --save-final),
  // and where (--save-dir, or <out>/checkpoints).
  bool saves_checkpoints() const { return save_every > 0 || save_final; }
  std::string checkpoint_dir() const { return save_dir.empty() ? out + "/checkpoints" : save_dir; }

  // Every option as (name, value text), in table order: numbers in shortest
  // round-trip form, bools true/false.
  std::vector<std::pair<std::string, std::string>> values() const;
  // The same as one JSON object with typed values.
  std::string to_json() const;
};

enum class ParseOutcome { kOk, kHelp };

// Parses argv[1..argc) into `out` (which holds the defaults). See the header
// comment for forms, config files and errors.
ParseOutcome parse_run_config(int argc, const char* const* argv, RunConfig& out);
ParseOutcome parse_run_config(const std::vector<std::string>& args, RunConfig& out);

// The --help text of a program built on the table.
std::string run_config_help(const std::string& program, const std::string& description = "");

// Option names in table order (for bindings and tests).
std::vector<std::string> run_option_names();

}  // namespace torus::run
