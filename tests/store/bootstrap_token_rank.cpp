// One rank of a loopback job started without TORUS_JOB_TOKEN, run by
// bootstrap_token_test.cpp: boots through the real Context, then checks the
// token sharing of context.h from the outside. The token file's place is
// derived here from the documented layout, not from the library's helper:
//   $TORUS_RUNTIME_DIR/torus-<euid>/store-127.0.0.1-<port>.token
// Checks: the directory is 0700 and the file 0600; the file holds a fresh
// 64-hex-digit token, neither the old fixed one nor the stale one the test
// may have planted (BOOTSTRAP_STALE_TOKEN); a client with the file's token
// reads this job's keys (so it is the job's token); a client with the old
// fixed token is refused; rank 0 removes the file at shutdown.
// Exit status 0 when every check passed; every failure is printed.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "torus/comm/context.h"
#include "torus/core/error.h"

namespace {

std::vector<std::string> failures;

void check(bool ok, const std::string& what) {
  if (!ok) failures.push_back(what);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

int main() {
  using namespace torus::comm;
  using namespace std::chrono_literals;
  int rank = -1;
  try {
    auto ctx = Context::create();
    rank = ctx->rank();
    const std::string port = env("TORUS_MASTER_PORT");
    const std::string dir = env("TORUS_RUNTIME_DIR") + "/torus-" + std::to_string(::geteuid());
    const std::string file = dir + "/store-127.0.0.1-" + port + ".token";

    struct stat st{};
    check(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700,
          "the token directory " + dir + " is not a 0700 directory");
    check(::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600,
          "the token file " + file + " is not a 0600 regular file");
    std::string token;
    std::getline(std::ifstream(file), token);
    check(token.size() == 64 && token.find_first_not_of("0123456789abcdef") == std::string::npos,
          "the token file does not hold a 64-hex-digit token: '" + token + "'");
    check(token != "torus-loopback-only", "the job uses the old fixed token");
    check(env("BOOTSTRAP_STALE_TOKEN").empty() || token != env("BOOTSTRAP_STALE_TOKEN"),
          "the job kept the stale token");

    auto& store = ctx->store();
    store->set_string("check/rank" + std::to_string(rank), "here");
    if (!token.empty()) {
      try {
        TcpStore with_file(TcpStore::Options{"127.0.0.1", std::stoi(port), token, 5s, 10s});
        check(with_file.get_string("check/rank0", 20s) == "here", "the file's token reads other values");
      } catch (const std::exception& e) {
        check(false, std::string("the token in the file does not open the job's store: ") + e.what());
      }
    }
    try {
      TcpStore fixed(TcpStore::Options{"127.0.0.1", std::stoi(port), "torus-loopback-only", 3s, 10s});
      check(false, "a client with the old fixed token was let in");
    } catch (const torus::CommError& e) {
      check(std::string(e.what()).find("authentication failed") != std::string::npos,
            std::string("the fixed token failed, but not by authentication: ") + e.what());
    } catch (const std::exception& e) {
      check(false, std::string("the fixed token failed, but not by authentication: ") + e.what());
    }
    // Both ranks have read the file before rank 0 may remove it.
    store->add("check/done", 1);
    store->wait({"check/rank0", "check/rank1"}, 60s);
    for (int i = 0; store->add("check/done", 0) < 2 && i < 6000; ++i) ::usleep(10000);
    ctx.reset();
    if (rank == 0) {
      check(::lstat(file.c_str(), &st) != 0 && errno == ENOENT, "rank 0 left the token file " + file + " behind");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bootstrap_token_rank: rank %d: bootstrap failed: %s\n", rank, e.what());
    return 2;
  }
  for (const auto& f : failures) std::fprintf(stderr, "bootstrap_token_rank: rank %d: FAILED: %s\n", rank, f.c_str());
  if (failures.empty()) std::fprintf(stderr, "bootstrap_token_rank: rank %d: OK\n", rank);
  return failures.empty() ? 0 : 1;
}
