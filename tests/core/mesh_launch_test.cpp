// Unit tests of the device-mesh arithmetic and launch detection.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "comm/agent_store.h"
#include "torus/comm/context.h"
#include "torus/comm/mesh_layout.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

TEST(MeshLayout, CoordinatesAreRowMajorWithTpInnermost) {
  MeshLayout m({{"tp", 2}, {"pp", 2}, {"dp", 3}});
  EXPECT_EQ(m.world_size(), 12);
  for (int r = 0; r < 12; ++r) {
    // Closed form for order pp, dp, ep, cp, tp with sizes 2,3,1,1,2.
    EXPECT_EQ(m.coord(r, "tp"), r % 2);
    EXPECT_EQ(m.coord(r, "dp"), (r / 2) % 3);
    EXPECT_EQ(m.coord(r, "pp"), r / 6);
    EXPECT_EQ(m.rank_of(m.coords(r)), r);
  }
}

TEST(MeshLayout, GroupsPartitionTheWorld) {
  MeshLayout m({{"pp", 2}, {"dp", 2}, {"tp", 2}});
  for (const std::vector<std::string>& dims :
       {std::vector<std::string>{"tp"}, {"dp"}, {"pp"}, {"dp", "tp"}, {"pp", "tp"}, {"pp", "dp", "tp"}}) {
    int expected_size = 1;
    for (const auto& d : dims) expected_size *= m.size(d);
    std::map<int, std::set<int>> by_color;
    for (int r = 0; r < 8; ++r) {
      auto g = m.group_ranks(r, dims);
      ASSERT_EQ(static_cast<int>(g.size()), expected_size);
      auto [color, key] = m.split_color_key(r, dims);
      EXPECT_EQ(g[key], r) << "key is the rank's position in its group";
      by_color[color].insert(g.begin(), g.end());
      for (int peer : g) {
        EXPECT_EQ(m.group_ranks(peer, dims), g) << "group members agree on the group";
        for (int d = 0; d < 5; ++d) {
          bool inside = std::find(dims.begin(), dims.end(), std::string(kMeshDims[d])) != dims.end();
          if (!inside) EXPECT_EQ(m.coords(peer)[d], m.coords(r)[d]);
        }
      }
    }
    int total = 0;
    for (auto& [c, s] : by_color) total += static_cast<int>(s.size());
    EXPECT_EQ(total, 8);
  }
  // tp groups are consecutive ranks.
  EXPECT_EQ(m.group_ranks(5, {"tp"}), (std::vector<int>{4, 5}));
}

TEST(MeshLayout, ValidationErrors) {
  EXPECT_THROW(MeshLayout({{"xp", 2}}), InvalidArgument);
  EXPECT_THROW(MeshLayout({{"tp", 2}, {"tp", 2}}), InvalidArgument);
  EXPECT_THROW(MeshLayout({{"dp", 0}}), InvalidArgument);
  MeshLayout m({{"dp", 2}, {"tp", 4}});
  EXPECT_THROW(m.validate(6, 0), InvalidArgument);  // product != world
  EXPECT_NO_THROW(m.validate(8, 4));
  EXPECT_THROW(m.validate(8, 2), InvalidArgument);  // tp crosses hosts
  try {
    m.validate(6, 0);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("dp=2 x tp=4"), std::string::npos) << e.what();
  }
}

