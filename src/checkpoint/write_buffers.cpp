// Writing a rank's part of a sharded checkpoint from host buffers
// (buffers.h): this rank's safetensors file and, after it, its .done.json
// record, in the step's temporary directory (Note [Atomic save] in
// checkpoint.h). The tensor write_rank (write.cpp) comes down to this.
#include <algorithm>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "core/log.h"

namespace torus::ckpt {
namespace {

Json slice_json(const Normal& n) {
  Json j = {{"global_shape", n.global}, {"box_offset", n.off}, {"box_shape", n.box}};
  j["flat"] = n.fb >= 0 ? Json::array({n.fb, n.fe}) : Json(nullptr);
  return j;
}

}  // namespace

std::string dtype_code(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
  }
  throw InvalidArgument("checkpoint: an unknown dtype");
}

RankWrite write_rank_buffers(const std::string& save_dir, int rank, const BufferState& state,
                             const RunInfo& info) {
  TORUS_CHECK(!info.run_id.empty() && info.run_id.find('/') == std::string::npos, InvalidArgument,
              "checkpoint: the run id '{}' is empty or names a path", info.run_id);
  TORUS_CHECK(rank >= 0 && rank < info.world_size, InvalidArgument, "checkpoint: rank {} of {} ranks", rank,
              info.world_size);
  std::vector<Blob> blobs;
  Json slices = Json::object();
  Json aliases = Json::object();
  for (const auto& [name, s] : state) {
    if (!s.alias_of.empty()) {
      aliases[name] = s.alias_of;
      continue;
    }
    TORUS_CHECK(s.data != nullptr || numel_of(s.shape) == 0, InvalidArgument, "checkpoint: '{}' has no data", name);
    TORUS_CHECK(known_dtype(s.dtype), InvalidArgument, "checkpoint: '{}' has dtype '{}', not a safetensors code",
                name, s.dtype);
    const Normal n = normalize(name, s.global_shape, s.box_offset, s.box_shape, s.flat_begin, s.flat_end, s.shape);
    if (n.fb < 0) {
      for (size_t d = 0; d < n.global.size(); ++d) {
        TORUS_CHECK(n.off[d] + n.box[d] <= n.global[d], InvalidArgument,
                    "checkpoint: '{}': a whole box reaching past the tensor along dimension {} (crop it first)",
                    name, d);
      }
    }
    Json sj = slice_json(n);
    if (s.per_rank) sj["per_rank"] = true;
    slices[name] = sj;
    blobs.push_back({name, s.dtype, s.shape, s.data});
  }

  RankWrite out;
  out.final_dir = (fs::path(save_dir) / step_dir(info.step)).string();
  out.tmp_dir = out.final_dir + ".tmp-" + info.run_id;
  std::error_code ec;
  fs::create_directories(out.tmp_dir, ec);
  TORUS_CHECK(!ec, ckpt::CheckpointError, "checkpoint: cannot create {}: {}", out.tmp_dir, ec.message());
  const std::map<std::string, std::string> meta = {{"format", "torus-checkpoint-rank"},
                                                   {"version", std::to_string(kFormatVersion)},
                                                   {"run_id", info.run_id},
                                                   {"step", std::to_string(info.step)},
                                                   {"rank", std::to_string(rank)},
                                                   {"slices", slices.dump()}};
  out.file = (fs::path(out.tmp_dir) / rank_file(rank)).string();
  write_safetensors_file(out.file, blobs, meta, &out.bytes, &out.sha256);

  Json done = {{"rank", rank},          {"file", rank_file(rank)}, {"bytes", out.bytes}, {"sha256", out.sha256},
               {"run_id", info.run_id}, {"step", info.step},       {"slices", slices},   {"aliases", aliases}};
  Json dtypes = Json::object();
  for (const auto& b : blobs) dtypes[b.name] = b.dtype;
  done["dtypes"] = dtypes;
  const std::string done_path = (fs::path(out.tmp_dir) / done_file(rank)).string();
  const std::string part = done_path + ".part";
  std::error_code ignore;
  fs::remove(part, ignore);
  write_file(part, done.dump());
  rename_durable(part, done_path);
  return out;
}

}  // namespace torus::ckpt
