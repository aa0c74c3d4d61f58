// The manifest of a sharded checkpoint (checkpoint.h): finalize() gathers
// every rank's .done.json into manifest.json and publishes the directory
// (rename, then the COMPLETE marker); Checkpoint::open() reads it back,
// checked against the marker, into the state the readers use (assemble.cpp).
#include <chrono>
#include <ctime>
#include <thread>

#include "checkpoint/checkpoint_impl.h"
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

std::vector<int64_t> int_list(const Json& j, const std::string& what) {
  TORUS_CHECK(j.is_array(), ckpt::CheckpointError, "checkpoint: {} is not a list", what);
  std::vector<int64_t> out;
  for (const auto& v : j) {
    TORUS_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, ckpt::CheckpointError,
                "checkpoint: {} holds a value that is not a non-negative integer", what);
    out.push_back(v.get<int64_t>());
  }
  return out;
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
        const std::string failed = (fs::path(mine.tmp_dir) / fmt::format("rank-{:05d}.failed", r)).string();
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

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::~Checkpoint() {
  if (impl_) impl_->drain();
}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
const std::string& Checkpoint::path() const { return impl_->path; }
const RunInfo& Checkpoint::info() const { return impl_->info; }
const std::map<std::string, Checkpoint::TensorInfo>& Checkpoint::tensors() const { return impl_->listing; }
uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& f : impl_->files) n += f.bytes;
  return n;
}

