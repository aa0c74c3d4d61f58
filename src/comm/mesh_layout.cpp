// Device-mesh arithmetic (mesh_layout.h).
#include "torus/comm/mesh_layout.h"

#include <algorithm>
#include <set>

#include "core/log.h"

namespace torus::comm {

MeshLayout::MeshLayout(const std::vector<std::pair<std::string, int>>& dims) {
  std::set<std::string> seen;
  for (const auto& [name, size] : dims) {
    auto it = std::find(kMeshDims.begin(), kMeshDims.end(), name);
    TORUS_CHECK(it != kMeshDims.end(), InvalidArgument, "unknown mesh dimension '{}' (expected pp, dp, ep, cp or tp)",
                name);
    TORUS_CHECK(seen.insert(name).second, InvalidArgument, "mesh dimension '{}' given twice", name);
    TORUS_CHECK(size >= 1, InvalidArgument, "mesh dimension {} has size {}; sizes must be >= 1", name, size);
    sizes_[static_cast<size_t>(it - kMeshDims.begin())] = size;
  }
}

int MeshLayout::world_size() const {
  int p = 1;
  for (int s : sizes_) p *= s;
  return p;
}

int MeshLayout::index(std::string_view dim) const {
  auto it = std::find(kMeshDims.begin(), kMeshDims.end(), dim);
  TORUS_CHECK(it != kMeshDims.end(), InvalidArgument, "unknown mesh dimension '{}' (expected pp, dp, ep, cp or tp)",
              dim);
  return static_cast<int>(it - kMeshDims.begin());
}

int MeshLayout::size(std::string_view dim) const { return sizes_[index(dim)]; }

std::array<int, 5> MeshLayout::coords(int rank) const {
  TORUS_CHECK(rank >= 0 && rank < world_size(), InvalidArgument, "rank {} outside a mesh of {} ranks", rank,
              world_size());
  std::array<int, 5> c{};
  for (int d = 4; d >= 0; --d) {
    c[d] = rank % sizes_[d];
    rank /= sizes_[d];
  }
  return c;
}

int MeshLayout::coord(int rank, std::string_view dim) const { return coords(rank)[index(dim)]; }

int MeshLayout::rank_of(const std::array<int, 5>& c) const {
  int r = 0;
  for (int d = 0; d < 5; ++d) {
    TORUS_CHECK(c[d] >= 0 && c[d] < sizes_[d], InvalidArgument, "coordinate {}={} outside size {}", kMeshDims[d], c[d],
                sizes_[d]);
    r = r * sizes_[d] + c[d];
  }
  return r;
}

std::vector<int> MeshLayout::group_ranks(int rank, const std::vector<std::string>& dims) const {
  std::array<bool, 5> in{};
  for (const auto& d : dims) in[index(d)] = true;
  std::array<int, 5> base = coords(rank);
  std::vector<int> ranks;
  // Enumerate the coordinates inside `dims` row-major; the rest stay fixed.
  std::array<int, 5> c = base;
  for (int d = 0; d < 5; ++d)
    if (in[d]) c[d] = 0;
  while (true) {
    ranks.push_back(rank_of(c));
    int d = 4;
    for (; d >= 0; --d) {
      if (!in[d]) continue;
      if (++c[d] < sizes_[d]) break;
      c[d] = 0;
    }
    if (d < 0) break;
  }
  return ranks;
}

std::pair<int, int> MeshLayout::split_color_key(int rank, const std::vector<std::string>& dims) const {
  std::array<bool, 5> in{};
  for (const auto& d : dims) in[index(d)] = true;
  std::array<int, 5> c = coords(rank);
  int color = 0, key = 0;
  for (int d = 0; d < 5; ++d) {
    if (in[d]) {
      key = key * sizes_[d] + c[d];
    } else {
      color = color * sizes_[d] + c[d];
    }
  }
  return {color, key};
}

void MeshLayout::validate(int world, int local_size) const {
  TORUS_CHECK(world_size() == world, InvalidArgument, "mesh {} has {} ranks but the world has {}", describe(),
              world_size(), world);
  int tp = sizes_[4];
  if (local_size > 0 && tp > 1) {
    TORUS_CHECK(local_size % tp == 0, InvalidArgument,
                "mesh {}: tp={} does not divide the {} ranks per host, so a TP group would cross hosts", describe(),
                tp, local_size);
  }
}

std::string MeshLayout::describe() const {
  std::string s;
  for (int d = 0; d < 5; ++d) {
    if (sizes_[d] == 1 && d != 4 && d != 1) continue;
    if (!s.empty()) s += " x ";
    s += fmt::format("{}={}", kMeshDims[d], sizes_[d]);
  }
  return s;
}

}  // namespace torus::comm
