// Flat states of buffer-level optimizers in the Torus checkpoint format
// (torus/checkpoint/flat_state.h): written with the format's one writer and
// publisher (buffers.h), read through the one manifest reader (stored.h),
// agreed over the group (Note [Flat state agreement]).
#include "torus/checkpoint/flat_state.h"

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "checkpoint/stored.h"
#include "core/log.h"
#include "torus/comm/agree.h"
#include "torus/comm/backend.h"

namespace torus::ckpt {
namespace {

Json meta_json(const optim::FlatState& state) {
  Json j = Json::object();
  for (const auto& [key, value] : state.meta) j[key] = value;
  return j;
}

// The error every rank throws when a step failed somewhere: this rank's own
// (an InvalidArgument stays one), or one naming the group.
[[noreturn]] void fail_everywhere(comm::Backend& group, const std::exception_ptr& mine, const std::string& what) {
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const InvalidArgument&) {
      throw;
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("checkpoint: {} failed on rank {} of group '{}': {}", what, group.rank(),
                                        group.group().name, e.what()));
    }
  }
  throw CheckpointError(
      fmt::format("checkpoint: {} failed on another rank of group '{}'", what, group.group().name));
}

// Runs `step`, then agrees over the group that it succeeded everywhere.
template <class F>
void agreed(comm::Backend& group, comm::Duration timeout, const std::string& what, F&& step) {
  std::exception_ptr mine;
  try {
    step();
  } catch (...) {
    mine = std::current_exception();
  }
  if (!comm::all_ok(group, mine == nullptr, timeout)) fail_everywhere(group, mine, what);
}

}  // namespace

std::string save_flat_state(comm::Backend& group, const std::string& save_dir, const optim::FlatState& state,
                            RunInfo info, const FlatSaveOptions& options) {
  const int rank = group.rank();
  info.world_size = group.size();
  info.state = meta_json(state).dump();
  const std::string final_dir = (fs::path(save_dir) / step_dir(info.step)).string();
  const bool plain_id = !info.run_id.empty() && info.run_id.find('/') == std::string::npos;
  const std::string tmp_dir = final_dir + ".tmp-" + info.run_id;
  const std::string what = fmt::format("saving step {} into '{}'", info.step, save_dir);

  // What an earlier attempt at this step and run id left goes first
  // (write_rank_buffers creates its files exclusively).
  agreed(group, options.timeout, what, [&] {
    if (rank == 0 && plain_id) remove_tree(tmp_dir);
  });
  RankWrite mine;
  try {
    agreed(group, options.timeout, what, [&] {
      BufferState buffers;
      for (const optim::FlatTensor& t : state.tensors) {
        TORUS_CHECK(!buffers.count(t.name), InvalidArgument, "checkpoint: the flat state names '{}' twice", t.name);
        if (t.replicated && rank != 0) continue;  // every piece once over the group
        BufferSlice b;
        b.data = t.data;
        b.dtype = dtype_code(t.dtype);
        b.shape = {static_cast<int64_t>(t.numel)};
        b.global_shape = {static_cast<int64_t>(t.global_numel)};
        b.flat_begin = static_cast<int64_t>(t.offset);
        b.flat_end = static_cast<int64_t>(t.offset + t.numel);
        buffers[t.name] = std::move(b);
      }
      mine = write_rank_buffers(save_dir, rank, buffers, info);
    });
  } catch (...) {
    if (rank == 0 && plain_id) {
      try {
        remove_tree(tmp_dir);  // best effort: never published, never read
      } catch (const std::exception& e) {
        TORUS_LOG_WARN("checkpoint: cannot remove the failed save {}: {}", tmp_dir, e.what());
      }
    }
    throw;
  }
  agreed(group, options.timeout, what, [&] {
    if (rank == 0) finalize(mine, info, options.save);
  });
  return final_dir;
}

LoadedFlatState read_flat_state(comm::Backend& group, const std::string& path, const optim::FlatState& like,
                                comm::Duration timeout) {
  LoadedFlatState out;
  agreed(group, timeout, fmt::format("loading '{}'", path), [&] {
    Stored st;
    st.read_manifest(path);
    const Json want = meta_json(like);
    const Json got = parse_json(st.info.state, path + " (its state)");
    TORUS_CHECK(got == want, ckpt::CheckpointError, "checkpoint: {} holds a state of {}, this one is {}", path, got.dump(),
                want.dump());
    // This rank verifies its share of the files (and agrees on the verdict
    // below), so the reads need not hash every file they touch.
    st.hash_reads = false;
    out.state_.meta = like.meta;
    for (const optim::FlatTensor& t : like.tensors) {
      auto it = st.tensors.find(t.name);
      TORUS_CHECK(it != st.tensors.end(), ckpt::CheckpointError, "checkpoint: {} has no tensor '{}'", path, t.name);
      const GlobalTensor& g = it->second;
      const std::string code = dtype_code(t.dtype);
      TORUS_CHECK(g.shape == std::vector<int64_t>{static_cast<int64_t>(t.global_numel)} && g.dtype == code,
                  ckpt::CheckpointError, "checkpoint: {}: '{}' is {} [{}] in the checkpoint, {} [{}] here", path, t.name,
                  g.dtype, fmt::join(g.shape, ", "), code, t.global_numel);
      out.storage_.emplace_back(t.numel * dtype_size(t.dtype));
      st.read_range(t.name, code, static_cast<int64_t>(t.offset), static_cast<int64_t>(t.offset + t.numel),
                    out.storage_.back().data());
      optim::FlatTensor c = t;
      c.data = out.storage_.back().data();
      out.state_.tensors.push_back(std::move(c));
    }
    st.verify_files(group.rank(), group.size());
    out.info_ = st.info;
  });
  return out;
}

}  // namespace torus::ckpt
