// Checkpoints of a training run (checkpointing.h): the engine's state as
// slices, loading into any layout, the save policy and resuming.
#include "torus/engine/checkpointing.h"

#include <ATen/Functions.h>
#include <c10/util/irange.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "checkpoint/file_io.h"
#include "core/log.h"
#include "torus/checkpoint/mapped_safetensors.h"
#include "torus/comm/device_mesh.h"
#include "torus/parallel/pipeline/schedule.h"

namespace torus::engine {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t all_reduce_long(const comm::ProcessGroupPtr& world, int64_t v, comm::ReduceOp op) {
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kLong));
  if (world->size() > 1) world->all_reduce(t, {.op = op})->wait();
  return t.item<int64_t>();
}

// What identifies the placement of rank-specific state: two layouts with
// the same values here give every rank the same stages and TP slice.
bool same_placement(const std::string& a, const std::string& b) {
  const Json ja = Json::parse(a), jb = Json::parse(b);
  for (const char* k : {"world_size", "stages"}) {
    if (ja.value(k, Json()) != jb.value(k, Json())) return false;
  }
  // A manifest without a layout field (an older one) places differently.
  for (const parallel::LayoutField& f : parallel::layout_fields()) {
    if (f.placement && ja.value(f.json_key(), Json()) != jb.value(f.json_key(), Json())) return false;
  }
  return true;
}

struct Prepared {
  StateDict incoming;
  LoadReport report;
};

Prepared prepare_load(Trainer& trainer, const ckpt::Checkpoint& ck, const std::string& layout, bool model_only) {
  Prepared p;
  if (!model_only) trainer.init_optimizer_state();  // every optim.* key this rank holds, to be filled
  p.report.path = ck.path();
  p.report.step = ck.info().step;
  p.report.same_layout = same_placement(ck.info().layout, layout);
  const StateDict mine = trainer.state_dict();
  ckpt::ShardedState target = sharded_state(trainer, /*for_save=*/false);
  for (auto it = target.begin(); it != target.end();) {
    auto& [key, s] = *it;
    if (model_only && !starts_with(key, "model.")) {
      // Half-precision runs: the fp32 master of a parameter starts from the
      // loaded weights.
      const size_t dot = key.rfind('.');
      if (starts_with(key, "optim.") && dot != std::string::npos && key.substr(dot) == ".master") {
        s.alias_of = "model." + key.substr(6, dot - 6);
      } else {
        it = target.erase(it);
        continue;
      }
    }
    s.tensor = at::empty(s.tensor.sizes(), s.tensor.options().device(at::kCPU));
    ++it;
  }
  const int rank = trainer.mesh().world()->rank();
  const std::vector<std::string> missing = ck.load_into(target, rank, p.report.same_layout);
  for (const auto& key : missing) {
    if (starts_with(key, "rng.") || starts_with(key, "scaler.")) {
      p.report.kept.push_back(key);
      continue;
    }
    if (starts_with(key, "optim.")) {
      // A parameter the saved run never updated has no state at all there:
      // it starts from zeros here too (what its first update would create).
      const size_t dot = key.rfind('.');
      const std::string prefix = key.substr(0, dot + 1);
      bool any = false;
      for (const auto& [name, info] : ck.tensors()) any = any || name.rfind(prefix, 0) == 0;
      if (!any && dot != std::string::npos && key != "optim.step_count") {
        p.report.kept.push_back(key);
        continue;
      }
    }
    if (starts_with(key, "model.")) {
      throw ckpt::CheckpointError(fmt::format(
          "checkpoint: {} has no tensor '{}' that this model needs: it holds another model", ck.path(), key));
    }
    throw ckpt::CheckpointError(
        fmt::format("checkpoint: {} has no '{}' (optimizer state or counters of this run)", ck.path(), key));
  }
  p.incoming = mine;
  for (auto& [key, st] : p.incoming) {
    auto t = target.find(key);
    bool missing_key = std::find(missing.begin(), missing.end(), key) != missing.end();
    if (t != target.end() && !missing_key) {
      st.tensor = t->second.tensor;
    } else if (!missing_key) {
      p.report.kept.push_back(key);  // model_only: optimizer state and counters stay
    }
  }
  return p;
}

}  // namespace

