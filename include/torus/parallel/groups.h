// torus/parallel/groups.h — the process groups a parallel module talks over.
//
// ParallelGroups is a plain value passed explicitly into every parallel layer,
// the DP wrapper and the models (no global parallel state). A null group
// stands for a dimension of size 1: a default-constructed ParallelGroups is
// single-process training and issues no communication at all, which is how
// every test computes its reference.
//
//   auto world = torus::init();
//   torus::comm::DeviceMesh mesh(world, {{"dp", 2}, {"tp", 2}});
//   auto groups = torus::parallel::ParallelGroups::from_mesh(mesh);
//
// Thread safety: a value type; the groups it points to are thread safe.
#pragma once

#include "torus/comm/device_mesh.h"
#include "torus/comm/process_group.h"

namespace torus::parallel {

// Size and rank of a possibly-null group (null: a group of one rank).
inline int group_size(const comm::ProcessGroupPtr& g) {
  return g ? g->size() : 1;
}
inline int group_rank(const comm::ProcessGroupPtr& g) {
  return g ? g->rank() : 0;
}

struct ParallelGroups {
  comm::ProcessGroupPtr tp;     // tensor (and sequence) parallel group
  comm::ProcessGroupPtr dp;     // data parallel group: the ranks that read different rows of the
                                // batch and replicate the dense parameters (dp x ep)
  comm::ProcessGroupPtr dp_tp;  // dp x tp: reduces the gradients of parameters replicated
                                // over TP whose gradients are partial (sequence parallel)
  // Expert parallelism (Note [MoE groups] in parallel/expert/moe.h); null
  // without it.
  comm::ProcessGroupPtr ep;            // the ranks that exchange tokens with each other's experts
  comm::ProcessGroupPtr tokens;        // dp x ep x tp: together, the tokens of one micro-batch
  comm::ProcessGroupPtr expert_dp;     // the ranks that hold the same experts (dp)
  comm::ProcessGroupPtr expert_dp_tp;  // expert_dp x tp (expert gradients partial over TP)

  // The groups of `mesh`: tp; dp = "dp+ep", dp_tp = "dp+ep+tp" (without an
  // ep dimension these are "dp" and "dp+tp"); ep; tokens = "dp+ep+tp";
  // expert_dp = "dp", expert_dp_tp = "dp+tp". Not collective (the mesh
  // created its groups already).
  static ParallelGroups from_mesh(const comm::DeviceMesh& mesh);

  int tp_size() const { return group_size(tp); }
  int tp_rank() const { return group_rank(tp); }
  int dp_size() const { return group_size(dp); }
  int dp_rank() const { return group_rank(dp); }
  int ep_size() const { return group_size(ep); }
  int ep_rank() const { return group_rank(ep); }
  // The groups of the expert parameters: dp = expert_dp, dp_tp = expert_dp_tp.
  ParallelGroups for_experts() const;
};

}  // namespace torus::parallel
