// torus-train — trains a byte-level GPT language model with tensor, sequence,
// pipeline and data parallelism, launched by mpirun (or any launcher Torus
// bootstraps from).
//
//   mpirun -np 8 torus-train --tp 2 --pp 2 --dp 2 --steps 200
//   torus-train --help
//
// Each step prints one line from the last pipeline stage, e.g.
//   step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB
// and appends a JSON object to <out>/metrics.jsonl; at the end it draws
// <out>/loss.png (training and validation loss). docs/train.md describes
// every option.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/Parallel.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "torus/comm/process_group.h"
#include "torus/core/error.h"
#include "torus/core/host_allocator.h"
#include "torus/core/logging.h"
#include <fmt/format.h>
#include "torus/train/corpus.h"
#include "torus/train/gpt_trainer.h"
#include "torus/train/lr_schedule.h"
#include "torus/train/metrics.h"
#include "torus/train/options.h"
#include "torus/train/plot.h"

namespace {

using namespace torus;
using Clock = std::chrono::steady_clock;

template <typename... A>
void require_arg(bool ok, fmt::format_string<A...> f, A&&... args) {
  if (!ok) throw InvalidArgument(fmt::format(f, std::forward<A>(args)...));
}

struct Args {
  // Model.
  int64_t layers = 4;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t ffn = 0;
  int64_t seq = 128;
  double dropout = 0.0;
  bool tie_embeddings = true;
  std::string dtype = "f32";
  // Layout.
  int tp = 1;
  int pp = 1;
  int dp = 0;
  bool sp = false;
  std::string schedule = "1f1b";
  int micro_batches = 4;
  int chunks = 1;
  std::string stage_layers;
  // Training.
  int64_t steps = 600;
  int64_t batch = 16;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup = 30;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  int64_t seed = 1234;
  // Data and evaluation.
  std::string data;
  double val_fraction = 0.1;
  int64_t eval_interval = 100;
  int64_t eval_batches = 2;
  // Output.
  std::string out = "runs/torus-train";
  int64_t log_interval = 1;
  std::string progress = "auto";
  double peak_gflops = 0;
  int threads = 0;
  // Fault injection (tests).
  int fail_rank = -1;
  int64_t fail_step = -1;
};

void register_options(train::OptionSet& o, Args& a) {
  o.add("layers", &a.layers, "transformer blocks");
  o.add("hidden", &a.hidden, "model width");
  o.add("heads", &a.heads, "attention heads (divisible by --tp)");
  o.add("ffn", &a.ffn, "MLP width (0: 4 x hidden)");
  o.add("seq", &a.seq, "sequence length in bytes (divisible by --tp with --sp)");
  o.add("dropout", &a.dropout, "embedding, residual and attention dropout");
  o.add("tie-embeddings", &a.tie_embeddings, "share the input embedding with the output layer");
  o.add("dtype", &a.dtype, "parameter and activation dtype: f32 or f64", "T");
  o.add("tp", &a.tp, "tensor-parallel size");
  o.add("pp", &a.pp, "pipeline-parallel size");
  o.add("dp", &a.dp, "data-parallel size (0: world / (tp x pp))");
  o.add("sp", &a.sp, "sequence parallelism (with --tp > 1)");
  o.add("schedule", &a.schedule, "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1", "NAME");
  o.add("micro-batches", &a.micro_batches, "micro-batches per step on each data-parallel rank");
  o.add("chunks", &a.chunks, "virtual stages per pipeline rank (interleaved schedule)");
  o.add("stage-layers", &a.stage_layers, "blocks per stage, e.g. 3,1 (empty: balanced by cost)", "LIST");
  o.add("steps", &a.steps, "optimizer steps");
  o.add("batch", &a.batch, "global batch in sequences (divisible by dp x micro-batches)");
  o.add("lr", &a.lr, "peak learning rate");
  o.add("min-lr", &a.min_lr, "learning rate at the end of the cosine decay");
  o.add("warmup", &a.warmup, "linear warm-up steps (default: at most steps / 10)");
  o.add("weight-decay", &a.weight_decay, "AdamW weight decay (matrices and embeddings)");
  o.add("grad-clip", &a.grad_clip, "clip the global gradient norm to this (0: off)");
  o.add("seed", &a.seed, "seed of the initialisation and the data order");
  o.add("data", &a.data, "a text file or a directory of them (default: the licence texts every Debian system ships)",
        "PATH");
  o.add("val-fraction", &a.val_fraction, "share of the corpus held out for validation (its end)");
  o.add("eval-interval", &a.eval_interval, "steps between validation passes (0: only at the end)");
  o.add("eval-batches", &a.eval_batches, "batches per validation pass");
  o.add("out", &a.out, "output directory: metrics.jsonl, loss.png", "DIR");
  o.add("log-interval", &a.log_interval, "steps between log lines");
  o.add("progress", &a.progress, "progress bar on stderr: auto (if a terminal), on, off", "MODE");
  o.add("peak-gflops", &a.peak_gflops, "machine peak for MFU in GFLOP/s (0: measure a GEMM on every rank)");
  o.add("threads", &a.threads, "intra-op threads per rank (0: cores / local ranks, at least 1)");
  o.add("fail-rank", &a.fail_rank, "testing: this rank kills itself (SIGKILL) ...");
  o.add("fail-step", &a.fail_step, "testing: ... at the start of this step");
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw InvalidArgument("--stage-layers: '" + item + "' is not an integer (expected e.g. 3,1)");
    }
  }
  return out;
}