ckpt::ShardedState sharded_state(const Trainer& trainer, bool for_save) {
  const comm::DeviceMesh& mesh = trainer.mesh();
  const int tp_rank = mesh.coord("tp"), tp_size = mesh.size("tp");
  const int world_rank = mesh.world()->rank();
  // Dense tensors are replicated over the data ranks (dp x ep), an expert's
  // over dp (Note [MoE groups] in parallel/expert/moe.h).
  const int dp_size = mesh.size("dp"), ep_size = mesh.size("ep");
  const int expert_rank = mesh.coord("dp"), data_rank = mesh.coord("dp") * ep_size + mesh.coord("ep");
  const StateDict state = trainer.state_dict();
  // Note [Balanced writers]: a tensor replicated over the data ranks is
  // written by one of them, chosen so that they write about the same bytes
  // (the largest first, each to the least loaded; every replica holds the
  // same such tensors, so each computes the same assignment without
  // communicating). Expert tensors are assigned among their own replicas.
  std::map<std::string, int> replica_writer;
  if (for_save) {
    for (const bool experts : {false, true}) {
      std::vector<std::pair<int64_t, std::string>> sizes;
      for (const auto& [key, st] : state) {
        if ((key.rfind("model.", 0) == 0 || key.rfind("optim.", 0) == 0) && st.tensor.dim() > 0 && st.flat_offset < 0 &&
            st.tied_to.empty() && st.expert == experts) {
          sizes.emplace_back(st.tensor.numel() * static_cast<int64_t>(st.tensor.element_size()), key);
        }
      }
      std::sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      std::vector<int64_t> load(experts ? dp_size : dp_size * ep_size, 0);
      for (const auto& [bytes, key] : sizes) {
        const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        load[r] += bytes;
        replica_writer[key] = r;
      }
    }
  }
  ckpt::ShardedState out;
  for (const auto& [key, st] : state) {
    ckpt::TensorSlice s;
    s.tensor = st.tensor;
    s.alias_of = st.tied_to;
    const bool rng = starts_with(key, "rng.");
    s.per_rank = rng || st.per_rank;
    const bool flat = st.flat_offset >= 0;
    std::vector<int64_t> shard = flat ? st.flat_shape : st.tensor.sizes().vec();
    s.global_shape = shard;
    s.box_offset.assign(shard.size(), 0);
    s.box_shape = shard;
    if (st.spec.sharded() && st.tensor.dim() > 0) {
      const int d = st.spec.dim;
      TORUS_CHECK(d < static_cast<int>(shard.size()), InvalidArgument,
                  "checkpoint: '{}' is split on dimension {} of {}", key, d, shard.size());
      s.box_offset[d] = int64_t{tp_rank} * shard[d];
      s.global_shape[d] = st.spec.full_size >= 0 ? st.spec.full_size : shard[d] * tp_size;
    }
    if (flat) {
      s.flat_begin = st.flat_offset;
      s.flat_end = st.flat_offset + st.tensor.numel();
    }
    if (for_save) {
      bool writer;
      const bool replicated_tp = !st.spec.sharded();
      if (rng) {
        writer = true;
      } else if (starts_with(key, "model.") || starts_with(key, "optim.")) {
        if (st.tensor.dim() == 0) {
          writer = tp_rank == 0;  // per-parameter counters: every dp rank that holds a segment
        } else if (flat) {
          writer = !replicated_tp || tp_rank == 0;
        } else {
          auto w = replica_writer.find(key);
          writer = (w == replica_writer.end() ? 0 : w->second) == (st.expert ? expert_rank : data_rank) &&
                   (!replicated_tp || tp_rank == 0);
        }
      } else {
        writer = world_rank == 0;  // engine counters, the loss scaler
      }
      if (!writer) continue;
    }
    out[key] = std::move(s);
  }
  return out;
}

std::string layout_json(const Trainer& trainer, const std::string& precision) {
  Json j = Json::parse(trainer.layout().to_json());
  j["world_size"] = trainer.mesh().world()->size();
  j["stages"] = trainer.describe_stages();
  j["precision"] = precision;
  return j.dump();
}

LoadReport load_checkpoint(Trainer& trainer, const ckpt::Checkpoint& ck, const std::string& layout, bool model_only) {
  Prepared p = prepare_load(trainer, ck, layout, model_only);
  trainer.load_state_dict(p.incoming);
  return p.report;
}

// ---------------------------------------------------------------------------
// Weights from a WeightSource (Note [Weight sources])

