// Sharded checkpoints (checkpoint.h): writing a rank's slices, the manifest,
// opening and verifying, and assembling any slice from the pieces that
// cover it.
#include "torus/checkpoint/checkpoint.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "checkpoint/file_io.h"
#include "core/log.h"

namespace torus::ckpt {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kComplete = "COMPLETE";

std::string rank_file(int rank) { return fmt::format("rank-{:05d}.safetensors", rank); }
std::string done_file(int rank) { return fmt::format("rank-{:05d}.done.json", rank); }
std::string step_dir(int64_t step) { return fmt::format("step-{:08d}", step); }

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Json parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("checkpoint: {} is not valid JSON: {}", what, e.what()));
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORUS_CHECK(in.good(), ckpt::CheckpointError, "checkpoint: cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  TORUS_CHECK(!in.bad(), ckpt::CheckpointError, "checkpoint: cannot read {}", path);
  return ss.str();
}

// A slice with its defaults filled in and checked.
struct Normal {
  std::vector<int64_t> global, off, box;
  int64_t fb = -1, fe = -1;
};

Normal normalize(const std::string& name, const TensorSlice& s) {
  Normal n;
  n.global = s.global_shape;
  n.off = s.box_offset.empty() ? std::vector<int64_t>(n.global.size(), 0) : s.box_offset;
  n.box = s.box_shape.empty() ? n.global : s.box_shape;
  n.fb = s.flat_begin;
  n.fe = s.flat_end;
  TORUS_CHECK(n.off.size() == n.global.size() && n.box.size() == n.global.size(), InvalidArgument,
              "checkpoint: '{}': box of rank {}/{} for a tensor of rank {}", name, n.off.size(), n.box.size(),
              n.global.size());
  for (size_t d = 0; d < n.global.size(); ++d) {
    TORUS_CHECK(n.global[d] >= 0 && n.off[d] >= 0 && n.box[d] >= 0, InvalidArgument,
                "checkpoint: '{}': negative size or offset", name);
  }
  if (n.fb >= 0) {
    TORUS_CHECK(n.fb <= n.fe && n.fe <= numel_of(n.box) && s.tensor.numel() == n.fe - n.fb, InvalidArgument,
                "checkpoint: '{}': flat range [{}, {}) of a box of {} elements holding {} elements", name, n.fb,
                n.fe, numel_of(n.box), s.tensor.numel());
  } else {
    TORUS_CHECK(s.tensor.sizes().vec() == n.box, InvalidArgument, "checkpoint: '{}': tensor of shape {} for a box {}",
                name, c10::str(s.tensor.sizes()), fmt::join(n.box, "x"));
  }
  return n;
}

Json slice_json(const Normal& n) {
  Json j = {{"global_shape", n.global}, {"box_offset", n.off}, {"box_shape", n.box}};
  j["flat"] = n.fb >= 0 ? Json::array({n.fb, n.fe}) : Json(nullptr);
  return j;
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

// ---------------------------------------------------------------------------
// dtypes

std::string dtype_code(c10::ScalarType t) {
  switch (t) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: break;
  }
  throw CheckpointError(fmt::format("checkpoint: dtype {} has no safetensors code", c10::toString(t)));
}

c10::ScalarType dtype_from_code(const std::string& code) {
  static const std::map<std::string, c10::ScalarType> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  auto it = table.find(code);
  TORUS_CHECK(it != table.end(), ckpt::CheckpointError, "checkpoint: safetensors dtype {} is not supported here", code);
  return it->second;
}

// ---------------------------------------------------------------------------
// Writing

