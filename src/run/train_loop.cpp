// The training loop (train_loop.h): the one loop of torus-train and Python.
#include "torus/run/train_loop.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "core/log.h"
#include "torus/comm/context.h"
#include "torus/device/device.h"
#include "torus/parallel/tensor/sharding.h"
#include "torus/engine/checkpointing.h"
#include "torus/engine/hf.h"
#include "torus/run/lr_schedule.h"
#include "torus/run/metrics.h"
#include "torus/engine/model.h"
#include "torus/run/peak_flops.h"
#include "torus/run/tensorboard.h"
#include "torus/engine/trainer.h"
#include "torus/run/registry.h"
#include "run/run_data.h"

namespace torus::run {

using namespace engine;  // the engine this layer drives  // NOLINT
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double all_reduce_scalar(const comm::ProcessGroupPtr& world, double v, comm::ReduceOp op) {
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kDouble));
  if (world->size() > 1) world->all_reduce(t, {.op = op})->wait();
  return t.item<double>();
}

at::Tensor to_tensor(const std::vector<int64_t>& tokens, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int64_t*>(tokens.data()), {rows, cols}, at::TensorOptions().dtype(at::kLong)).clone();
}

// A JSON number, or null when not finite (JSON has no NaN).
Json number(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}

// The "moe" object of a step record: totals and each layer's figures.
Json routing_json(const ep::RoutingSummary& r) {
  Json layers = Json::array();
  for (const auto& l : r.layers) {
    layers.push_back({{"layer", l.layer},
                      {"tokens_per_expert", l.tokens_per_expert},
                      {"drop_rate", number(l.drop_rate())},
                      {"imbalance", number(l.imbalance())},
                      {"aux_loss", number(l.mean_aux_loss())},
                      {"z_loss", number(l.mean_z_loss())}});
  }
  return {{"aux_loss", number(r.aux_loss())},           {"z_loss", number(r.z_loss())},
          {"drop_rate", number(r.drop_rate())},         {"imbalance", number(r.imbalance())},
          {"tokens_per_expert", r.tokens_per_expert()}, {"layers", layers}};
}

}  // namespace

ParallelLayout run_layout(const RunConfig& c, int world_size) {
  ParallelLayout l = c.layout.resolved(world_size);
  l.validate(world_size);
  return l;
}

OptimizerConfig run_optimizer(const RunConfig& c) {
  OptimizerConfig optim;
  optim.name = c.optimizer;
  optim.momentum = c.optimizer == "sgd" ? c.momentum : 0.0;
  optim.nesterov = c.nesterov;
  optim.lr = c.lr;
  optim.weight_decay = c.weight_decay;
  optim.beta1 = c.beta1;
  optim.beta2 = c.beta2;
  optim.eps = c.eps;
  optim.grad_clip = c.grad_clip;
  return optim;
}

TrainerOptions run_trainer_options(const RunConfig& c) {
  TrainerOptions options;
  options.grads_in_param_dtype = c.grad_dtype == "param";
  options.loss_scaler.dynamic = c.loss_scale == 0;
  options.loss_scaler.initial_scale = c.loss_scale > 0 ? c.loss_scale : c.initial_loss_scale;
  options.loss_scaler.growth_interval = c.loss_scale_window;
  options.loss_scaler.hysteresis = c.hysteresis;
  options.loss_scaler.min_scale = std::min(c.min_loss_scale, options.loss_scaler.initial_scale);
  if (c.autocast) options.autocast = at::kBFloat16;
  options.zero_prefetch = c.zero_prefetch;
  return options;
}

int64_t run_micro_batch_rows(const RunConfig& c, const ParallelLayout& l) {
  // The data ranks are dp x ep (Trainer::local_rows): each ep rank reads its own rows.
  const int64_t parts = int64_t{l.dp} * l.ep * l.num_micro;
  return std::max<int64_t>(1, (c.batch + parts - 1) / parts);
}