SourceTensor SourceTensor::of(at::Tensor full, std::string origin) {
  SourceTensor t;
  t.shape = full.sizes().vec();
  t.origin = std::move(origin);
  t.read = [full = std::move(full)](const std::vector<int64_t>& offset, const std::vector<int64_t>& size) {
    at::Tensor v = full;
    for (size_t d = 0; d < size.size(); ++d) v = v.narrow(static_cast<int64_t>(d), offset[d], size[d]);
    return v;
  };
  return t;
}

void load_weights(Trainer& trainer, const WeightSource& source) {
  ckpt::ShardedState target = sharded_state(trainer, false);
  StateDict incoming = trainer.state_dict();
  for (auto& [key, s] : target) {
    std::string name = s.alias_of.empty() ? key : s.alias_of;
    bool master = false;
    if (starts_with(key, "optim.") && key.size() > 7 && key.substr(key.size() - 7) == ".master") {
      name = "model." + key.substr(6, key.size() - 13);
      master = true;
    } else if (!starts_with(key, "model.")) {
      continue;
    }
    const std::string bare = name.substr(6);
    const std::optional<SourceTensor> src = source.find(bare);
    TORUS_CHECK(src.has_value(), ckpt::CheckpointError,
                "{}: no tensor for the model's parameter '{}'{} (looked for {})", source.describe(), bare,
                master ? " (behind a master weight)" : "", source.expected(bare));
    TORUS_CHECK(src->shape == s.global_shape, ckpt::CheckpointError,
                "{}: {} has shape [{}] as the model's parameter '{}', whose shape is [{}]", source.describe(),
                src->origin, fmt::join(src->shape, ", "), bare, fmt::join(s.global_shape, ", "));
    // This rank's slice: the box (zero-padded past the global shape), then
    // the flat range under ZeRO; only the box's part inside the global
    // shape is read from the source.
    at::Tensor box = at::zeros(s.box_shape, s.tensor.options().device(at::kCPU));
    std::vector<int64_t> offset(s.box_shape.size()), size(s.box_shape.size());
    at::Tensor dst = box;
    bool empty = false;
    for (size_t d = 0; d < s.box_shape.size(); ++d) {
      const int64_t n = std::min(s.box_shape[d], s.global_shape[d] - s.box_offset[d]);
      if (n <= 0) {
        empty = true;
        break;
      }
      offset[d] = s.box_offset[d];
      size[d] = n;
      dst = dst.narrow(static_cast<int64_t>(d), 0, n);
    }
    if (!empty) {
      const at::Tensor part = src->read(offset, size);
      TORUS_CHECK(part.sizes().vec() == size, ckpt::CheckpointError,
                  "{}: {} gave a box of shape {} for '{}', [{}] was asked for", source.describe(), src->origin,
                  c10::str(part.sizes()), bare, fmt::join(size, ", "));
      dst.copy_(part);  // converts the dtype
    }
    at::Tensor piece = s.flat_begin >= 0 ? box.reshape({-1}).slice(0, s.flat_begin, s.flat_end) : box;
    incoming.at(key).tensor = piece.view(s.tensor.sizes());
  }
  trainer.load_state_dict(incoming);
}

namespace {

// A plain safetensors file of full tensors under the global names, mapped.
class SafetensorsSource : public WeightSource {
 public:
  explicit SafetensorsSource(const std::string& path) : file_(ckpt::MappedSafetensors::open(path)) {}
  std::optional<SourceTensor> find(const std::string& name) const override {
    for (const std::string& n : {name, "model." + name}) {
      if (file_->find(n) != nullptr) return SourceTensor::of(file_->tensor(n), "'" + n + "'");
    }
    return std::nullopt;
  }
  std::string describe() const override { return file_->path(); }
  std::string expected(const std::string& name) const override { return fmt::format("'{}' or 'model.{}'", name, name); }

 private:
  std::shared_ptr<const ckpt::MappedSafetensors> file_;
};

}  // namespace

void load_safetensors_weights(Trainer& trainer, const std::string& path) {
  load_weights(trainer, SafetensorsSource(path));
}

// ---------------------------------------------------------------------------
// Checkpointer

struct Checkpointer::Impl {
  comm::ProcessGroupPtr world;
  Trainer* trainer = nullptr;
  // The hold on the next update while the background thread copies the
  // parameters and optimizer state (Note [Save consistency]).
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool released = true;
  CheckpointPolicy policy;
  RunDescription run;
  std::string run_id;
  int rank = 0;
  std::thread worker;
  bool pending = false;
  int64_t pending_step = -1;
  std::string error;  // this rank's failure of the pending or last save
  double stall_s = 0, save_s = 0;
  std::string last_path;
  int64_t last_step = -1;

