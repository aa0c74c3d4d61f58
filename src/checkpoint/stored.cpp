// An opened checkpoint without LibTorch (stored.h): the manifest read and
// checked, rank files mapped and verified beside the reads, pieces as
// stored bytes, element ranges of 1-D tensors.
#include "checkpoint/stored.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"

namespace torus::ckpt {
namespace {

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

void Stored::read_manifest(const std::string& path) {
  Stored* m = this;
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
    info.state = man.contains("state") ? man.at("state").dump() : "{}";
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
      g.dtype = t.at("dtype").get<std::string>();
      TORUS_CHECK(known_dtype(g.dtype), ckpt::CheckpointError,
                  "checkpoint: safetensors dtype {} is not supported here", g.dtype);
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
      m->tensors[name] = std::move(g);
    }
    for (const auto& [name, owner] : man.at("aliases").items()) m->aliases[name] = owner.get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("checkpoint: {} is malformed: {}", mpath, e.what()));
  }
}

const OpenFile& Stored::file(int index, bool hash) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = open.find(index);
  if (it != open.end()) {
    if (hash && !it->second.sha.valid()) start_hash(it->second);
    return it->second;
  }
  const FileRec& f = files[index];
  const std::string p = (fs::path(path) / f.name).string();
  OpenFile of;
  of.map = std::make_unique<MappedFile>(p);
  TORUS_CHECK(of.map->size() == f.bytes, ckpt::CheckpointError, "checkpoint: {} has {} bytes, the manifest says {}",
              p, of.map->size(), f.bytes);
  if (hash) start_hash(of);
  try {
    of.header = parse_header(std::span<const uint8_t>(of.map->data(), of.map->size()), of.map->size(), p);
  } catch (...) {
    if (of.sha.valid()) of.sha.wait();
    throw;
  }
  auto meta = [&](const char* key) {
    auto m = of.header.metadata.find(key);
    return m == of.header.metadata.end() ? std::string("?") : m->second;
  };
  if (meta("run_id") != info.run_id || meta("step") != std::to_string(info.step)) {
    if (of.sha.valid()) of.sha.wait();
    throw ckpt::CheckpointError(fmt::format("checkpoint: {} belongs to run {} step {}, the manifest to run {} step {}",
                                            p, meta("run_id"), meta("step"), info.run_id, info.step));
  }
  return open.emplace(index, std::move(of)).first->second;
}

void Stored::start_hash(OpenFile& of) {
  const MappedFile* map = of.map.get();
  of.sha = std::async(std::launch::async, [map] { return sha256_hex(map->data(), map->size()); }).share();
}

void Stored::check() const {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [index, of] : open) {
    if (of.checked || !of.sha.valid()) continue;
    const std::string sha = of.sha.get();
    const std::string p = (fs::path(path) / files[index].name).string();
    TORUS_CHECK(sha == files[index].sha256, ckpt::CheckpointError,
                "checkpoint: {} is corrupt: its SHA-256 is {}, the manifest records {}", p, sha,
                files[index].sha256);
    of.checked = true;
  }
}

void Stored::drain() const noexcept {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [index, of] : open) {
    if (of.sha.valid()) of.sha.wait();
  }
}

void Stored::verify_files(int part, int parts) const {
  try {
    for (size_t i = 0; i < files.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(parts)) == part) (void)file(static_cast<int>(i), true);
    }
    check();
  } catch (...) {
    drain();
    throw;
  }
}

const uint8_t* Stored::piece_data(const std::string& name, const Piece& pc, const std::string& dtype) const {
  const OpenFile& of = file(pc.file, hash_reads);
  const TensorEntry* e = of.header.find(name);
  TORUS_CHECK(e != nullptr, ckpt::CheckpointError, "checkpoint: {}/{} does not hold '{}' as the manifest says", path,
              files[pc.file].name, name);
  const std::vector<int64_t> shape = pc.fb >= 0 ? std::vector<int64_t>{pc.fe - pc.fb} : pc.box;
  TORUS_CHECK(e->shape == shape && e->dtype == dtype, ckpt::CheckpointError,
              "checkpoint: {}/{}: '{}' is {} {} in the file, {} {} in the manifest", path, files[pc.file].name,
              name, e->dtype, fmt::join(e->shape, "x"), dtype, fmt::join(shape, "x"));
  return of.map->data() + of.header.data_offset + e->begin;
}

void Stored::read_range(const std::string& name, const std::string& dtype, int64_t begin, int64_t end,
                        void* dst) const {
  auto it = tensors.find(name);
  TORUS_CHECK(it != tensors.end(), ckpt::CheckpointError, "checkpoint: {} has no tensor '{}'", path, name);
  const GlobalTensor& g = it->second;
  TORUS_CHECK(g.shape.size() == 1 && g.dtype == dtype, ckpt::CheckpointError,
              "checkpoint: {}: '{}' is {} [{}], not a 1-D {} tensor", path, name, g.dtype, fmt::join(g.shape, ", "),
              dtype);
  TORUS_CHECK(0 <= begin && begin <= end && end <= g.shape[0], InvalidArgument,
              "checkpoint: elements [{}, {}) of '{}', which has {}", begin, end, name, g.shape[0]);
  const size_t esize = dtype_bytes(dtype);
  // Each piece holds the global elements [first, first + count): a flat
  // range of its box (padding past the tensor is never read) or the box.
  std::vector<std::pair<int64_t, int64_t>> got;
  for (const Piece& pc : g.pieces) {
    if (pc.per_rank) continue;
    const int64_t first = pc.off[0] + (pc.fb >= 0 ? pc.fb : 0);
    const int64_t count = pc.fb >= 0 ? pc.fe - pc.fb : pc.box[0];
    const int64_t lo = std::max(begin, first), hi = std::min({end, first + count, g.shape[0]});
    if (hi <= lo) continue;
    const uint8_t* src = piece_data(name, pc, dtype);
    std::memcpy(static_cast<uint8_t*>(dst) + static_cast<size_t>(lo - begin) * esize,
                src + static_cast<size_t>(lo - first) * esize, static_cast<size_t>(hi - lo) * esize);
    got.emplace_back(lo, hi);
  }
  std::sort(got.begin(), got.end());
  int64_t reach = begin;
  for (const auto& [lo, hi] : got) {
    if (lo > reach) break;
    reach = std::max(reach, hi);
  }
  TORUS_CHECK(reach >= end, ckpt::CheckpointError,
              "checkpoint: {}: the pieces of '{}' cover [{}, {}) of the elements [{}, {}) to read", path, name, begin,
              reach, begin, end);
}

}  // namespace torus::ckpt