namespace {

struct Item {
  std::string name;
  at::Tensor data;  // contiguous, CPU, what goes into the file
  Json slice;
};

// Safetensors entries and data for `items`, widest elements first so that
// every tensor starts aligned to its element size.
void write_safetensors_file(const std::string& path, std::vector<Item>& items,
                            const std::map<std::string, std::string>& metadata, uint64_t* bytes,
                            std::string* sha) {
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.data.element_size() > b.data.element_size(); });
  std::vector<TensorEntry> entries;
  uint64_t off = 0;
  for (const auto& it : items) {
    TensorEntry e;
    e.name = it.name;
    e.dtype = dtype_code(it.data.scalar_type());
    e.shape = it.data.sizes().vec();
    e.begin = off;
    off += static_cast<uint64_t>(it.data.numel()) * it.data.element_size();
    e.end = off;
    entries.push_back(std::move(e));
  }
  const std::vector<uint8_t> head = encode_header(entries, metadata);
  FileWriter w(path);
  w.write(head.data(), head.size());
  for (const auto& it : items) {
    w.write(it.data.data_ptr(), static_cast<size_t>(it.data.numel()) * it.data.element_size());
  }
  *sha = w.close();
  *bytes = w.bytes_written();
}

}  // namespace

ShardedState snapshot(const ShardedState& state) {
  ShardedState out;
  for (const auto& [name, s] : state) {
    TensorSlice c = s;
    if (s.tensor.defined()) {
      at::Tensor t = s.tensor.detach();
      if (t.is_cuda()) {
        at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
        host.copy_(t);
        c.tensor = host;
      } else {
        c.tensor = t.clone(at::MemoryFormat::Contiguous);
      }
    }
    out[name] = std::move(c);
  }
  return out;
}

RankWrite write_rank(const std::string& save_dir, int rank, const ShardedState& state, const RunInfo& info) {
  TORUS_CHECK(!info.run_id.empty() && info.run_id.find('/') == std::string::npos, InvalidArgument,
              "checkpoint: the run id '{}' is empty or names a path", info.run_id);
  TORUS_CHECK(rank >= 0 && rank < info.world_size, InvalidArgument, "checkpoint: rank {} of {} ranks", rank,
              info.world_size);
  RankWrite out;
  out.final_dir = (fs::path(save_dir) / step_dir(info.step)).string();
  out.tmp_dir = out.final_dir + ".tmp-" + info.run_id;
  std::error_code ec;
  fs::create_directories(out.tmp_dir, ec);
  TORUS_CHECK(!ec, ckpt::CheckpointError, "checkpoint: cannot create {}: {}", out.tmp_dir, ec.message());

  std::vector<Item> items;
  Json slices = Json::object();
  Json aliases = Json::object();
  std::vector<std::string> per_rank;
  for (const auto& [name, s] : state) {
    if (!s.alias_of.empty()) {
      aliases[name] = s.alias_of;
      continue;
    }
    TORUS_CHECK(s.tensor.defined(), InvalidArgument, "checkpoint: '{}' has no tensor", name);
    Normal n = normalize(name, s);
    at::Tensor t = s.tensor.detach();
    if (n.fb < 0) {
      // Crop a whole box to the global shape (Note [Slices]: padding is not saved).
      bool empty = false;
      for (size_t d = 0; d < n.global.size(); ++d) {
        const int64_t keep = std::min(n.box[d], n.global[d] - n.off[d]);
        if (keep <= 0) {
          empty = true;
          break;
        }
        if (keep < n.box[d]) {
          t = t.narrow(static_cast<int64_t>(d), 0, keep);
          n.box[d] = keep;
        }
      }
      if (empty) continue;
    }
    if (!t.device().is_cpu()) t = t.cpu();
    t = t.contiguous();
    Json sj = slice_json(n);
    if (s.per_rank) {
      sj["per_rank"] = true;
      per_rank.push_back(name);
    }
    slices[name] = sj;
    items.push_back({name, t, sj});
  }
  std::map<std::string, std::string> meta = {{"format", "torus-checkpoint-rank"},
                                             {"version", std::to_string(kFormatVersion)},
                                             {"run_id", info.run_id},
                                             {"step", std::to_string(info.step)},
                                             {"rank", std::to_string(rank)},
                                             {"slices", slices.dump()}};
  out.file = (fs::path(out.tmp_dir) / rank_file(rank)).string();
  write_safetensors_file(out.file, items, meta, &out.bytes, &out.sha256);

  Json done = {{"rank", rank},          {"file", rank_file(rank)}, {"bytes", out.bytes}, {"sha256", out.sha256},
               {"run_id", info.run_id}, {"step", info.step},       {"slices", slices},   {"aliases", aliases}};
  Json dtypes = Json::object();
  for (const auto& it : items) dtypes[it.name] = dtype_code(it.data.scalar_type());
  done["dtypes"] = dtypes;
  const std::string done_path = (fs::path(out.tmp_dir) / done_file(rank)).string();
  const std::string part = done_path + ".part";
  std::error_code ignore;
  fs::remove(part, ignore);
  write_file(part, done.dump());
  rename_durable(part, done_path);
  return out;
}

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