  ckpt::RunInfo info(int64_t step, const std::string& metrics) const {
    ckpt::RunInfo i;
    i.run_id = run_id;
    i.step = step;
    i.layout = run.layout;
    i.model = run.model;
    Json data = Json::parse(run.data);
    data["position"] = step;  // batches drawn: the sampler is a function of the step
    if (run.data_position) {
      const Json position = Json::parse(run.data_position(step));  // named: items() refers into it
      for (const auto& [key, v] : position.items()) data[key] = v;
    }
    i.data = data.dump();
    i.metrics = metrics;
    i.options = run.options;
    i.world_size = world->size();
    return i;
  }

  // A failure marker, so that rank 0 stops waiting for this rank's files.
  // Best effort (the disk may be full): plain stream, no checks.
  void mark_failed(int64_t step, const std::string& what) const {
    const fs::path dir = fs::path(policy.dir) / fmt::format("step-{:08d}.tmp-{}", step, run_id);
    std::ofstream out(dir / fmt::format("rank-{:05d}.failed", rank));
    out << what << "\n";
  }

  // Writes (and on rank 0 completes) one checkpoint; returns "" or the error.
  std::string write(const ckpt::ShardedState& state, const ckpt::RunInfo& i) {
    try {
      const ckpt::RankWrite w = ckpt::write_rank(policy.dir, rank, state, i);
      if (rank == 0) {
        ckpt::SaveOptions so;
        so.peer_timeout_s = policy.peer_timeout_s;
        last_path = ckpt::finalize(w, i, so);
        prune(i.step);
      }
      return "";
    } catch (const std::exception& e) {
      mark_failed(i.step, e.what());
      return e.what();
    }
  }

  // keep-last: only complete checkpoints count, the newest K stay; this
  // run's unfinished saves of earlier steps go.
  void prune(int64_t step) {
    const auto all = ckpt::list_checkpoints(policy.dir);
    std::vector<const ckpt::Listed*> complete;
    for (const auto& l : all) {
      // Checkpoints of later steps (left by another run in the same
      // directory) neither count nor go: the one just written stays newest.
      if (l.complete && l.step <= step) complete.push_back(&l);
      if (!l.complete && l.step < step &&
          (l.path.find(".tmp-" + run_id) != std::string::npos || l.path.find(".tmp-") == std::string::npos)) {
        TORUS_LOG_INFO("checkpoint: removing {} (a save that did not complete: {})", l.path, l.problem);
        try {
          ckpt::remove_tree(l.path);
        } catch (const ckpt::CheckpointError& e) {
          TORUS_LOG_WARN("{}", e.what());
        }
      }
    }
    if (policy.keep_last <= 0) return;
    for (size_t k = 0; k + policy.keep_last < complete.size(); ++k) {
      TORUS_LOG_INFO("checkpoint: removing {} (--keep-last {})", complete[k]->path, policy.keep_last);
      ckpt::remove_checkpoint(complete[k]->path);
    }
  }

  // Every rank learns whether the save of `step` succeeded everywhere.
  void agree(int64_t step) {
    const bool ok = error.empty();
    const int64_t all_ok = all_reduce_long(world, ok ? 1 : 0, comm::ReduceOp::kMin);
    if (all_ok == 1) {
      last_step = step;
      return;
    }
    std::string mine = error;
    error.clear();
    if (!mine.empty()) {
      TORUS_LOG_ERROR("checkpoint of step {} failed on this rank: {}", step, mine);
      throw ckpt::CheckpointError(fmt::format("checkpoint of step {} failed: {}", step, mine));
    }
    throw ckpt::CheckpointError(
        fmt::format("checkpoint of step {} failed on another rank (its log names the file and the error)", step));
  }

  void join_pending() {
    if (!pending) return;
    if (worker.joinable()) worker.join();
    trainer->set_before_update({});
    pending = false;
    agree(pending_step);
  }

  // The trainer's hook: waits until the snapshot is taken.
  void hold() {
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lock(gate_mu);
    if (released) return;
    gate_cv.wait(lock, [this] { return released; });
    stall_s += seconds_since(t0);
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(gate_mu);
      released = true;
    }
    gate_cv.notify_all();
  }
};

