// torus/comm/mesh_layout.h — the arithmetic of a device mesh, free of any
// communication (so it is testable and usable by planners).
//
// A mesh has named dimensions in the canonical order pp, dp, ep, cp, tp —
// tp innermost, so that consecutive ranks share a TP group and a TP group
// stays inside a node. Ranks are laid out row-major over that order. A
// dimension not given has size 1.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torus::comm {

inline constexpr std::array<std::string_view, 5> kMeshDims = {"pp", "dp", "ep", "cp", "tp"};

class MeshLayout {
 public:
  // `dims`: (name, size) pairs, names from kMeshDims, each at most once, in
  // any order; sizes >= 1. Throws InvalidArgument naming the problem.
  explicit MeshLayout(const std::vector<std::pair<std::string, int>>& dims);

  int world_size() const;  // product of sizes
  int size(std::string_view dim) const;
  int index(std::string_view dim) const;  // position in kMeshDims; throws for unknown names

  // Coordinates of a rank, one per kMeshDims entry.
  std::array<int, 5> coords(int rank) const;
  int coord(int rank, std::string_view dim) const;
  int rank_of(const std::array<int, 5>& coords) const;

  // The ranks that share `rank`'s coordinates outside `dims`, ordered by
  // their coordinates inside `dims` (row-major): rank's group for `dims`.
  std::vector<int> group_ranks(int rank, const std::vector<std::string>& dims) const;
  // The same group as a (color, key) pair for a communicator split.
  std::pair<int, int> split_color_key(int rank, const std::vector<std::string>& dims) const;

  // Throws InvalidArgument unless world_size() == world and, when
  // local_size > 0, tp divides local_size (a TP group inside one node).
  void validate(int world, int local_size) const;

  // "pp=2 x dp=2 x tp=2"
  std::string describe() const;

 private:
  std::array<int, 5> sizes_{1, 1, 1, 1, 1};
};

}  // namespace torus::comm