MemoryEstimate precheck_memory(const RunConfig& c, const Model& model, const ParallelLayout& l,
                               const MemoryBudget& available) {
  const MemoryEstimate e =
      estimate_memory(model, l, run_trainer_options(c), run_micro_batch_rows(c, l), c.seq, run_optimizer(c));
  TORUS_LOG_INFO("memory estimate per rank ({}, --zero {}, --offload {}): {}; available per rank: {}{}", l.describe(),
                 l.zero, dp::offload_name(l.offload), e.describe(), format_bytes(static_cast<double>(available.device)),
                 available.device_is_host
                     ? std::string(" (host)")
                     : fmt::format(" (device), host {}", format_bytes(static_cast<double>(available.host))));
  check_memory(e, available, c.force);
  return e;
}

struct TrainLoop::Impl {
  comm::ProcessGroupPtr world;
  RunConfig cfg;
  std::string program;
  ParallelLayout layout;
  LrSchedule lr;
  std::unique_ptr<RunData> data;  // Note [Run data]
  std::shared_ptr<const Model> model;
  MemoryEstimate estimate;
  MemoryBudget available;
  std::unique_ptr<Trainer> trainer;
  double peak = 0;
  std::string peak_source;  // how `peak` was obtained (the config record says it)
  std::function<void(std::string_view)> sink;
  std::vector<std::function<void(const StepRecord&)>> observers;
  std::vector<std::function<void(int64_t)>> begin_observers;
  // Checkpoints (checkpointing.h): what the manifest records, and where a
  // resumed run starts.
  RunDescription run_desc;
  LoadReport resumed;
  int64_t start_step = 0;

  void line(const std::string& text) const {
    if (sink) {
      sink(text);
    } else {
      TORUS_LOG_INFO("{}", text);
    }
  }
};