Checkpointer::Checkpointer(comm::ProcessGroupPtr world, Trainer& trainer, CheckpointPolicy policy, RunDescription run)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TORUS_CHECK(world != nullptr && !policy.dir.empty(), InvalidArgument,
              "Checkpointer: needs the world group and a directory");
  TORUS_CHECK(policy.every >= 0 && policy.keep_last >= 0 && policy.peer_timeout_s > 0, InvalidArgument,
              "Checkpointer: every ({}) and keep_last ({}) must be >= 0, peer_timeout_s > 0", policy.every,
              policy.keep_last);
  m.world = std::move(world);
  m.trainer = &trainer;
  m.policy = std::move(policy);
  m.run = std::move(run);
  m.rank = m.world->rank();
  int64_t id = 0;
  if (m.rank == 0) {
    std::random_device rd;
    id = static_cast<int64_t>((static_cast<uint64_t>(rd()) << 31) ^ rd() ^
                              static_cast<uint64_t>(Clock::now().time_since_epoch().count())) &
         0x7fffffffffffll;
  }
  id = all_reduce_long(m.world, id, comm::ReduceOp::kSum);
  m.run_id = fmt::format("{:012x}", id);
  // Rank 0 clears what earlier runs left — unfinished saves, and step
  // directories without COMPLETE (a kill between the rename and the marker,
  // or inside a deletion) — then every rank waits for it, so that no save
  // of this run starts before (the all-reduce below).
  std::string problem;
  if (m.rank == 0) {
    try {
      std::error_code ec;
      fs::create_directories(m.policy.dir, ec);
      TORUS_CHECK(!ec, ckpt::CheckpointError, "checkpoint: cannot create {}: {}", m.policy.dir, ec.message());
      std::vector<int64_t> later;
      for (const auto& l : ckpt::list_checkpoints(m.policy.dir)) {
        if (l.complete) {
          if (l.step > trainer.steps_taken()) later.push_back(l.step);
          continue;
        }
        if (l.path.size() >= m.run_id.size() &&
            l.path.compare(l.path.size() - m.run_id.size(), m.run_id.size(), m.run_id) == 0) {
          continue;  // this run's (none yet; never another's to remove)
        }
        TORUS_LOG_INFO("checkpoint: removing {} ({})", l.path, l.problem);
        try {
          ckpt::remove_tree(l.path);
        } catch (const ckpt::CheckpointError& e) {
          TORUS_LOG_WARN("{}", e.what());
        }
      }
      if (!later.empty()) {
        TORUS_LOG_WARN(
            "checkpoint: {} holds checkpoints of later steps ({}) than this run's {}: an earlier run's; "
            "this run replaces those of the steps it saves, and --resume auto would pick the newest",
            m.policy.dir, fmt::join(later, ", "), trainer.steps_taken());
      }
    } catch (const ckpt::CheckpointError& e) {
      problem = e.what();
    }
  }
  if (all_reduce_long(m.world, problem.empty() ? 1 : 0, comm::ReduceOp::kMin) != 1) {
    throw ckpt::CheckpointError(problem.empty() ? fmt::format("checkpoint: rank 0 cannot use {}", m.policy.dir)
                                                : problem);
  }
}

Checkpointer::~Checkpointer() {
  Impl& m = *impl_;
  if (m.worker.joinable()) m.worker.join();
  m.trainer->set_before_update({});
  if (!m.error.empty()) TORUS_LOG_ERROR("checkpoint of step {} failed: {}", m.pending_step, m.error);
}

bool Checkpointer::after_step(int64_t step, bool last, const std::string& metrics_json) {
  const CheckpointPolicy& p = impl_->policy;
  const bool due = (p.every > 0 && step % p.every == 0) || (last && (p.final || p.every > 0));
  if (!due || step == impl_->last_step || step == impl_->pending_step) return false;
  save(step, metrics_json);
  return true;
}

