// Memory-mapped safetensors files and Hugging Face weight directories
// (mapped_safetensors.h).
#include "torus/checkpoint/mapped_safetensors.h"

#include <ATen/Functions.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint/file_io.h"
#include "core/log.h"
#include "torus/checkpoint/checkpoint.h"

namespace torus::ckpt {

struct MappedSafetensors::Map {
  explicit Map(const std::string& path) : file(path) {}
  MappedFile file;
};

MappedSafetensors::MappedSafetensors(std::string path, std::shared_ptr<const Map> map, Header header)
    : path_(std::move(path)), map_(std::move(map)), header_(std::move(header)) {}

MappedSafetensors::~MappedSafetensors() = default;

std::shared_ptr<const MappedSafetensors> MappedSafetensors::open(const std::string& path) {
  auto map = std::make_shared<const Map>(path);
  const MappedFile& f = map->file;
  TORUS_CHECK(f.size() >= 8, ckpt::CheckpointError, "safetensors: {}: {} bytes, shorter than the header length field", path,
              f.size());
  Header h = parse_header(std::span<const uint8_t>(f.data(), f.size()), f.size(), path);
  return std::shared_ptr<const MappedSafetensors>(new MappedSafetensors(path, std::move(map), std::move(h)));
}

std::vector<std::string> MappedSafetensors::names() const {
  std::vector<std::string> out;
  out.reserve(header_.tensors.size());
  for (const auto& e : header_.tensors) out.push_back(e.name);
  return out;
}

at::Tensor MappedSafetensors::tensor(const std::string& name) const {
  const TensorEntry* e = header_.find(name);
  TORUS_CHECK(e != nullptr, ckpt::CheckpointError, "safetensors: {} has no tensor '{}'", path_, name);
  const c10::ScalarType dt = dtype_from_code(e->dtype);
  const auto opts = at::TensorOptions().dtype(dt).device(at::kCPU);
  if (e->end == e->begin) return at::empty(e->shape, opts);
  const uint8_t* p = map_->file.data() + header_.data_offset + e->begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_bytes(e->dtype) != 0) {
    // Note [Mapped views]: a misaligned tensor is copied.
    at::Tensor t = at::empty(e->shape, opts);
    std::memcpy(t.data_ptr(), p, e->end - e->begin);
    return t;
  }
  // The deleter keeps the mapping alive (Note [Mapped views]).
  std::shared_ptr<const Map> keep = map_;
  return at::from_blob(const_cast<uint8_t*>(p), e->shape, [keep](void*) mutable { keep.reset(); }, opts);
}

// ---------------------------------------------------------------------------
// MappedWeightDir

namespace {

using Json = nlohmann::json;

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORUS_CHECK(in.good(), ckpt::CheckpointError, "weights: cannot read {}", path);
  std::ostringstream s;
  s << in.rdbuf();
  TORUS_CHECK(!in.bad(), ckpt::CheckpointError, "weights: cannot read {}", path);
  return s.str();
}

// A shard name must stay inside the directory: a plain file name.
bool plain_file_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  for (const char c : name) {
    if (c == '/' || c == '\\' || c == '\0') return false;
  }
  return true;
}

}  // namespace

MappedWeightDir MappedWeightDir::open(const std::string& dir) {
  MappedWeightDir d;
  d.dir_ = dir;
  const std::string index = dir + "/" + kIndex, single = dir + "/" + kSingle;
  if (is_file(index)) {
    const std::string text = read_text(index);
    // Duplicate keys would let one name map to two shards: refused.
    std::vector<std::set<std::string>> keys;
    std::string duplicate;
    const Json::parser_callback_t no_duplicates = [&](int, Json::parse_event_t ev, Json& parsed) {
      if (ev == Json::parse_event_t::object_start) {
        keys.emplace_back();
      } else if (ev == Json::parse_event_t::object_end) {
        keys.pop_back();
      } else if (ev == Json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    };
    Json j;
    try {
      j = Json::parse(text, no_duplicates);
    } catch (const Json::exception& e) {
      throw CheckpointError(fmt::format("weights: {}: not valid JSON ({})", index, e.what()));
    }
    TORUS_CHECK(duplicate.empty(), ckpt::CheckpointError, "weights: {}: the key '{}' appears twice", index, duplicate);
    TORUS_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), ckpt::CheckpointError,
                "weights: {}: not an object with a \"weight_map\" object", index);
    TORUS_CHECK(!j["weight_map"].empty(), ckpt::CheckpointError, "weights: {}: an empty weight_map", index);
    std::map<std::string, std::string> mapped;
    for (const auto& [name, file] : j["weight_map"].items()) {
      TORUS_CHECK(file.is_string(), ckpt::CheckpointError, "weights: {}: the shard of '{}' is not a string", index, name);
      const std::string f = file.get<std::string>();
      TORUS_CHECK(plain_file_name(f), ckpt::CheckpointError,
                  "weights: {}: the shard of '{}' is '{}', not a plain file name inside the directory", index, name,
                  f);
      mapped[name] = f;
    }
    for (const auto& [name, f] : mapped) {
      auto it = d.files_.find(f);
      if (it == d.files_.end()) {
        const std::string path = dir + "/" + f;
        TORUS_CHECK(is_file(path), ckpt::CheckpointError, "weights: {} names shard {} (of '{}'), which is missing", index,
                    f, name);
        it = d.files_.emplace(f, MappedSafetensors::open(path)).first;
      }
      TORUS_CHECK(it->second->find(name) != nullptr, ckpt::CheckpointError,
                  "weights: {} maps '{}' to {}, which has no such tensor", index, name, f);
      d.where_[name] = it->second.get();
    }
    for (const auto& [f, file] : d.files_) {
      int64_t extra = 0;
      for (const auto& e : file->header().tensors) extra += mapped.count(e.name) == 0;
      if (extra > 0) {
        TORUS_LOG_WARN("weights: {} holds {} tensors that {} does not map (ignored)", file->path(), extra, index);
      }
    }
    return d;
  }
  TORUS_CHECK(is_file(single), ckpt::CheckpointError, "weights: {} has neither {} nor {}", dir, kSingle, kIndex);
  auto file = MappedSafetensors::open(single);
  for (const auto& e : file->header().tensors) d.where_[e.name] = file.get();
  d.files_.emplace(kSingle, std::move(file));
  return d;
}

std::vector<std::string> MappedWeightDir::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, f] : where_) out.push_back(name);
  return out;
}

const TensorEntry* MappedWeightDir::find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second->find(name);
}

at::Tensor MappedWeightDir::tensor(const std::string& name) const {
  auto it = where_.find(name);
  TORUS_CHECK(it != where_.end(), ckpt::CheckpointError, "weights: {} has no tensor '{}'", dir_, name);
  return it->second->tensor(name);
}

std::vector<std::string> MappedWeightDir::files() const {
  std::vector<std::string> out;
  for (const auto& [f, file] : files_) out.push_back(f);
  return out;
}

}  // namespace torus::ckpt