GetEnv env_of(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Launch, PrecedenceOfSources) {
  InitOptions none;
  auto ompi = env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                      {"RANK", "9"},
                      {"WORLD_SIZE", "10"}});
  LaunchInfo a = detect_launch(none, {}, ompi);
  EXPECT_EQ(a.source, "open-mpi");
  EXPECT_EQ(a.rank, 2);
  EXPECT_EQ(a.world_size, 4);
  EXPECT_EQ(a.local_size, 2);
  EXPECT_TRUE(a.launched_by_mpi);

  // TORUS_* values come parsed (EnvParams) and outrank the launcher's.
  EnvParams torus_env;
  torus_env.rank = 1;
  torus_env.world_size = 3;
  auto ompi3 = env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(detect_launch(none, torus_env, ompi3).source, "torus-env");
  EXPECT_EQ(detect_launch(none, torus_env, ompi3).rank, 1);
  EXPECT_EQ(detect_launch(none, torus_env, ompi3).local_size, -1) << "the launcher's local size is not mixed in";

  InitOptions explicit_opts;
  explicit_opts.rank = 0;
  explicit_opts.world_size = 3;
  EXPECT_EQ(detect_launch(explicit_opts, torus_env, ompi3).source, "options");

  // TORUS_LOCAL_* override the launcher's local values; options override both.
  EnvParams local_env;
  local_env.local_rank = 1;
  local_env.local_size = 4;
  LaunchInfo l = detect_launch(none, local_env, ompi);
  EXPECT_EQ(l.source, "open-mpi");
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_size, 4);
  InitOptions local_opts;
  local_opts.local_size = 8;
  EXPECT_EQ(detect_launch(local_opts, local_env, ompi).local_size, 8);

  auto torchrun = env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                          {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  LaunchInfo t = detect_launch(none, {}, torchrun);
  EXPECT_EQ(t.source, "torchrun");
  EXPECT_EQ(t.master_addr, "10.0.0.1");
  EXPECT_EQ(t.master_port, 29500);
  EXPECT_EQ(t.local_rank, 1);
  // The store address: TORUS_MASTER_* over MASTER_*.
  EnvParams master_env;
  master_env.master_addr = "10.0.0.9";
  master_env.master_port = 4100;
  LaunchInfo m = detect_launch(none, master_env, torchrun);
  EXPECT_EQ(m.master_addr, "10.0.0.9");
  EXPECT_EQ(m.master_port, 4100);

  // Slurm variables only count inside a step.
  auto slurm_alloc = env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(detect_launch(none, {}, slurm_alloc).source, "single");
  auto slurm_step = env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_ID", "0"},
                            {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "4000"}});
  EXPECT_EQ(detect_launch(none, {}, slurm_step).source, "slurm");
  EXPECT_EQ(detect_launch(none, {}, slurm_step).rank, 5);

  EXPECT_EQ(detect_launch(none, {}, env_of({})).source, "single");
}