// GEMM throughput of this rank while every rank measures at once; summed
// over the world it is the machine's achievable peak for MFU.
double measure_gflops(at::ScalarType dtype) {
  const int64_t n = 256;
  at::Tensor a = at::randn({n, n}, at::TensorOptions().dtype(dtype));
  at::Tensor b = at::randn({n, n}, at::TensorOptions().dtype(dtype));
  at::Tensor c = at::mm(a, b);
  int64_t iters = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (elapsed < 0.3) {
    c = at::mm(a, c.mul_(1e-3));
    ++iters;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return 2.0 * n * n * n * iters / elapsed / 1e9;
}

at::Tensor to_tensor(const std::vector<int64_t>& tokens, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int64_t*>(tokens.data()), {rows, cols}, at::TensorOptions().dtype(at::kLong)).clone();
}

double all_reduce_scalar(const comm::ProcessGroupPtr& world, double v, comm::ReduceOp op) {
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kDouble));
  if (world->size() > 1) world->all_reduce(t, {.op = op})->wait();
  return t.item<double>();
}

int train(const Args& a, const train::OptionSet& options, const train::Corpus& corpus, const train::CorpusSplit& split,
          const train::LrSchedule& lr, const comm::ProcessGroupPtr& world);

int run(int argc, char** argv) {
  Args a;
  train::OptionSet options;
  register_options(options, a);
  const char* summary =
      "Trains a byte-level GPT language model with tensor (--tp), pipeline (--pp) and data (--dp) parallelism.\n"
      "Launch one process per rank, e.g.: mpirun -np 8 torus-train --tp 2 --pp 2 --dp 2";
  if (options.parse(argc, argv) == train::ParseResult::kHelp) {
    std::cout << options.help_text("torus-train", summary);
    return 0;
  }
  // Validate what needs no communication before starting any.
  require_arg(a.dtype == "f32" || a.dtype == "f64", "--dtype must be f32 or f64, got '{}'", a.dtype);
  require_arg(a.progress == "auto" || a.progress == "on" || a.progress == "off",
                  "--progress must be auto, on or off, got '{}'", a.progress);
  require_arg(a.steps >= 1 && a.batch >= 1 && a.log_interval >= 1 && a.eval_batches >= 1 && a.eval_interval >= 0,
                  "--steps, --batch, --log-interval and --eval-batches must be >= 1 and --eval-interval >= 0");
  require_arg(a.val_fraction > 0 && a.val_fraction < 1, "--val-fraction must be in (0, 1), got {}",
                  a.val_fraction);
  // The default warm-up shrinks with a short run (at most a tenth of it);
  // an explicit --warmup is taken as given.
  const int64_t warmup = options.is_set("warmup") ? a.warmup : std::min(a.warmup, a.steps / 10);
  train::LrSchedule lr{a.lr, a.min_lr, warmup, a.steps};
  lr.validate();
  const std::string data_path = a.data.empty() ? train::default_corpus_path() : a.data;
  const train::Corpus corpus = train::Corpus::load(data_path);
  const train::CorpusSplit split = corpus.split(a.val_fraction);

  // Every step frees and re-allocates the same large buffers: keep them in
  // the process instead of faulting fresh pages in (core/host_allocator.h).
  retain_freed_host_memory();
  comm::ProcessGroupPtr world = torus::init();
  try {
    return train(a, options, corpus, split, lr, world);
  } catch (const Error&) {
    // A dead or stuck peer: do not wait for it to check out at shutdown.
    world->context()->mark_failed();
    throw;
  }
}