void Checkpointer::save(int64_t step, const std::string& metrics_json) {
  Impl& m = *impl_;
  m.join_pending();
  const auto t0 = Clock::now();
  const ckpt::RunInfo info = m.info(step, metrics_json);
  ckpt::ShardedState state = sharded_state(*m.trainer, /*for_save=*/true);
  if (m.policy.async) {
    // Small tensors now (the dropout streams advance in the next forward);
    // parameters and optimizer state in the background before the next
    // update (Note [Save consistency]).
    ckpt::ShardedState now, later;
    for (auto& [key, sl] : state) {
      const bool small = !sl.tensor.defined() || sl.tensor.numel() <= (int64_t{1} << 16) || key.rfind("rng.", 0) == 0 ||
                         key.rfind("engine.", 0) == 0 || key.rfind("scaler.", 0) == 0;
      (small ? now : later)[key] = std::move(sl);
    }
    auto snap = std::make_shared<ckpt::ShardedState>(ckpt::snapshot(now));
    {
      std::lock_guard<std::mutex> lock(m.gate_mu);
      m.released = false;
    }
    m.trainer->set_before_update([&m] { m.hold(); });
    m.stall_s = seconds_since(t0);
    m.pending = true;
    m.pending_step = step;
    auto live = std::make_shared<ckpt::ShardedState>(std::move(later));
    m.worker = std::thread([&m, snap, live, info, t0] {
      // Below the training threads: the copy, hashing and writing take the
      // cores the step leaves idle rather than slow the step (the threads
      // this one starts, e.g. for hashing, inherit it). Best effort.
      (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
      std::string error;
      try {
        for (auto& [key, sl] : ckpt::snapshot(*live)) (*snap)[key] = std::move(sl);
      } catch (const std::exception& e) {
        error = e.what();
      }
      live->clear();  // no reference to the live state remains
      m.release();
      if (error.empty()) {
        error = m.write(*snap, info);
      } else {
        m.mark_failed(info.step, error);
      }
      m.error = error;
      m.save_s = seconds_since(t0);
    });
    return;
  }
  m.error = m.write(state, info);
  m.agree(step);
  m.stall_s = m.save_s = seconds_since(t0);
}

void Checkpointer::wait() {
  impl_->join_pending();
}
double Checkpointer::last_stall_s() const {
  return impl_->stall_s;
}
double Checkpointer::last_save_s() const {
  return impl_->save_s;
}
const std::string& Checkpointer::last_path() const {
  return impl_->last_path;
}
const std::string& Checkpointer::run_id() const {
  return impl_->run_id;
}

// ---------------------------------------------------------------------------
// Resume

LoadReport resume(const comm::ProcessGroupPtr& world, Trainer& trainer, const std::string& spec, const std::string& dir,
                  const std::string& layout, const std::function<void(const ckpt::Checkpoint&)>& check) {
  const bool automatic = spec == "auto";
  std::vector<std::string> candidates;
  const bool log = world->rank() == 0;
  if (automatic) {
    const auto all = ckpt::list_checkpoints(dir);
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (it->complete) {
        candidates.push_back(it->path);
      } else if (log) {
        TORUS_LOG_WARN("resume: skipping {}: {}", it->path, it->problem);
      }
    }
  } else {
    candidates.push_back(spec);
  }
  for (const auto& path : candidates) {
    std::string error;
    std::optional<Prepared> prep;
    std::optional<ckpt::Checkpoint> ck;
    try {
      ck.emplace(ckpt::Checkpoint::open(path));
    } catch (const ckpt::CheckpointError& e) {
      error = e.what();
    }
    if (ck && check) check(*ck);  // the same manifest on every rank: throws everywhere or nowhere
    if (ck) {
      // Each rank hashes its share of the files (Note [Verified reads]); the
      // all-reduce below makes every rank's verdict everyone's before
      // anything is applied.
      ck->set_hash_reads(world->size() == 1);
      try {
        prep.emplace(prepare_load(trainer, *ck, layout, false));
        if (world->size() > 1) ck->verify_files(world->rank(), world->size());
      } catch (const ckpt::CheckpointError& e) {
        error = e.what();
      }
    }
    const int64_t all_ok = all_reduce_long(world, error.empty() ? 1 : 0, comm::ReduceOp::kMin);
    if (all_ok == 1) {
      trainer.load_state_dict(prep->incoming);
      return prep->report;
    }
    if (!automatic) {
      throw ckpt::CheckpointError(error.empty() ? fmt::format("resume: {} failed to load on another rank", path)
                                                : error);
    }
    if (!error.empty()) {
      TORUS_LOG_WARN("resume: skipping {}: {}", path, error);
    } else if (log) {
      TORUS_LOG_WARN("resume: skipping {}: it failed to load on another rank", path);
    }
  }
  if (log) TORUS_LOG_INFO("resume: no complete checkpoint in {}: starting from step 0", dir);
  return {};
}

}  // namespace torus::engine
