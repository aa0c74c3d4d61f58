// Plain safetensors files (checkpoint.h): reading one whole, writing one
// from tensors, and exporting the full tensors of a checkpoint into one.
#include <ATen/Functions.h>

#include <cstring>

#include "checkpoint/file_io.h"
#include "checkpoint/tensors.h"
#include "core/log.h"

namespace torus::ckpt {

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
  std::vector<at::Tensor> host;  // what the blobs point into
  std::vector<Blob> blobs;
  for (const auto& [name, t] : tensors) {
    host.push_back(t.detach().cpu().contiguous());
    blobs.push_back(blob_of(name, host.back()));
  }
  const std::string tmp = path + ".tmp";
  std::error_code ignore;
  fs::remove(tmp, ignore);
  uint64_t bytes = 0;
  std::string sha;
  write_safetensors_file(tmp, blobs, metadata, &bytes, &sha);
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
