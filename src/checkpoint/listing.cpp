// The checkpoints of a save directory (checkpoint.h): listing them with
// their state, and removing one so that it is never half-seen as complete.
#include <algorithm>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "core/log.h"

namespace torus::ckpt {

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

}  // namespace torus::ckpt