Checkpoint Checkpoint::open(const std::string& path) {
  auto m = std::make_unique<Impl>();
  m->path = path;
  const std::string cpath = (fs::path(path) / kComplete).string();
  TORUS_CHECK(fs::is_directory(path), ckpt::CheckpointError, "checkpoint: {} does not exist (or is not a directory)",
              path);
  TORUS_CHECK(fs::exists(cpath), ckpt::CheckpointError,
              "checkpoint: {} is incomplete: it has no {} marker (the save did not finish)", path, kComplete);
  const Json complete = parse_json(read_text(cpath), cpath);
  const std::string mpath = (fs::path(path) / kManifest).string();
  TORUS_CHECK(fs::exists(mpath), ckpt::CheckpointError, "checkpoint: {} is missing", mpath);
  const std::string mtext = read_text(mpath);
  const std::string msha = sha256_hex(mtext.data(), mtext.size());
  TORUS_CHECK(complete.is_object() && complete.value("manifest_sha256", "") == msha, ckpt::CheckpointError,
              "checkpoint: {} does not match its {} marker (SHA-256 {} against {}): a corrupt manifest or one of "
              "another checkpoint",
              mpath, kComplete, msha, complete.is_object() ? complete.value("manifest_sha256", "?") : "?");
  const Json man = parse_json(mtext, mpath);
  try {
    TORUS_CHECK(man.value("format", "") == "torus-checkpoint", ckpt::CheckpointError, "checkpoint: {} is not a Torus manifest",
                mpath);
    const int version = man.at("version").get<int>();
    TORUS_CHECK(version >= 1 && version <= kFormatVersion, ckpt::CheckpointError,
                "checkpoint: {} has format version {}; this build reads versions 1 to {}", mpath, version,
                kFormatVersion);
    RunInfo& info = m->info;
    info.run_id = man.at("run_id").get<std::string>();
    info.step = man.at("step").get<int64_t>();
    info.world_size = man.at("world_size").get<int>();
    info.layout = man.at("layout").dump();
    info.model = man.at("model").dump();
    info.data = man.at("data").dump();
    info.metrics = man.at("metrics").dump();
    info.options = man.at("options").dump();
    TORUS_CHECK(complete.value("step", int64_t{-1}) == info.step, ckpt::CheckpointError,
                "checkpoint: {} marks step {}, the manifest says step {}", cpath, complete.value("step", int64_t{-1}),
                info.step);
    std::map<std::string, int> by_name;
    for (const auto& f : man.at("files")) {
      FileRec r;
      r.name = f.at("name").get<std::string>();
      r.rank = f.at("rank").get<int>();
      r.bytes = f.at("bytes").get<uint64_t>();
      r.sha256 = f.at("sha256").get<std::string>();
      TORUS_CHECK(r.name.find('/') == std::string::npos && r.name != ".." && !r.name.empty(), ckpt::CheckpointError,
                  "checkpoint: {} names a file outside its directory: '{}'", mpath, r.name);
      const std::string p = (fs::path(path) / r.name).string();
      std::error_code ec;
      const auto size = fs::file_size(p, ec);
      TORUS_CHECK(!ec, ckpt::CheckpointError, "checkpoint: {} is missing ({})", p, ec.message());
      TORUS_CHECK(size == r.bytes, ckpt::CheckpointError, "checkpoint: {} has {} bytes, the manifest records {} (truncated?)",
                  p, size, r.bytes);
      by_name[r.name] = static_cast<int>(m->files.size());
      m->files.push_back(r);
    }
    for (const auto& [name, t] : man.at("tensors").items()) {
      GlobalTensor g;
      g.shape = int_list(t.at("shape"), "the shape of " + name);
      g.dtype = dtype_from_code(t.at("dtype").get<std::string>());
      for (const auto& pj : t.at("pieces")) {
        Piece pc;
        auto fi = by_name.find(pj.at("file").get<std::string>());
        TORUS_CHECK(fi != by_name.end(), ckpt::CheckpointError, "checkpoint: '{}' lies in {}, which {} does not list", name,
                    pj.at("file").dump(), mpath);
        pc.file = fi->second;
        pc.rank = pj.at("rank").get<int>();
        pc.off = int_list(pj.at("box_offset"), "a box of " + name);
        pc.box = int_list(pj.at("box_shape"), "a box of " + name);
        pc.per_rank = pj.value("per_rank", false);
        TORUS_CHECK(pc.off.size() == g.shape.size() && pc.box.size() == g.shape.size(), ckpt::CheckpointError,
                    "checkpoint: a piece of '{}' has a box of another rank than the tensor", name);
        for (size_t d = 0; d < g.shape.size(); ++d) {
          TORUS_CHECK(pc.off[d] <= g.shape[d], ckpt::CheckpointError, "checkpoint: a piece of '{}' starts outside it", name);
        }
        // Boxes are bounded by the tensor (whole pieces are cropped to it; a
        // flat piece's box may carry padding, at most doubling a dimension),
        // so a manifest cannot make a loader allocate without bound.
        for (size_t d = 0; d < g.shape.size(); ++d) {
          TORUS_CHECK(pc.box[d] <= 2 * g.shape[d] + 64, ckpt::CheckpointError,
                      "checkpoint: a piece of '{}' has a box of {} along dimension {} of {}", name, pc.box[d], d,
                      g.shape[d]);
        }
        if (!pj.at("flat").is_null()) {
          auto fr = int_list(pj.at("flat"), "a flat range of " + name);
          TORUS_CHECK(fr.size() == 2 && fr[0] <= fr[1] && fr[1] <= numel_of(pc.box), ckpt::CheckpointError,
                      "checkpoint: a flat range of '{}' lies outside its box", name);
          pc.fb = fr[0];
          pc.fe = fr[1];
        } else {
          for (size_t d = 0; d < g.shape.size(); ++d) {
            TORUS_CHECK(pc.off[d] + pc.box[d] <= g.shape[d], ckpt::CheckpointError,
                        "checkpoint: a piece of '{}' reaches past the tensor along dimension {}", name, d);
          }
        }
        g.pieces.push_back(std::move(pc));
      }
      m->listing[name] = {g.shape, g.dtype, static_cast<int>(g.pieces.size())};
      m->tensors[name] = std::move(g);
    }
    for (const auto& [name, owner] : man.at("aliases").items()) m->aliases[name] = owner.get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("checkpoint: {} is malformed: {}", mpath, e.what()));
  }
  return Checkpoint(std::move(m));
}

}  // namespace torus::ckpt
