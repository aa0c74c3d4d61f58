// The checkpoints of a save directory (checkpoint.h): listing them with
// their state (removing one is remove_checkpoint, publish.cpp).
#include <algorithm>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "core/log.h"
#include "torus/checkpoint/checkpoint.h"

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

}  // namespace torus::ckpt
