// Helpers shared by the tensor-, data-parallel and model tests: the world
// group and cached meshes, same-on-every-rank random tensors, relative
// differences, and a process group that must never be used (it proves that a
// check happens before any communication).
#pragma once

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <utility>

#include "torus/comm/device_mesh.h"
#include "torus/comm/process_group.h"
#include "torus/core/error.h"
#include "torus/parallel/groups.h"
#include "torus/parallel/tensor/random.h"

namespace torus::testing {

inline const comm::ProcessGroupPtr& world() {
  static comm::ProcessGroupPtr w = torus::init();
  return w;
}

// The groups of a dp x tp mesh over the whole world (created once per layout;
// collective the first time, so every rank must ask in the same order).
inline const parallel::ParallelGroups& mesh_groups(int dp, int tp) {
  static std::map<std::pair<int, int>, std::pair<std::shared_ptr<comm::DeviceMesh>, parallel::ParallelGroups>> cache;
  auto it = cache.find({dp, tp});
  if (it == cache.end()) {
    auto mesh =
        std::make_shared<comm::DeviceMesh>(world(), std::vector<std::pair<std::string, int>>{{"dp", dp}, {"tp", tp}});
    it = cache.emplace(std::make_pair(dp, tp), std::make_pair(mesh, parallel::ParallelGroups::from_mesh(*mesh))).first;
  }
  return it->second.second;
}

// A tensor with the same values on every rank (seeded CPU generator).
inline at::Tensor same_randn(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  at::Generator g = tp::make_generator(seed);
  return at::empty(shape, at::TensorOptions().dtype(dtype)).normal_(0.0, 1.0, g);
}

inline at::Tensor same_tokens(at::IntArrayRef shape, int64_t vocab, uint64_t seed) {
  at::Generator g = tp::make_generator(seed);
  return at::empty(shape, at::TensorOptions().dtype(at::kLong)).random_(0, vocab, g);
}

// max |a - b| / max |b| (absolute when b is all zeros).
inline double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  if (a.numel() == 0) return 0.0;
  at::Tensor ad = a.detach().to(at::kDouble), bd = b.detach().to(at::kDouble);
  double diff = (ad - bd).abs().max().item<double>();
  double mag = bd.abs().max().item<double>();
  return mag > 0 ? diff / mag : diff;
}

#define TORUS_EXPECT_CLOSE(a, b, tol) EXPECT_LE(::torus::testing::rel_diff((a), (b)), (tol)) << #a " vs " #b

// A backend whose every operation fails: a group built on it proves that a
// layer rejects bad input before it communicates.
class NoCommBackend : public comm::Backend {
 public:
  NoCommBackend(int rank, int size) { info_ = {"no-comm", rank, size, {}}; }
  std::string_view name() const override { return "no-comm"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  const comm::GroupInfo& group() const override { return info_; }
  bool supports(comm::OpType, DType, comm::ReduceOp) const override { return true; }
  comm::WorkPtr all_reduce(const void*, void*, size_t, DType, comm::ReduceOp, comm::Duration) override { fail(); }
  comm::WorkPtr reduce_scatter(const void*, void*, size_t, DType, comm::ReduceOp, comm::Duration) override { fail(); }
  comm::WorkPtr all_gather(const void*, void*, size_t, DType, comm::Duration) override { fail(); }
  comm::WorkPtr all_to_all(const void*, void*, std::span<const size_t>, std::span<const size_t>, DType,
                           comm::Duration) override {
    fail();
  }
  comm::WorkPtr broadcast(void*, size_t, DType, int, comm::Duration) override { fail(); }
  comm::WorkPtr reduce(const void*, void*, size_t, DType, comm::ReduceOp, int, comm::Duration) override { fail(); }
  comm::WorkPtr send(const void*, size_t, DType, int, int, comm::Duration) override { fail(); }
  comm::WorkPtr recv(void*, size_t, DType, int, int, comm::Duration) override { fail(); }
  comm::WorkPtr barrier(comm::Duration) override { fail(); }
  std::shared_ptr<comm::Backend> split(int, int, const std::string&, comm::Duration) override { fail(); }
  void abort(const std::string&) override {}

 private:
  [[noreturn]] static void fail() { throw CommError("no-comm group: communication attempted"); }
  comm::GroupInfo info_;
};

inline comm::ProcessGroupPtr no_comm_group(int rank, int size) {
  return std::make_shared<comm::ProcessGroup>(nullptr, std::make_shared<NoCommBackend>(rank, size));
}

}  // namespace torus::testing