int train(const Args& a, const train::OptionSet& options, const train::Corpus& corpus, const train::CorpusSplit& split,
          const train::LrSchedule& lr, const comm::ProcessGroupPtr& world) {
  const int rank = world->rank();
  const int world_size = world->size();
  {
    const int local = std::max(1, world->context()->launch().local_size);
    const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    at::set_num_threads(a.threads > 0 ? a.threads : std::max(1, cores / local));
  }

  models::GPTConfig model;
  model.vocab_size = 256;
  model.max_seq_len = a.seq;
  model.num_layers = a.layers;
  model.hidden = a.hidden;
  model.num_heads = a.heads;
  model.ffn_hidden = a.ffn;
  model.dropout = a.dropout;
  model.attention_dropout = a.dropout;
  model.tie_embeddings = a.tie_embeddings;
  model.seed = static_cast<uint64_t>(a.seed);
  model.dtype = a.dtype == "f64" ? at::kDouble : at::kFloat;

  train::ParallelLayout layout;
  layout.tp = a.tp;
  layout.pp = a.pp;
  require_arg(a.dp >= 0, "--dp must be >= 0, got {}", a.dp);
  require_arg(a.tp >= 1 && a.pp >= 1 && world_size % (a.tp * a.pp) == 0,
                  "--tp x --pp = {} x {} does not divide the {} ranks", a.tp, a.pp, world_size);
  layout.dp = a.dp > 0 ? a.dp : world_size / (a.tp * a.pp);
  layout.sequence_parallel = a.sp;
  layout.schedule = pp::schedule_kind_from_name(a.schedule);
  layout.num_micro = a.micro_batches;
  layout.num_chunks = a.chunks;
  layout.layers_per_stage = parse_list(a.stage_layers);

  train::OptimizerConfig optim;
  optim.lr = a.lr;
  optim.weight_decay = a.weight_decay;
  optim.grad_clip = a.grad_clip;

  train::BatchSampler train_data(split.train, a.seq, a.batch, static_cast<uint64_t>(a.seed), "training split");
  train::BatchSampler val_data(split.val, a.seq, a.batch, static_cast<uint64_t>(a.seed) ^ 0x5eedull,
                               "validation split");

  train::GPTTrainer trainer(world, model, layout, optim);
  const bool logger = trainer.is_logging_rank();

  const double peak_gflops =
      a.peak_gflops > 0 ? a.peak_gflops : all_reduce_scalar(world, measure_gflops(model.dtype), comm::ReduceOp::kSum);
  const double flops_per_token = trainer.flops_per_token(a.seq);

  std::unique_ptr<train::JsonlWriter> metrics;
  std::unique_ptr<train::ProgressBar> bar;
  if (logger) {
    std::filesystem::create_directories(a.out);
    metrics = std::make_unique<train::JsonlWriter>(a.out + "/metrics.jsonl", /*truncate=*/true);
    std::printf("torus-train: %d ranks, %s; model %lld layers, width %lld, %lld heads, seq %lld, %.2fM parameters, %s\n",
                world_size, layout.describe().c_str(), static_cast<long long>(a.layers),
                static_cast<long long>(a.hidden), static_cast<long long>(a.heads), static_cast<long long>(a.seq),
                trainer.num_parameters() / 1e6, a.dtype.c_str());
    const auto stages = trainer.describe_stages();
    for (size_t s = 0; s < stages.size(); ++s) std::printf("  stage %zu: %s\n", s, stages[s].c_str());
    std::printf("data: %s (%zu bytes: %zu train, %zu validation); batch %lld x %lld bytes; peak %.1f GFLOP/s\n",
                corpus.source().c_str(), corpus.size(), split.train.size(), split.val.size(),
                static_cast<long long>(a.batch), static_cast<long long>(a.seq), peak_gflops);
    std::fflush(stdout);
    train::JsonFields cfg{{"event", "config"}, {"world_size", world_size}, {"layout", layout.describe()},
                          {"parameters", trainer.num_parameters()}, {"peak_gflops", peak_gflops},
                          {"corpus", corpus.source()}, {"corpus_bytes", static_cast<int64_t>(corpus.size())}};
    for (const auto& [k, v] : options.values()) cfg.emplace_back("opt." + k, v);
    metrics->write(cfg);
    const bool tty = isatty(fileno(stderr));
    if (a.progress == "on" || (a.progress == "auto" && tty)) bar = std::make_unique<train::ProgressBar>(a.steps, stderr);
  }

  auto evaluate = [&]() {
    double sum = 0;
    for (int64_t i = 0; i < a.eval_batches; ++i) {
      sum += trainer.evaluate(to_tensor(val_data.batch(i), a.batch, a.seq + 1));
    }
    return sum / static_cast<double>(a.eval_batches);
  };

  std::vector<double> xs, losses, val_xs, val_losses;
  double tokens = 0, seconds = 0;
  const auto t_start = Clock::now();
  for (int64_t step = 0; step < a.steps; ++step) {
    if (rank == a.fail_rank && step == a.fail_step) {
      log_message(LogLevel::kWarn, fmt::format("torus-train: --fail-rank {} --fail-step {}: killing this rank",
                                               a.fail_rank, a.fail_step));
      ::raise(SIGKILL);
    }
    const double step_lr = lr.at(step);
    train::StepStats st = trainer.train_step(to_tensor(train_data.batch(step), a.batch, a.seq + 1), step_lr);
    const bool last = step + 1 == a.steps;
    double val = std::nan("");
    if (last || (a.eval_interval > 0 && (step + 1) % a.eval_interval == 0)) val = evaluate();
    const double mem = all_reduce_scalar(world, static_cast<double>(train::peak_rss_bytes()), comm::ReduceOp::kMax);
    tokens += static_cast<double>(st.tokens);
    seconds += st.seconds;
    if (!logger) continue;
    const double tok_s = st.tokens / st.seconds;
    const double mfu = tok_s * flops_per_token / (peak_gflops * 1e9);
    xs.push_back(static_cast<double>(st.step));
    losses.push_back(st.loss);
    if (!std::isnan(val)) {
      val_xs.push_back(static_cast<double>(st.step));
      val_losses.push_back(val);
    }
    metrics->write({{"event", "step"}, {"step", st.step}, {"loss", st.loss}, {"val_loss", val},
                    {"grad_norm", st.grad_norm}, {"clip", st.clip_coefficient}, {"lr", step_lr},
                    {"tokens_per_s", tok_s}, {"mfu", mfu}, {"mem_bytes", mem}, {"step_s", st.seconds},
                    {"pipeline_s", st.pipeline_seconds}, {"sync_s", st.sync_seconds}, {"skipped", st.skipped},
                    {"peak_live_micro", st.peak_live}});
    if (st.step % a.log_interval == 0 || last || !std::isnan(val)) {
      if (bar) bar->clear();
      train::StepLine line;
      line.step = st.step;
      line.loss = st.loss;
      line.val_loss = val;
      line.grad_norm = st.grad_norm;
      line.lr = step_lr;
      line.tokens_per_s = tok_s;
      line.mfu = mfu;
      line.mem_bytes = mem;
      std::printf("%s\n", train::format_step_line(line).c_str());
      std::fflush(stdout);
    }
    if (bar) bar->update(st.step, tok_s);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (logger) {
    if (bar) bar->finish();
    const double first = losses.front(), final_loss = losses.back();
    const double val = val_losses.empty() ? std::nan("") : val_losses.back();
    metrics->write({{"event", "end"}, {"steps", a.steps}, {"wall_s", wall}, {"tokens_per_s", tokens / seconds},
                    {"first_loss", first}, {"final_loss", final_loss}, {"final_val_loss", val}});
    train::PlotSpec plot;
    plot.title = "torus-train: " + layout.describe();
    plot.x_label = "step";
    plot.y_label = "loss (nats per byte)";
    plot.series.push_back({"train", train::Rgb{31, 119, 180}, xs, losses});
    if (!val_xs.empty()) plot.series.push_back({"validation", train::Rgb{214, 39, 40}, val_xs, val_losses});
    train::write_line_plot_png(a.out + "/loss.png", plot);
    std::printf("done: %lld steps in %.1f s, %.0f tok/s; loss %.3f -> %.3f, validation %.3f; wrote %s/metrics.jsonl and "
                "%s/loss.png\n",
                static_cast<long long>(a.steps), wall, tokens / seconds, first, final_loss, val, a.out.c_str(),
                a.out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const torus::InvalidArgument& e) {
    std::fprintf(stderr, "torus-train: error: %s\n(see torus-train --help)\n", e.what());
    return 2;
  } catch (const torus::Error& e) {
    std::fprintf(stderr, "torus-train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-train: error: %s\n", e.what());
    return 1;
  }
}
