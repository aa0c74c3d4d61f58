// Publishing a checkpoint (buffers.h, Note [Atomic save] in checkpoint.h):
// finalize() gathers every rank's .done.json into manifest.json, renames the
// step's directory into place and writes COMPLETE last; remove_checkpoint()
// takes one away so that it never looks complete half-way. Free of
// LibTorch: the tensor and the buffer writers both end here.
#include <chrono>
#include <ctime>
#include <thread>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "core/log.h"

namespace torus::ckpt {
namespace {

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::string finalize(const RankWrite& mine, const RunInfo& info, const SaveOptions& options) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.peer_timeout_s);
  std::vector<Json> dones(info.world_size);
  std::vector<bool> have(info.world_size, false);
  int missing = info.world_size;
  auto sleep = std::chrono::milliseconds(1);
  while (missing > 0) {
    for (int r = 0; r < info.world_size; ++r) {
      if (have[r]) continue;
      const std::string p = (fs::path(mine.tmp_dir) / done_file(r)).string();
      if (!fs::exists(p)) {
        // A rank whose write failed leaves its error here: stop waiting.
        const std::string failed = (fs::path(mine.tmp_dir) / failed_file(r)).string();
        if (fs::exists(failed)) {
          std::string why = read_text(failed);
          while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
          throw ckpt::CheckpointError(
              fmt::format("checkpoint: step {}: rank {} failed to write its files: {}", info.step, r, why));
        }
        continue;
      }
      dones[r] = parse_json(read_text(p), p);
      have[r] = true;
      --missing;
    }
    if (missing == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<int> absent;
      for (int r = 0; r < info.world_size; ++r) {
        if (!have[r]) absent.push_back(r);
      }
      throw CheckpointError(fmt::format("checkpoint: step {}: rank(s) {} did not finish writing into {} within {} s",
                                        info.step, fmt::join(absent, ","), mine.tmp_dir, options.peer_timeout_s));
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }

  Json files = Json::array();
  Json tensors = Json::object();
  Json aliases = Json::object();
  for (int r = 0; r < info.world_size; ++r) {
    const Json& d = dones[r];
    const std::string what = done_file(r);
    TORUS_CHECK(d.value("run_id", "") == info.run_id && d.value("step", -1) == info.step, ckpt::CheckpointError,
                "checkpoint: {} belongs to run {} step {}, not run {} step {}", what, d.value("run_id", "?"),
                d.value("step", -1), info.run_id, info.step);
    files.push_back({{"name", d["file"]}, {"rank", r}, {"bytes", d["bytes"]}, {"sha256", d["sha256"]}});
    for (const auto& [name, sj] : d["slices"].items()) {
      Json& t = tensors[name];
      if (t.is_null()) {
        t = {{"dtype", d["dtypes"][name]}, {"shape", sj["global_shape"]}, {"pieces", Json::array()}};
      }
      TORUS_CHECK(t["shape"] == sj["global_shape"] && t["dtype"] == d["dtypes"][name], ckpt::CheckpointError,
                  "checkpoint: '{}' has shape {} {} on rank {} but {} {} on an earlier rank", name,
                  sj["global_shape"].dump(), d["dtypes"][name].dump(), r, t["shape"].dump(), t["dtype"].dump());
      Json piece = sj;
      piece.erase("global_shape");
      piece["file"] = d["file"];
      piece["rank"] = r;
      t["pieces"].push_back(piece);
    }
    for (const auto& [name, owner] : d["aliases"].items()) aliases[name] = owner;
  }
  Json manifest = {{"format", "torus-checkpoint"},
                   {"version", kFormatVersion},
                   {"run_id", info.run_id},
                   {"step", info.step},
                   {"world_size", info.world_size},
                   {"created", iso_now()},
                   {"layout", parse_json(info.layout, "the layout")},
                   {"model", parse_json(info.model, "the model")},
                   {"data", parse_json(info.data, "the data")},
                   {"metrics", parse_json(info.metrics, "the metrics")},
                   {"options", parse_json(info.options, "the options")},
                   {"files", files},
                   {"aliases", aliases},
                   {"tensors", tensors}};
  // What the state must match to be loaded (RunInfo::state): recorded when
  // there is something to match, so the engine's manifests stay as they were.
  const Json state = parse_json(info.state, "the state");
  TORUS_CHECK(state.is_object(), InvalidArgument, "checkpoint: the state '{}' is not a JSON object", info.state);
  if (!state.empty()) manifest["state"] = state;
  const std::string mpath = (fs::path(mine.tmp_dir) / kManifest).string();
  std::error_code ignore;
  fs::remove(mpath, ignore);
  const std::string msha = write_file(mpath, manifest.dump(1));
  fsync_dir(mine.tmp_dir);
  // A directory of the same step left by an earlier run (never complete, or
  // complete and about to be superseded by this one) goes first.
  if (fs::exists(mine.final_dir)) remove_checkpoint(mine.final_dir);
  rename_durable(mine.tmp_dir, mine.final_dir);
  const std::string cpath = (fs::path(mine.final_dir) / kComplete).string();
  write_file(cpath, Json({{"step", info.step}, {"run_id", info.run_id}, {"manifest_sha256", msha}}).dump() + "\n");
  fsync_dir(mine.final_dir);
  return mine.final_dir;
}

void remove_checkpoint(const std::string& path) {
  std::error_code ec;
  const fs::path marker = fs::path(path) / kComplete;
  if (fs::exists(marker)) {
    fs::remove(marker, ec);
    TORUS_CHECK(!ec, ckpt::CheckpointError, "checkpoint: cannot remove {}: {}", marker.string(), ec.message());
    fsync_dir(path);
  }
  remove_tree(path);
}

}  // namespace torus::ckpt