// ---------------------------------------------------------------------------
// Reading

namespace {

struct Piece {
  int file = -1;  // index into files
  int rank = -1;
  std::vector<int64_t> off, box;
  int64_t fb = -1, fe = -1;
  bool per_rank = false;
};

struct GlobalTensor {
  std::vector<int64_t> shape;
  c10::ScalarType dtype = at::kFloat;
  std::vector<Piece> pieces;
};

struct FileRec {
  std::string name;
  int rank = -1;
  uint64_t bytes = 0;
  std::string sha256;
};

struct OpenFile {
  std::unique_ptr<MappedFile> map;
  Header header;
  std::shared_future<std::string> sha;  // computed beside the reads (Note [Verified reads])
  bool checked = false;
};

}  // namespace

struct Checkpoint::Impl {
  std::string path;
  RunInfo info;
  std::vector<FileRec> files;
  std::map<std::string, GlobalTensor> tensors;
  std::map<std::string, std::string> aliases;
  std::map<std::string, TensorInfo> listing;
  mutable std::mutex mu;
  mutable std::map<int, OpenFile> open;

  // Note [Verified reads]: a file is mapped and its header validated when a
  // piece of it is first needed; its SHA-256 is computed by a second thread
  // meanwhile, and check() compares every file read so far with the
  // manifest before a load returns — nothing read is handed back unverified.
  const OpenFile& file(int index, bool hash = true) const {
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

  static void start_hash(OpenFile& of) {
    const MappedFile* map = of.map.get();
    of.sha = std::async(std::launch::async, [map] { return sha256_hex(map->data(), map->size()); }).share();
  }

  // Every file opened (and hashed) so far against the manifest's SHA-256.
  void check() const {
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

  // Waits for every hash in flight (on the way out of a failed load).
  void drain() const noexcept {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [index, of] : open) {
      if (of.sha.valid()) of.sha.wait();
    }
  }

  bool hash_reads = true;  // off: the caller verifies files itself (verify_files)

  // The data of a piece as a tensor of its stored shape (read-only memory).
  at::Tensor piece_tensor(const std::string& name, const Piece& pc, c10::ScalarType dtype) const {
    const OpenFile& of = file(pc.file, hash_reads);
    const TensorEntry* e = of.header.find(name);
    TORUS_CHECK(e != nullptr, ckpt::CheckpointError, "checkpoint: {}/{} does not hold '{}' as the manifest says", path,
                files[pc.file].name, name);
    std::vector<int64_t> shape = pc.fb >= 0 ? std::vector<int64_t>{pc.fe - pc.fb} : pc.box;
    TORUS_CHECK(e->shape == shape && dtype_from_code(e->dtype) == dtype, ckpt::CheckpointError,
                "checkpoint: {}/{}: '{}' is {} {} in the file, {} {} in the manifest", path, files[pc.file].name,
                name, e->dtype, fmt::join(e->shape, "x"), c10::toString(dtype), fmt::join(shape, "x"));
    const uint8_t* p = of.map->data() + of.header.data_offset + e->begin;
    const auto opts = at::TensorOptions().dtype(dtype);
    const size_t esize = c10::elementSize(dtype);
    if (reinterpret_cast<uintptr_t>(p) % esize != 0) {
      at::Tensor t = at::empty(shape, opts);
      std::memcpy(t.data_ptr(), p, e->end - e->begin);
      return t;
    }
    return at::from_blob(const_cast<uint8_t*>(p), shape, opts);
  }

  // A target that is a flat range of a box, from flat pieces of the same
  // box (ZeRO to ZeRO over the same TP layout): only the overlapping ranges
  // are read. False when those pieces do not cover the range (the caller
  // then assembles the box).
  bool copy_flat(const std::string& name, const GlobalTensor& g, const std::vector<const Piece*>& pieces,
                 const Normal& n, at::Tensor& dst) const {
    std::vector<const Piece*> same;
    for (const Piece* pc : pieces) {
      if (pc->fb >= 0 && pc->off == n.off && pc->box == n.box && pc->fe > n.fb && pc->fb < n.fe) same.push_back(pc);
    }
    std::sort(same.begin(), same.end(), [](const Piece* a, const Piece* b) { return a->fb < b->fb; });
    int64_t reach = n.fb;
    for (const Piece* pc : same) {
      if (pc->fb > reach) return false;
      reach = std::max(reach, pc->fe);
    }
    if (reach < n.fe) return false;
    at::Tensor flat = dst.view({-1});
    reach = n.fb;
    for (const Piece* pc : same) {
      const int64_t lo = std::max(reach, pc->fb), hi = std::min(n.fe, pc->fe);
      if (hi <= lo) continue;
      at::Tensor src = piece_tensor(name, *pc, g.dtype);
      flat.slice(0, lo - n.fb, hi - n.fb).copy_(src.slice(0, lo - pc->fb, hi - pc->fb));
      reach = hi;
    }
    return true;
  }

  // Copies into `dst` (the box [off, off + box) of `name`) every element
  // of the pieces that intersect it; returns the elements covered inside
  // the global shape.
  int64_t fill_box(const std::string& name, const GlobalTensor& g, const std::vector<const Piece*>& pieces,
                   const std::vector<int64_t>& off, const std::vector<int64_t>& box, at::Tensor& dst) const {
    // Group flat pieces by box; whole pieces stand alone.
    std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<const Piece*>> groups;
    for (const Piece* pc : pieces) groups[{pc->off, pc->box}].push_back(pc);
    int64_t covered = 0;
    const size_t nd = g.shape.size();
    for (auto& [key, group] : groups) {
      const auto& [poff, pbox] = key;
      // Intersection with the target box, inside the global shape.
      std::vector<int64_t> lo(nd), hi(nd);
      bool empty = false;
      for (size_t d = 0; d < nd; ++d) {
        lo[d] = std::max(off[d], poff[d]);
        hi[d] = std::min({off[d] + box[d], poff[d] + pbox[d], g.shape[d]});
        if (hi[d] <= lo[d]) empty = true;
      }
      if (empty && nd > 0) continue;
      at::Tensor src;
      const Piece* whole = nullptr;
      for (const Piece* pc : group) {
        if (pc->fb < 0) whole = pc;
      }
      if (whole) {
        src = piece_tensor(name, *whole, g.dtype);
      } else {
        // Flat pieces of one box: lay them out in the box (missing ranges stay
        // NaN-free zeros and are caught by the coverage count below).
        at::Tensor flat = at::zeros({numel_of(pbox)}, at::TensorOptions().dtype(g.dtype));
        std::vector<std::pair<int64_t, int64_t>> ranges;
        for (const Piece* pc : group) {
          if (pc->fe > pc->fb) flat.slice(0, pc->fb, pc->fe).copy_(piece_tensor(name, *pc, g.dtype));
          ranges.emplace_back(pc->fb, pc->fe);
        }
        // Every element of the box inside the global shape must be covered.
        std::sort(ranges.begin(), ranges.end());
        int64_t reach = 0;
        for (auto [b, e] : ranges) {
          if (b > reach) break;
          reach = std::max(reach, e);
        }
        if (reach < numel_of(pbox)) {
          // Only padding may be missing: check that the uncovered tail lies
          // outside the global shape (rows of a padded vocabulary).
          bool tail_is_padding = nd > 0;
          if (tail_is_padding) {
            const int64_t inner = numel_of(pbox) / std::max<int64_t>(1, pbox[0]);
            const int64_t first_row = inner > 0 ? reach / inner : 0;
            tail_is_padding = poff[0] + first_row >= g.shape[0];
          }
          TORUS_CHECK(tail_is_padding, ckpt::CheckpointError,
                      "checkpoint: {}: '{}' is not fully saved: its pieces cover elements [0, {}) of a block of {}",
                      path, name, reach, numel_of(pbox));
        }
        src = flat.view(pbox);
      }
      at::Tensor s = src, t = dst;
      for (size_t d = 0; d < nd; ++d) {
        s = s.narrow(static_cast<int64_t>(d), lo[d] - poff[d], hi[d] - lo[d]);
        t = t.narrow(static_cast<int64_t>(d), lo[d] - off[d], hi[d] - lo[d]);
      }
      t.copy_(s);
      int64_t n = 1;
      for (size_t d = 0; d < nd; ++d) n *= hi[d] - lo[d];
      covered += n;
    }
    return covered;
  }
};

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

void Checkpoint::verify() const {
  try {
    for (size_t i = 0; i < impl_->files.size(); ++i) {
      (void)impl_->file(static_cast<int>(i), true);  // size, header, run id and step; SHA-256 started
    }
    impl_->check();
    for (const auto& [name, g] : impl_->tensors) {
      for (const auto& pc : g.pieces) (void)impl_->piece_tensor(name, pc, g.dtype);
    }
  } catch (...) {
    impl_->drain();
    throw;
  }
}

void Checkpoint::verify_files(int part, int parts) const {
  try {
    for (size_t i = 0; i < impl_->files.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(parts)) == part) (void)impl_->file(static_cast<int>(i), true);
    }
    impl_->check();
  } catch (...) {
    impl_->drain();
    throw;
  }
}

