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

}  // namespace torus::ckpt