TEST(Launch, UnderEachLauncher) {
  InitOptions none;
  // mpirun in an MPIJob's launcher pod: Open MPI's variables, whatever the
  // pod's environment also holds.
  auto mpijob = env_of({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "16"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"},
                        {"KUBERNETES_SERVICE_HOST", "10.100.0.1"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}});
  LaunchInfo a = detect_launch(none, {}, mpijob);
  EXPECT_EQ(a.source, "open-mpi");
  EXPECT_EQ(a.rank, 5);
  EXPECT_EQ(a.local_rank, 1);
  EXPECT_EQ(a.local_size, 8);

  // srun --mpi=pmix: PMIx's rank without a size, and the step's variables;
  // 8 tasks on 2 nodes, this one the second on node 1.
  auto srun_pmix = env_of({{"PMIX_RANK", "5"}, {"PMIX_NAMESPACE", "slurm.pmix.77.0"}, {"SLURM_STEP_ID", "0"},
                           {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                           {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "4(x2)"},
                           {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29500"}});
  LaunchInfo p = detect_launch(none, {}, srun_pmix);
  EXPECT_EQ(p.source, "slurm");
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_size, 4);

  // Slurm without MPI (plain srun): uneven nodes, "3(x2),2" — node 2 has 2.
  auto srun = env_of({{"SLURM_STEP_ID", "3"}, {"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                      {"SLURM_NODEID", "2"}, {"SLURM_TASKS_PER_NODE", "3(x2),2"}, {"SLURM_NTASKS_PER_NODE", "3"},
                      {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29500"}});
  LaunchInfo s = detect_launch(none, {}, srun);
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.local_size, 2) << "SLURM_TASKS_PER_NODE at SLURM_NODEID";
  EXPECT_THROW(detect_launch(none, {}, env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
                                               {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "4(y2)"}})),
               InvalidArgument);
  // Only an integer SLURM_NTASKS_PER_NODE counts when the list is absent.
  auto per_node = env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
                          {"SLURM_NTASKS_PER_NODE", "1"}});
  EXPECT_EQ(detect_launch(none, {}, per_node).local_size, 1);

  // A Kubernetes operator's pod-level RANK is never taken for a process rank.
  auto pod = env_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"},
                     {"KUBERNETES_SERVICE_HOST", "10.100.0.1"}});
  try {
    detect_launch(none, {}, pod);
    ADD_FAILURE() << "a pod-level RANK was taken for a process rank";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("training operator's pod rank"), std::string::npos) << e.what();
  }
  // ... but torchrun inside the pod, and TORUS_* set by the operator's user, are.
  auto torchrun_pod = env_of({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                              {"TORCHELASTIC_RUN_ID", "abc"}, {"MASTER_ADDR", "job-master-0"},
                              {"MASTER_PORT", "23456"}, {"KUBERNETES_SERVICE_HOST", "10.100.0.1"}});
  EXPECT_EQ(detect_launch(none, {}, torchrun_pod).source, "torchrun");
  // torchrun started by srun or mpirun (one agent per node): its workers
  // inherit the agent's task variables, which describe the agent.
  auto srun_torchrun = env_of({{"SLURM_STEP_ID", "0"},
                               {"SLURM_PROCID", "1"},
                               {"SLURM_NTASKS", "2"},
                               {"SLURM_LOCALID", "0"},
                               {"RANK", "11"},
                               {"WORLD_SIZE", "16"},
                               {"LOCAL_RANK", "3"},
                               {"LOCAL_WORLD_SIZE", "8"},
                               {"TORCHELASTIC_RUN_ID", "j"},
                               {"MASTER_ADDR", "node0"},
                               {"MASTER_PORT", "29500"}});
  LaunchInfo st = detect_launch(none, {}, srun_torchrun);
  EXPECT_EQ(st.source, "torchrun");
  EXPECT_EQ(st.rank, 11);
  EXPECT_EQ(st.world_size, 16);
  EXPECT_EQ(st.local_rank, 3);
  EXPECT_EQ(st.local_size, 8);
  auto mpirun_torchrun = env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "2"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                                 {"RANK", "5"},
                                 {"WORLD_SIZE", "8"},
                                 {"LOCAL_RANK", "1"},
                                 {"LOCAL_WORLD_SIZE", "4"},
                                 {"TORCHELASTIC_RUN_ID", "j"},
                                 {"MASTER_ADDR", "node0"},
                                 {"MASTER_PORT", "29500"}});
  LaunchInfo mt = detect_launch(none, {}, mpirun_torchrun);
  EXPECT_EQ(mt.source, "torchrun");
  EXPECT_EQ(mt.rank, 5);
  EXPECT_FALSE(mt.launched_by_mpi) << "a torchrun worker is not an MPI rank";
  EnvParams one_per_pod;
  one_per_pod.rank = 1;
  one_per_pod.world_size = 4;
  one_per_pod.master_addr = "job-master-0";
  one_per_pod.master_port = 23456;
  EXPECT_EQ(detect_launch(none, one_per_pod, pod).source, "torus-env");
}

