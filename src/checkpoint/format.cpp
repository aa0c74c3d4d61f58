// The on-disk vocabulary of a sharded checkpoint (format.h): file names,
// JSON and text readers, slices, the safetensors file writer.
#include "checkpoint/format.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "checkpoint/file_io.h"
#include "core/log.h"

namespace torus::ckpt {

std::string rank_file(int rank) { return fmt::format("rank-{:05d}.safetensors", rank); }
std::string done_file(int rank) { return fmt::format("rank-{:05d}.done.json", rank); }
std::string failed_file(int rank) { return fmt::format("rank-{:05d}.failed", rank); }
std::string step_dir(int64_t step) { return fmt::format("step-{:08d}", step); }

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
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

Normal normalize(const std::string& name, const std::vector<int64_t>& global_shape,
                 const std::vector<int64_t>& box_offset, const std::vector<int64_t>& box_shape, int64_t flat_begin,
                 int64_t flat_end, const std::vector<int64_t>& data_shape) {
  Normal n;
  n.global = global_shape;
  n.off = box_offset.empty() ? std::vector<int64_t>(n.global.size(), 0) : box_offset;
  n.box = box_shape.empty() ? n.global : box_shape;
  n.fb = flat_begin;
  n.fe = flat_end;
  TORUS_CHECK(n.off.size() == n.global.size() && n.box.size() == n.global.size(), InvalidArgument,
              "checkpoint: '{}': box of rank {}/{} for a tensor of rank {}", name, n.off.size(), n.box.size(),
              n.global.size());
  for (size_t d = 0; d < n.global.size(); ++d) {
    TORUS_CHECK(n.global[d] >= 0 && n.off[d] >= 0 && n.box[d] >= 0, InvalidArgument,
                "checkpoint: '{}': negative size or offset", name);
  }
  const int64_t held = numel_of(data_shape);
  if (n.fb >= 0) {
    TORUS_CHECK(n.fb <= n.fe && n.fe <= numel_of(n.box) && held == n.fe - n.fb, InvalidArgument,
                "checkpoint: '{}': flat range [{}, {}) of a box of {} elements holding {} elements", name, n.fb,
                n.fe, numel_of(n.box), held);
  } else {
    TORUS_CHECK(data_shape == n.box, InvalidArgument, "checkpoint: '{}': tensor of shape [{}] for a box {}", name,
                fmt::join(data_shape, ", "), fmt::join(n.box, "x"));
  }
  return n;
}

void write_safetensors_file(const std::string& path, std::vector<Blob>& blobs,
                            const std::map<std::string, std::string>& metadata, uint64_t* bytes,
                            std::string* sha) {
  std::stable_sort(blobs.begin(), blobs.end(),
                   [](const Blob& a, const Blob& b) { return dtype_bytes(a.dtype) > dtype_bytes(b.dtype); });
  std::vector<TensorEntry> entries;
  uint64_t off = 0;
  for (const auto& b : blobs) {
    TensorEntry e;
    e.name = b.name;
    e.dtype = b.dtype;
    e.shape = b.shape;
    e.begin = off;
    off += static_cast<uint64_t>(numel_of(b.shape)) * dtype_bytes(b.dtype);
    e.end = off;
    entries.push_back(std::move(e));
  }
  const std::vector<uint8_t> head = encode_header(entries, metadata);
  FileWriter w(path);
  w.write(head.data(), head.size());
  for (size_t i = 0; i < blobs.size(); ++i) w.write(blobs[i].data, entries[i].end - entries[i].begin);
  *sha = w.close();
  *bytes = w.bytes_written();
}

}  // namespace torus::ckpt