void Checkpoint::set_hash_reads(bool on) { impl_->hash_reads = on; }

std::vector<std::string> Checkpoint::load_into(ShardedState& target, int rank, bool same_layout) const {
  const Impl& m = *impl_;
  std::vector<std::string> missing;
  try {
  for (auto& [key, s] : target) {
    std::string name = key;
    if (!s.alias_of.empty()) name = s.alias_of;
    auto it = m.tensors.find(name);
    if (it == m.tensors.end()) {
      missing.push_back(key);
      continue;
    }
    const GlobalTensor& g = it->second;
    TORUS_CHECK(g.shape == s.global_shape, ckpt::CheckpointError,
                "checkpoint: {}: '{}' has shape [{}] in the checkpoint, [{}] in this run", m.path, name,
                fmt::join(g.shape, ", "), fmt::join(s.global_shape, ", "));
    Normal n = normalize(key, s);
    std::vector<const Piece*> pieces;
    if (s.per_rank) {
      if (!same_layout) {
        missing.push_back(key);
        continue;
      }
      for (const auto& pc : g.pieces) {
        if (pc.rank == rank) pieces.push_back(&pc);
      }
      if (pieces.empty()) {
        missing.push_back(key);
        continue;
      }
    } else {
      for (const auto& pc : g.pieces) pieces.push_back(&pc);
    }
    at::NoGradGuard no_grad;
    if (n.fb >= 0 && m.copy_flat(name, g, pieces, n, s.tensor)) continue;
    int64_t need = 1;
    bool padded = false;
    for (size_t d = 0; d < g.shape.size(); ++d) {
      need *= std::max<int64_t>(0, std::min(n.off[d] + n.box[d], g.shape[d]) - n.off[d]);
      padded = padded || n.off[d] + n.box[d] > g.shape[d];
    }
    // A whole box of the stored dtype is filled in place; anything else
    // through a box of the stored dtype.
    const bool direct = n.fb < 0 && s.tensor.scalar_type() == g.dtype && s.tensor.is_contiguous() &&
                        s.tensor.device().is_cpu();
    at::Tensor box = direct ? s.tensor : at::empty(n.box, at::TensorOptions().dtype(g.dtype));
    if (padded || !direct) box.zero_();
    const int64_t covered = m.fill_box(name, g, pieces, n.off, n.box, box);
    TORUS_CHECK(covered == need, ckpt::CheckpointError,
                "checkpoint: {}: the pieces of '{}' cover {} of the {} elements this rank needs", m.path, name,
                covered, need);
    if (!direct) {
      at::Tensor src = n.fb >= 0 ? box.reshape({-1}).slice(0, n.fb, n.fe) : box;
      s.tensor.copy_(src.view(s.tensor.sizes()));
    }
  }
  m.check();
  return missing;
  } catch (...) {
    m.drain();
    throw;
  }
}

