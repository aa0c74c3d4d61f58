// ParallelGroups (groups.h): the groups of a DeviceMesh, by role.
#include "torus/parallel/groups.h"

namespace torus::parallel {

ParallelGroups ParallelGroups::from_mesh(const comm::DeviceMesh& mesh) {
  ParallelGroups g;
  g.tp = mesh.group("tp");
  g.dp = mesh.group(std::vector<std::string>{"dp", "ep"});
  g.dp_tp = mesh.group(std::vector<std::string>{"dp", "ep", "tp"});
  g.ep = mesh.group("ep");
  g.tokens = g.dp_tp;
  g.expert_dp = mesh.group("dp");
  g.expert_dp_tp = mesh.group(std::vector<std::string>{"dp", "tp"});
  return g;
}

ParallelGroups ParallelGroups::for_experts() const {
  ParallelGroups g = *this;
  g.dp = expert_dp;
  g.dp_tp = expert_dp_tp;
  return g;
}

}  // namespace torus::parallel