TrainLoop::TrainLoop(comm::ProcessGroupPtr world, RunConfig config, std::string program)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TORUS_CHECK(world != nullptr, InvalidArgument, "TrainLoop: the world group is null");
  config.validate();
  m.world = std::move(world);
  m.cfg = std::move(config);
  m.program = std::move(program);
  // Note [Plan above the run]: --plan is the front end's to apply
  // (plan::plan_layout), before it builds the loop; the loop takes a layout.
  TORUS_CHECK(!m.cfg.plan, InvalidArgument,
              "TrainLoop: --plan is applied by the front end (plan::plan_layout) before the loop is built; "
              "hand the loop the planned layout");
  const RunConfig& c = m.cfg;
  // Everything that needs no communication first.
  m.layout = run_layout(c, m.world->size());
  m.lr = LrSchedule{c.lr, c.min_lr, c.warmup_steps(), c.steps};
  m.lr.validate();
  m.model = make_model(c);
  {
    // Note [Memory pre-check]: before the Trainer allocates anything.
    ModelLayout ml;
    ml.tp = m.layout.tp;
    ml.sequence_parallel = m.layout.sequence_parallel;
    ml.num_stages = m.layout.num_stages();
    ml.blocks_per_stage = m.layout.layers_per_stage;
    m.model->validate(ml);  // the cut the estimate reads must exist
    m.available = available_memory_per_rank(m.model->device(), m.world->context()->launch().local_size);
    m.estimate = precheck_memory(c, *m.model, m.layout, m.available);
  }
  m.data = open_run_data(c, Json::parse(m.model->config_json()).value("vocab_size", int64_t{0}));
  {
    const int local = std::max(1, m.world->context()->launch().local_size);
    const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
    at::set_num_threads(c.threads > 0 ? c.threads : std::max(1, cores / local));
  }

  {
    // --init-from overwrites every parameter (its loader refuses a source
    // that lacks one): the random draw would be thrown away.
    std::optional<tp::SkipInitDraws> skip;
    if (!c.init_from.empty()) skip.emplace();
    m.trainer = std::make_unique<Trainer>(m.world, m.model, m.layout, run_optimizer(c), run_trainer_options(c));
  }

  // Checkpoints: the run's description, then --init-from or --resume.
  {
    // The model's whole shape (Model::config_json), what resuming compares
    // and what an export rebuilds the model from.
    Json model = Json::parse(m.model->config_json());
    model["model"] = c.model;
    model["parameters"] = m.trainer->num_parameters();
    Json data = Json::parse(m.data->manifest_json());
    data["seed"] = c.seed;
    data["batch"] = c.batch;
    data["seq"] = c.seq;
    data["val_fraction"] = c.val_fraction;
    m.run_desc.model = model.dump();
    m.run_desc.data = data.dump();
    m.run_desc.layout = layout_json(*m.trainer, c.precision);
    // --init-from as an absolute path: an export run elsewhere finds the
    // tokenizer files there (hf_export.cpp, tokenizer_source).
    Json options = Json::parse(c.to_json());
    if (!c.init_from.empty()) options["init-from"] = std::filesystem::absolute(c.init_from).lexically_normal().string();
    m.run_desc.options = options.dump();
    m.run_desc.data_position = [data = m.data.get()](int64_t step) { return data->position_json(step); };
  }
  if (!c.init_from.empty()) {
    // A directory with a config.json is a Hugging Face model (engine/hf.h);
    // anything else a safetensors file of Torus's global names.
    if (std::filesystem::is_regular_file(std::filesystem::path(c.init_from) / "config.json")) {
      load_hf_weights(*m.trainer, c.init_from);
    } else {
      load_safetensors_weights(*m.trainer, c.init_from);
    }
    if (m.world->rank() == 0) TORUS_LOG_INFO("init: model weights from {}", c.init_from);
  }
  if (!c.resume.empty()) {
    // Note [Resume checks]: another model or other data is refused, naming
    // the difference; another layout is loaded by resharding.
    std::map<std::string, std::string> origins;  // checkpoint path -> the --init-from it recorded
    auto check = [&](const ckpt::Checkpoint& ck) {
      const Json saved_model = Json::parse(ck.info().model), model = Json::parse(m.run_desc.model);
      for (const auto& [key, v] : model.items()) {
        TORUS_CHECK(saved_model.value(key, Json()) == v, InvalidArgument,
                    "--resume {}: the checkpoint's model has {} = {}, this run's {}: another model", ck.path(), key,
                    saved_model.value(key, Json()).dump(), v.dump());
      }
      const Json saved_data = Json::parse(ck.info().data), data = Json::parse(m.run_desc.data);
      // Older manifests name a byte corpus by its SHA-256 alone.
      const std::string saved_id = saved_data.value("identity", saved_data.value("sha256", ""));
      const std::string saved_kind = saved_data.value("kind", "corpus");
      TORUS_CHECK(saved_id == data.value("identity", "") && saved_kind == data.value("kind", ""), InvalidArgument,
                  "--resume {}: the checkpoint was trained on {} ({} {}), this run reads {} ({} {}): other data",
                  ck.path(), saved_data.value("source", "?"), saved_kind, saved_id, data.value("source", "?"),
                  data.value("kind", "?"), data.value("identity", "?"));
      // The weights came from the saved run's --init-from: this run's
      // checkpoints keep naming it (the export's default tokenizer), once
      // this checkpoint is the one loaded (below). An older checkpoint's
      // relative path is not carried (it named another working directory).
      const Json saved_options = Json::parse(ck.info().options);
      const auto it = saved_options.is_object() ? saved_options.find("init-from") : saved_options.end();
      origins[ck.path()] = it != saved_options.end() && it->is_string() && !it->get<std::string>().empty() &&
                                   it->get<std::string>().front() == '/'
                               ? it->get<std::string>()
                               : std::string();
      for (const char* key : {"seed", "batch", "seq", "val_fraction"}) {
        if (saved_data.value(key, Json()) != data.value(key, Json()) && m.world->rank() == 0) {
          TORUS_LOG_WARN(
              "--resume {}: the checkpoint's data {} is {}, this run's {}: the batches differ from the "
              "saved run's",
              ck.path(), key, saved_data.value(key, Json()).dump(), data.value(key, Json()).dump());
        }
      }
    };
    m.resumed = resume(m.world, *m.trainer, c.resume, c.checkpoint_dir(), m.run_desc.layout, check);
    if (!m.resumed.path.empty() && !origins[m.resumed.path].empty()) {
      Json options = Json::parse(m.run_desc.options);
      options["init-from"] = origins[m.resumed.path];
      m.run_desc.options = options.dump();
    }
    m.start_step = m.resumed.step;
    if (!m.resumed.path.empty() && m.world->rank() == 0) {
      const Json pos = Json::parse(m.data->position_json(m.resumed.step));
      TORUS_LOG_INFO("resume: step {} from {} (data: epoch {}, sample {} of the epoch){}", m.resumed.step,
                     m.resumed.path, pos.value("epoch", Json()).dump(), pos.value("sample_in_epoch", Json()).dump(),
                     m.resumed.same_layout ? "" : " (another layout: resharded; dropout streams start afresh)");
    }
  }

  // Note [Honest MFU].
  if (c.peak_tflops > 0) {
    m.peak = c.peak_tflops * 1e12;
    m.peak_source = "--peak-tflops";
  } else if (m.model->device().is_cuda()) {
    const auto props = device::get_device(DeviceType::kCUDA).properties(std::max<int>(0, m.model->device().index()));
    m.peak = cuda_dense_peak_flops(props.name, m.model->param_dtype()) * m.world->size();
    m.peak_source = m.peak > 0 ? "datasheet " + props.name : "none";
    if (m.peak == 0) TORUS_LOG_WARN("train: no documented peak for '{}': MFU is left out", props.name);
  } else {
    const JobPeak peak = measure_job_cpu_peak_flops(m.world, m.model->param_dtype());
    m.peak = peak.flops;
    m.peak_source = peak.source;
  }
}

