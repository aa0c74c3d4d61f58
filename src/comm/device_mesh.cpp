// DeviceMesh (device_mesh.h): groups for every combination of dimensions.
#include "torus/comm/device_mesh.h"

#include <algorithm>

#include "core/log.h"

namespace torus::comm {

DeviceMesh::DeviceMesh(ProcessGroupPtr world, const std::vector<std::pair<std::string, int>>& dims)
    : world_(std::move(world)), layout_(dims) {
  TORUS_CHECK(world_ != nullptr, InvalidArgument, "DeviceMesh needs a world group");
  int local_size = world_->context() ? world_->context()->launch().local_size : 0;
  layout_.validate(world_->size(), local_size);

  // Every subset of kMeshDims (bit d = dimension d), in increasing mask order
  // — the same order on every rank, so the splits match. A subset's group
  // depends only on its dimensions of size > 1, and that subset has a smaller
  // mask, so it already exists when it is reused.
  ProcessGroupPtr self;
  for (int mask = 1; mask < 32; ++mask) {
    std::vector<std::string> names, nontrivial;
    int group_size = 1;
    for (int d = 0; d < 5; ++d) {
      if (!(mask & (1 << d))) continue;
      names.emplace_back(kMeshDims[d]);
      int s = layout_.size(kMeshDims[d]);
      group_size *= s;
      if (s > 1) nontrivial.emplace_back(kMeshDims[d]);
    }
    const std::string k = key(names);
    if (nontrivial.empty()) {
      if (!self) self = world_->size() == 1 ? world_ : world_->split(world_->rank(), 0, "self");
      groups_[k] = self;
    } else if (nontrivial.size() != names.size()) {
      groups_[k] = groups_.at(key(nontrivial));
    } else if (group_size == world_->size()) {
      groups_[k] = world_;
    } else {
      auto [color, rank_key] = layout_.split_color_key(world_->rank(), names);
      groups_[k] = world_->split(color, rank_key, k);
    }
  }
}

std::string DeviceMesh::key(std::vector<std::string> dims) const {
  std::sort(dims.begin(), dims.end(), [&](const std::string& a, const std::string& b) {
    return layout_.index(a) < layout_.index(b);
  });
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  std::string k;
  for (const auto& d : dims) {
    if (!k.empty()) k += "+";
    k += d;
  }
  return k;
}

const ProcessGroupPtr& DeviceMesh::group(const std::string& dim) const {
  return group(std::vector<std::string>{dim});
}

const ProcessGroupPtr& DeviceMesh::group(const std::vector<std::string>& dims) const {
  TORUS_CHECK(!dims.empty(), InvalidArgument, "DeviceMesh::group needs at least one dimension");
  for (const auto& d : dims) layout_.index(d);  // validates names
  return groups_.at(key(dims));
}

}  // namespace torus::comm
