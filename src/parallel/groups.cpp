// ParallelGroups (groups.h): the groups of a DeviceMesh, by role.
#include "torus/parallel/groups.h"

namespace torus::parallel {

ParallelGroups ParallelGroups::from_mesh(const comm::DeviceMesh& mesh) {
  ParallelGroups g;
  g.tp = mesh.group("tp");
  g.dp = mesh.group("dp");
  g.dp_tp = mesh.group(std::vector<std::string>{"dp", "tp"});
  return g;
}

}  // namespace torus::parallel
