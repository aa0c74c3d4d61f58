// A loopback job without TORUS_JOB_TOKEN, end to end (context.h, Note [Local
// job token]): two processes of bootstrap_token_rank.cpp started with only
// TORUS_RANK, TORUS_WORLD_SIZE, TORUS_MASTER_ADDR=127.0.0.1 and a free
// TORUS_MASTER_PORT (and a scratch TORUS_RUNTIME_DIR), as any launcher but
// mpirun would start them.
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "store_test_util.h"

extern char** environ;

namespace torus::comm::test {
namespace {

class Scratch {
 public:
  Scratch() {
    char tmpl[] = "/tmp/torus-bootstrap-token-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = tmpl;
  }
  ~Scratch() { (void)std::system(("rm -rf '" + root_ + "'").c_str()); }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

bool launcher_variable(const std::string& name) {
  for (const char* prefix : {"TORUS_", "OMPI_", "PMIX_", "SLURM_", "FI_"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  for (const char* exact : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    if (name == exact) return true;
  }
  return false;
}

struct Rank {
  pid_t pid = -1;
  std::string log;
  int status = -1;  // exit status; -1 while running or when killed
};

Rank spawn_rank(int rank, int port, const std::string& runtime_dir, const std::string& stale_token) {
  Rank r;
  r.log = runtime_dir + "/rank" + std::to_string(rank) + ".log";
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    if (!launcher_variable(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  for (std::string kv : {"TORUS_RANK=" + std::to_string(rank), std::string("TORUS_WORLD_SIZE=2"),
                         std::string("TORUS_MASTER_ADDR=127.0.0.1"), "TORUS_MASTER_PORT=" + std::to_string(port),
                         "TORUS_RUNTIME_DIR=" + runtime_dir, std::string("TORUS_STORE_TIMEOUT_MS=30000"),
                         std::string("TORUS_BACKEND=ofi"), std::string("FI_PROVIDER=shm"),
                         std::string("TORUS_LOG_LEVEL=info")}) {
    env.push_back(kv);
  }
  if (!stale_token.empty()) env.push_back("BOOTSTRAP_STALE_TOKEN=" + stale_token);
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::string exe = TORUS_BOOTSTRAP_TOKEN_RANK;
  char* argv[] = {exe.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, r.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  int rc = ::posix_spawn(&r.pid, exe.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn " + exe + ": " + std::strerror(rc));
  return r;
}

// Waits for every rank (killing what is left at the deadline) and returns
// how long that took.
double wait_all(std::vector<Rank>& ranks, std::chrono::seconds limit) {
  auto t0 = std::chrono::steady_clock::now();
  for (auto& r : ranks) {
    int st = 0;
    while (::waitpid(r.pid, &st, WNOHANG) == 0) {
      if (seconds_since(t0) > static_cast<double>(limit.count())) {
        ::kill(r.pid, SIGKILL);
        ::waitpid(r.pid, &st, 0);
        ADD_FAILURE() << "rank with log " << r.log << " was still running after " << limit.count() << " s";
        st = -1;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    r.status = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  return seconds_since(t0);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string token_dir(const Scratch& s) { return s.root() + "/torus-" + std::to_string(::geteuid()); }

TEST(StoreBootstrapToken, LoopbackJobWithoutTokenSharesAFreshPrivateToken) {
  Scratch s;
  const int port = free_port();
  std::vector<Rank> ranks = {spawn_rank(0, port, s.root(), ""), spawn_rank(1, port, s.root(), "")};
  wait_all(ranks, 120s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].status, 0) << "rank " << r << ":\n" << slurp(ranks[r].log);
  }
  EXPECT_NE(slurp(ranks[0].log).find("generated a job token"), std::string::npos) << slurp(ranks[0].log);
}

TEST(StoreBootstrapToken, StaleTokenFileOfAnEarlierJobDoesNotStopTheJob) {
  Scratch s;
  const int port = free_port();
  const std::string stale = "0000000000000000000000000000000000000000000000000000000000000000";
  const std::string dir = token_dir(s);
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string file = dir + "/store-127.0.0.1-" + std::to_string(port) + ".token";
  {
    std::ofstream(file) << stale << "\n";
  }
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  // Rank 1 first: it reads the stale token and is refused once rank 0 is up.
  std::vector<Rank> ranks = {spawn_rank(1, port, s.root(), stale)};
  std::this_thread::sleep_for(500ms);
  ranks.insert(ranks.begin(), spawn_rank(0, port, s.root(), stale));
  double took = wait_all(ranks, 120s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].status, 0) << "rank " << r << ":\n" << slurp(ranks[r].log);
  }
  EXPECT_LT(took, 60.0);
}

TEST(StoreBootstrapToken, DirectoryOpenToOthersIsRefusedByEveryRank) {
  Scratch s;
  const int port = free_port();
  const std::string dir = token_dir(s);
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  std::vector<Rank> ranks = {spawn_rank(0, port, s.root(), ""), spawn_rank(1, port, s.root(), "")};
  double took = wait_all(ranks, 120s);
  for (int r = 0; r < 2; ++r) {
    std::string log = slurp(ranks[r].log);
    EXPECT_EQ(ranks[r].status, 2) << "rank " << r << " did not fail in the bootstrap:\n" << log;
    EXPECT_NE(log.find("refusing the directory " + dir), std::string::npos) << log;
    EXPECT_NE(log.find("mode is 0755"), std::string::npos) << log;
  }
  EXPECT_LT(took, 20.0) << "the refusal waited for the store timeout";
  struct stat st{};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u) << "the refused directory was changed";
}

}  // namespace
}  // namespace torus::comm::test