// Under torchrun its agent serves the store at MASTER_ADDR:MASTER_PORT (Note
// [torchrun's agent store] in src/comm/agent_store.h), with the restart attempt.
TEST(Launch, TorchrunAgentStore) {
  InitOptions none;
  std::map<std::string, std::string> vars = {{"RANK", "1"},
                                             {"WORLD_SIZE", "2"},
                                             {"LOCAL_RANK", "1"},
                                             {"LOCAL_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "node0"},
                                             {"MASTER_PORT", "29611"},
                                             {"TORCHELASTIC_RUN_ID", "job7"},
                                             {"TORCHELASTIC_RESTART_COUNT", "3"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  LaunchInfo t = detect_launch(none, {}, env_of(vars));
  EXPECT_EQ(t.source, "torchrun");
  EXPECT_EQ(t.master_addr, "node0");
  EXPECT_EQ(t.master_port, 29611);
  auto agent = detect_agent_store(none, {}, env_of(vars));
  ASSERT_TRUE(agent.has_value());
  EXPECT_EQ(agent->run_id, "job7");
  EXPECT_EQ(agent->restart_count, 3);

  // torchrun writes str(bool); without the agent's store (its opt-out) rank 0 hosts at MASTER_ADDR as before.
  for (const char* off : {"False", "0", ""}) {
    auto v = vars;
    v["TORCHELASTIC_USE_AGENT_STORE"] = off;
    EXPECT_FALSE(detect_agent_store(none, {}, env_of(v)).has_value()) << off;
  }
  auto unset = vars;
  unset.erase("TORCHELASTIC_USE_AGENT_STORE");
  EXPECT_FALSE(detect_agent_store(none, {}, env_of(unset)).has_value());
  auto lower = vars;
  lower["TORCHELASTIC_USE_AGENT_STORE"] = "true";
  EXPECT_TRUE(detect_agent_store(none, {}, env_of(lower)).has_value());

  // An address given to Torus itself is Torus's to listen on, agent or not.
  EnvParams own;
  own.master_addr = "10.0.0.9";
  own.master_port = 4100;
  EXPECT_FALSE(detect_agent_store(none, own, env_of(vars)).has_value());
  EnvParams own_port;
  own_port.master_port = 4100;  // MASTER_ADDR with Torus's own port: not the agent's endpoint either
  EXPECT_FALSE(detect_agent_store(none, own_port, env_of(vars)).has_value());
  InitOptions opts;
  opts.master_addr = "127.0.0.1";
  opts.master_port = 4200;
  EXPECT_FALSE(detect_agent_store(opts, {}, env_of(vars)).has_value());

  // Bad values are named.
  auto bad = vars;
  bad["TORCHELASTIC_USE_AGENT_STORE"] = "maybe";
  try {
    detect_agent_store(none, {}, env_of(bad));
    ADD_FAILURE() << "TORCHELASTIC_USE_AGENT_STORE=maybe accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TORCHELASTIC_USE_AGENT_STORE"), std::string::npos) << e.what();
  }
  auto no_count = vars;
  no_count.erase("TORCHELASTIC_RESTART_COUNT");
  EXPECT_THROW(detect_agent_store(none, {}, env_of(no_count)), InvalidArgument);
  auto neg = vars;
  neg["TORCHELASTIC_RESTART_COUNT"] = "-1";
  EXPECT_THROW(detect_agent_store(none, {}, env_of(neg)), InvalidArgument);
}

TEST(Launch, RejectsInconsistentInput) {
  InitOptions none;
  EXPECT_THROW(detect_launch(none, {}, env_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"},
                                           {"MASTER_PORT", "1"}})),
               InvalidArgument);
  EXPECT_THROW(detect_launch(none, {}, env_of({{"RANK", "1"}})), InvalidArgument);
  EnvParams half;
  half.rank = 1;  // TORUS_RANK without TORUS_WORLD_SIZE
  try {
    detect_launch(none, half, env_of({}));
    ADD_FAILURE() << "TORUS_RANK alone accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TORUS_WORLD_SIZE"), std::string::npos) << e.what();
  }
  EXPECT_THROW(detect_launch(none, {}, env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), InvalidArgument);
  // A multi-rank torchrun-style job without a store address.
  EXPECT_THROW(detect_launch(none, {}, env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}})), InvalidArgument);
  EXPECT_THROW(detect_launch(none, {}, env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
               InvalidArgument);
}

}  // namespace
}  // namespace torus::comm
