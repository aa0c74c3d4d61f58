// A fresh directory every rank of the job agrees on, for tests that write
// files under mpirun: <TempDir>/<tag>_<rank 0's pid>/<name>, emptied and made
// by rank 0, then a barrier. Collective (every rank calls it in the same
// order); the first call agrees on rank 0's pid with an all_reduce.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "checkpoint/file_io.h"
#include "parallel/parallel_test_util.h"

namespace torus::testing {

inline std::string job_dir(const std::string& tag, const std::string& name) {
  namespace fs = std::filesystem;
  static std::string base;
  if (base.empty()) {
    at::Tensor id = at::full({1}, world()->rank() == 0 ? static_cast<int64_t>(::getpid()) : 0,
                             at::TensorOptions().dtype(at::kLong));
    if (world()->size() > 1) world()->all_reduce(id)->wait();
    base = (fs::path(::testing::TempDir()) / (tag + "_" + std::to_string(id.item<int64_t>()))).string();
  }
  const std::string p = (fs::path(base) / name).string();
  if (world()->rank() == 0) {
    ckpt::remove_tree(p);
    fs::create_directories(p);
  }
  if (world()->size() > 1) world()->barrier()->wait();
  return p;
}

}  // namespace torus::testing