TrainLoop::~TrainLoop() = default;

void TrainLoop::set_line_sink(std::function<void(std::string_view)> sink) {
  impl_->sink = std::move(sink);
}
void TrainLoop::on_step(std::function<void(const StepRecord&)> observer) {
  impl_->observers.push_back(std::move(observer));
}
void TrainLoop::on_step_begin(std::function<void(int64_t)> observer) {
  impl_->begin_observers.push_back(std::move(observer));
}
Trainer& TrainLoop::trainer() {
  return *impl_->trainer;
}
const RunConfig& TrainLoop::config() const {
  return impl_->cfg;
}
double TrainLoop::peak_flops() const {
  return impl_->peak;
}
const MemoryEstimate& TrainLoop::memory_estimate() const {
  return impl_->estimate;
}
const MemoryBudget& TrainLoop::memory_available() const {
  return impl_->available;
}

RunSummary TrainLoop::run() {
  Impl& m = *impl_;
  const RunConfig& c = m.cfg;
  Trainer& trainer = *m.trainer;
  const bool logger = trainer.is_logging_rank();
  const int world_size = m.world->size();
  const double flops_per_token = trainer.flops_per_token(c.seq);
  const bool fp16 = m.model->param_dtype() == at::kHalf;

  std::unique_ptr<JsonlWriter> metrics;
  std::unique_ptr<TensorBoardWriter> tb;
  std::unique_ptr<ProgressBar> bar;
  if (logger) {
    std::filesystem::create_directories(c.out);
    // A resumed run appends (a "resume" record marks where); the plots take
    // the last record of each step.
    metrics = std::make_unique<JsonlWriter>(c.out + "/metrics.jsonl", /*truncate=*/m.resumed.path.empty());
    if (c.tensorboard) tb = std::make_unique<TensorBoardWriter>(c.out + "/tb");
    m.line(fmt::format("{}: {} ranks, {}; model {} ({}), seq {}, {:.2f}M parameters, {}", m.program, world_size,
                       m.layout.describe(), c.model, m.model->describe(), c.seq, trainer.num_parameters() / 1e6,
                       c.precision));
    const auto stages = trainer.describe_stages();
    for (size_t s = 0; s < stages.size(); ++s) m.line(fmt::format("  stage {}: {}", s, stages[s]));
    m.line(fmt::format("data: {}; batch {} x {} tokens; peak {:.1f} GFLOP/s", m.data->describe(), c.batch, c.seq,
                       m.peak / 1e9));
    Json cfg = {{"event", "config"},
                {"world_size", world_size},
                {"layout", m.layout.describe()},
                {"model", m.model->name()},
                {"parameters", trainer.num_parameters()},
                {"flops_per_token", flops_per_token},
                {"peak_flops", m.peak},
                {"peak_source", m.peak_source},
                {"data", Json::parse(m.run_desc.data)}};
    cfg["options"] = Json::parse(c.to_json());
    const MemoryEstimate& e = m.estimate;  // the fullest pipeline rank's, the same on every rank
    cfg["memory_estimate"] = {
        {"parameters", e.parameters},          {"gradients", e.gradients}, {"optimizer", e.optimizer},
        {"activations", e.activations},        {"buffers", e.buffers},     {"host_optimizer", e.host_optimizer},
        {"host_parameters", e.host_parameters}};
    metrics->write(cfg);
    if (!m.resumed.path.empty()) {
      metrics->write({{"event", "resume"},
                      {"step", m.resumed.step},
                      {"checkpoint", m.resumed.path},
                      {"same_layout", m.resumed.same_layout}});
      m.line(fmt::format("resumed at step {} from {}", m.resumed.step, m.resumed.path));
    }
    const bool tty = ::isatty(::fileno(stderr)) == 1;
    if (c.progress == "on" || (c.progress == "auto" && tty)) bar = std::make_unique<ProgressBar>(c.steps, stderr);
  }

  // Each data rank reads only the rows it trains on (Trainer::local_rows).
  const std::vector<int64_t> rows = trainer.local_rows(c.batch);
  const int64_t local_rows = static_cast<int64_t>(rows.size());
  auto evaluate = [&]() {
    double sum = 0;
    for (int64_t i = 0; i < c.eval_batches; ++i) {
      sum += trainer.evaluate(LocalBatch{to_tensor(m.data->val_rows(i, rows), local_rows, c.seq + 1), c.batch});
    }
    return sum / static_cast<double>(c.eval_batches);
  };

  std::unique_ptr<Checkpointer> checkpointer;
  if (c.saves_checkpoints()) {
    CheckpointPolicy policy;
    policy.dir = c.checkpoint_dir();
    policy.every = c.save_every;
    policy.final = true;
    policy.keep_last = c.keep_last;
    policy.async = c.async_save;
    policy.peer_timeout_s = c.save_timeout;
    checkpointer = std::make_unique<Checkpointer>(m.world, trainer, policy, m.run_desc);
  }

  RunSummary summary;
  summary.out_dir = c.out;
  double tokens = 0, seconds = 0, data_seconds = 0;
  bool first = true;
  const auto t_start = Clock::now();
  for (int64_t step = m.start_step; step < c.steps; ++step) {
    for (auto& f : m.begin_observers) f(step);
    const double step_lr = m.lr.at(step);
    const auto t_data = Clock::now();
    LocalBatch batch{to_tensor(m.data->train_rows(step, rows), local_rows, c.seq + 1), c.batch};
    const double data_s = std::chrono::duration<double>(Clock::now() - t_data).count();
    const StepStats st = trainer.train_step(batch, step_lr);
    const bool last = step + 1 == c.steps;
    StepRecord r;
    r.step = st.step;
    r.loss = st.loss;
    if (last || (c.eval_interval > 0 && (step + 1) % c.eval_interval == 0)) r.val_loss = evaluate();
    r.mem_bytes = all_reduce_scalar(m.world, static_cast<double>(peak_rss_bytes()), comm::ReduceOp::kMax);
    r.grad_norm = st.grad_norm;
    r.clip = st.clip_coefficient;
    r.lr = step_lr;
    r.tokens_per_s = static_cast<double>(st.tokens) / st.seconds;
    r.mfu = m.peak > 0 ? r.tokens_per_s * flops_per_token / m.peak : std::nan("");
    r.step_s = st.seconds;
    r.data_s = data_s;
    r.pipeline_s = st.pipeline_seconds;
    r.sync_s = st.sync_seconds;
    r.skipped = st.skipped;
    r.loss_scale = st.loss_scale;
    r.skipped_steps = st.skipped_steps;
    r.peak_live_micro = st.peak_live;
    r.routing = st.routing;
    tokens += static_cast<double>(st.tokens);
    seconds += st.seconds;
    data_seconds += data_s;
    if (first) summary.first_loss = r.loss;
    first = false;
    summary.final_loss = r.loss;
    if (!std::isnan(r.val_loss)) summary.final_val_loss = r.val_loss;
    if (logger) {
      if (r.mfu > 1.0) {
        TORUS_LOG_WARN("train: MFU {:.0f}% exceeds the measured peak {:.1f} GFLOP/s: the peak is wrong", r.mfu * 100,
                       m.peak / 1e9);
      }
      Json step_json = {{"event", "step"},
                        {"step", r.step},
                        {"loss", number(r.loss)},
                        {"val_loss", number(r.val_loss)},
                        {"grad_norm", number(r.grad_norm)},
                        {"clip", number(r.clip)},
                        {"lr", r.lr},
                        {"tokens_per_s", number(r.tokens_per_s)},
                        {"mfu", number(r.mfu)},
                        {"mem_bytes", r.mem_bytes},
                        {"step_s", r.step_s},
                        {"data_s", r.data_s},
                        {"pipeline_s", r.pipeline_s},
                        {"sync_s", r.sync_s},
                        {"skipped", r.skipped},
                        {"skipped_steps", r.skipped_steps},
                        {"loss_scale", r.loss_scale},
                        {"peak_live_micro", r.peak_live_micro}};
      if (!r.routing.empty()) step_json["moe"] = routing_json(r.routing);
      metrics->write(step_json);
      if (tb) {
        tb->add_scalar("train/loss", r.loss, r.step);
        if (!std::isnan(r.val_loss)) tb->add_scalar("val/loss", r.val_loss, r.step);
        tb->add_scalar("train/lr", r.lr, r.step);
        tb->add_scalar("train/grad_norm", r.grad_norm, r.step);
        if (fp16) tb->add_scalar("train/loss_scale", r.loss_scale, r.step);
        tb->add_scalar("perf/tokens_per_s", r.tokens_per_s, r.step);
        if (!std::isnan(r.mfu)) tb->add_scalar("perf/mfu", r.mfu, r.step);
        tb->add_scalar("mem/peak_rss_bytes", r.mem_bytes, r.step);
        if (!r.routing.empty()) {
          tb->add_scalar("moe/aux_loss", r.routing.aux_loss(), r.step);
          tb->add_scalar("moe/z_loss", r.routing.z_loss(), r.step);
          tb->add_scalar("moe/drop_rate", r.routing.drop_rate(), r.step);
          tb->add_scalar("moe/imbalance", r.routing.imbalance(), r.step);
        }
        tb->flush();
      }
      if (r.step % c.log_interval == 0 || last || !std::isnan(r.val_loss)) {
        if (bar) bar->clear();
        StepLine sl;
        sl.step = r.step;
        sl.loss = r.loss;
        sl.val_loss = r.val_loss;
        sl.grad_norm = r.grad_norm;
        sl.lr = r.lr;
        sl.tokens_per_s = r.tokens_per_s;
        sl.mfu = r.mfu;
        sl.mem_bytes = r.mem_bytes;
        if (fp16) {
          sl.loss_scale = r.loss_scale;
          sl.skipped = r.skipped_steps;
        }
        if (!r.routing.empty()) {
          sl.aux_loss = r.routing.aux_loss();
          sl.drop_rate = r.routing.drop_rate();
          sl.imbalance = r.routing.imbalance();
        }
        m.line(format_step_line(sl));
      }
      if (bar) bar->update(r.step, r.tokens_per_s);
    }
    if (checkpointer) {
      const Json state = {{"step", r.step},
                          {"loss", number(r.loss)},
                          {"val_loss", number(summary.final_val_loss)},
                          {"skipped_steps", r.skipped_steps},
                          {"loss_scale", r.loss_scale},
                          {"tokens", static_cast<double>(r.step) * static_cast<double>(c.batch * c.seq)}};
      if (checkpointer->after_step(r.step, last, state.dump()) && logger) {
        metrics->write({{"event", "checkpoint"},
                        {"step", r.step},
                        {"path", fmt::format("{}/step-{:08d}", c.checkpoint_dir(), r.step)},
                        {"async", c.async_save},
                        {"stall_s", checkpointer->last_stall_s()}});
        m.line(fmt::format("checkpoint: step {} {} ({:.3f} s in the training loop)", r.step,
                           c.async_save ? "snapshot taken, writing in the background" : "saved",
                           checkpointer->last_stall_s()));
      }
    }
    for (auto& f : m.observers) f(r);
  }
  if (checkpointer) checkpointer->wait();
  summary.steps = c.steps - m.start_step;
  summary.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  summary.tokens_per_s = tokens / seconds;
  // Reading the data against the steps it feeds: the largest share of any rank.
  summary.data_fraction = all_reduce_scalar(m.world, seconds > 0 ? data_seconds / seconds : 0, comm::ReduceOp::kMax);
  // Peak resident memory: this rank's, and the job's sum (every rank).
  summary.peak_rss_bytes = peak_rss_bytes();
  summary.job_peak_rss_bytes = static_cast<int64_t>(
      all_reduce_scalar(m.world, static_cast<double>(summary.peak_rss_bytes), comm::ReduceOp::kSum));
  const std::string peak_line = fmt::format("peak resident memory: {} on this rank, {} over the job",
                                            format_bytes(static_cast<double>(summary.peak_rss_bytes)),
                                            format_bytes(static_cast<double>(summary.job_peak_rss_bytes)));
  if (!logger) TORUS_LOG_INFO("{}", peak_line);
  // Losses are the same on every rank (the trainer shares them); the
  // validation loss too.
  if (logger) {
    if (bar) bar->finish();
    metrics->write({{"event", "end"},
                    {"steps", c.steps},
                    {"wall_s", summary.wall_s},
                    {"tokens_per_s", summary.tokens_per_s},
                    {"data_fraction", summary.data_fraction},
                    {"first_loss", number(summary.first_loss)},
                    {"final_loss", number(summary.final_loss)},
                    {"final_val_loss", number(summary.final_val_loss)},
                    {"peak_rss_bytes", summary.peak_rss_bytes},
                    {"job_peak_rss_bytes", summary.job_peak_rss_bytes}});
    m.line(fmt::format(
        "done: {} steps{} in {:.1f} s, {:.0f} tok/s; loss {:.3f} -> {:.3f}, validation {:.3f}; wrote "
        "{}/metrics.jsonl{}",
        summary.steps, m.start_step > 0 ? fmt::format(" (resumed at step {})", m.start_step) : std::string(),
        summary.wall_s, summary.tokens_per_s, summary.first_loss, summary.final_loss, summary.final_val_loss, c.out,
        tb ? " and " + c.out + "/tb" : ""));
    m.line(peak_line);
    m.line(fmt::format("data loading: {:.3f}% of the time in train_step (largest share of any rank)",
                       summary.data_fraction * 100));
  }
  return summary;
}

}  // namespace torus::run