at::Tensor Checkpoint::read_full(const std::string& name) const {
  const Impl& m = *impl_;
  auto it = m.tensors.find(name);
  TORUS_CHECK(it != m.tensors.end(), ckpt::CheckpointError, "checkpoint: {} has no tensor '{}'", m.path, name);
  const GlobalTensor& g = it->second;
  std::vector<const Piece*> pieces;
  for (const auto& pc : g.pieces) {
    if (!pc.per_rank || pc.rank == g.pieces.front().rank) pieces.push_back(&pc);
  }
  at::Tensor out = at::zeros(g.shape, at::TensorOptions().dtype(g.dtype));
  const int64_t covered = m.fill_box(name, g, pieces, std::vector<int64_t>(g.shape.size(), 0), g.shape, out);
  TORUS_CHECK(covered == numel_of(g.shape), ckpt::CheckpointError,
              "checkpoint: {}: the pieces of '{}' cover {} of its {} elements", m.path, name, covered,
              numel_of(g.shape));
  m.check();
  return out;
}

// ---------------------------------------------------------------------------
// Directories

std::vector<Listed> list_checkpoints(const std::string& save_dir) {
  std::vector<Listed> out;
  // Note [No std::filesystem for trees] (file_io.h).
  for (const std::string& fname : list_dir(save_dir, /*dirs_only=*/true)) {
    if (fname.rfind("step-", 0) != 0) continue;
    Listed l;
    l.path = (fs::path(save_dir) / fname).string();
    try {
      l.step = std::stoll(fname.substr(5, 8));
    } catch (const std::exception&) {
      continue;
    }
    if (fname.find(".tmp-") != std::string::npos) {
      l.problem = "an unfinished save (temporary directory)";
    } else {
      try {
        (void)Checkpoint::open(l.path);
        l.complete = true;
      } catch (const CheckpointError& err) {
        l.problem = err.what();
      }
    }
    out.push_back(std::move(l));
  }
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
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

// ---------------------------------------------------------------------------
// Plain safetensors files

std::map<std::string, at::Tensor> read_safetensors(const std::string& path) {
  MappedFile map(path);
  const Header h = parse_header(std::span<const uint8_t>(map.data(), map.size()), map.size(), path);
  std::map<std::string, at::Tensor> out;
  for (const auto& e : h.tensors) {
    const c10::ScalarType dt = dtype_from_code(e.dtype);
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(dt));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), map.data() + h.data_offset + e.begin, e.end - e.begin);
    out[e.name] = t;
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) items.push_back({name, t.detach().cpu().contiguous(), {}});
  const std::string tmp = path + ".tmp";
  std::error_code ignore;
  fs::remove(tmp, ignore);
  uint64_t bytes = 0;
  std::string sha;
  write_safetensors_file(tmp, items, metadata, &bytes, &sha);
  rename_durable(tmp, path);
}

int64_t export_safetensors(const Checkpoint& ckpt, const std::string& out_path, const std::string& prefix) {
  std::map<std::string, at::Tensor> full;
  for (const auto& [name, info] : ckpt.tensors()) {
    if (name.rfind(prefix, 0) != 0) continue;
    full[name.substr(prefix.size())] = ckpt.read_full(name);
  }
  TORUS_CHECK(!full.empty(), ckpt::CheckpointError, "checkpoint: {} has no tensor named {}*", ckpt.path(), prefix);
  write_safetensors(out_path, full,
                    {{"format", "pt"}, {"torus_step", std::to_string(ckpt.info().step)},
                     {"torus_run_id", ckpt.info().run_id}});
  return static_cast<int64_t>(full.size());
}

}  // namespace torus::ckpt
