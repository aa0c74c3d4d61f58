// torus/comm/device_mesh.h — named parallel dimensions over a world group,
// with one ProcessGroup per dimension and per combination of dimensions.
//
// Creation is collective over the world group and validates the layout
// before any communication (InvalidArgument: product != world size, unknown
// or repeated dimension, size < 1, TP crossing a node boundary). Groups are
// created for every non-empty combination of the dimensions of size > 1, in
// one fixed order on every rank; a dimension (or combination) of size 1 gets
// a trivial single-rank group. Group names are the dimensions joined by '+'
// in canonical order: "tp", "dp+tp", "pp+dp+tp".
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "torus/comm/mesh_layout.h"
#include "torus/comm/process_group.h"

namespace torus::comm {

class DeviceMesh {
 public:
  DeviceMesh(ProcessGroupPtr world, const std::vector<std::pair<std::string, int>>& dims);

  const MeshLayout& layout() const { return layout_; }
  const ProcessGroupPtr& world() const { return world_; }
  int size(std::string_view dim) const { return layout_.size(dim); }
  int coord(std::string_view dim) const { return layout_.coord(world_->rank(), dim); }

  // The group of this rank along one dimension or a combination of them
  // (any order; normalised to canonical order).
  const ProcessGroupPtr& group(const std::string& dim) const;
  const ProcessGroupPtr& group(const std::vector<std::string>& dims) const;

 private:
  std::string key(std::vector<std::string> dims) const;

  ProcessGroupPtr world_;
  MeshLayout layout_;
  std::map<std::string, ProcessGroupPtr> groups_;
};

}  // namespace torus::comm
