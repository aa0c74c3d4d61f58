// Writing a rank's part of a sharded checkpoint (checkpoint.h): snapshot()
// copies the state off the device, write_rank() writes this rank's
// safetensors file and its .done.json record into the step's temporary
// directory. finalize() (manifest.cpp) then publishes the checkpoint.
#include <ATen/Functions.h>

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

}  // namespace torus::ckpt
