// Helpers for the ofi tests: run a function as n forked "ranks" of one
// machine, and collect what failed.
//
// Each rank is a child process forked from the (single-threaded) gtest
// process before it touches libfabric; it runs `fn(rank)` and exits with 0,
// or writes the exception's text to a pipe and exits with 1. The parent only
// waits (with a deadline, after which it kills the children) and turns
// failures into gtest failures. A rank may also die on purpose (fault
// tests): `expect_exit` says which ranks are expected to exit abnormally.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "torus/core/error.h"

namespace torus::comm::ofi::test {

// Throws std::runtime_error with `what` when `cond` is false (inside ranks).
inline void require(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error(what);
}

struct RankResult {
  int status = 0;       // waitpid status
  std::string output;   // what the rank wrote on failure
  bool exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// Runs fn(rank) in n child processes; returns their results after all ended
// or `deadline` passed (stragglers are killed and reported).
inline std::vector<RankResult> run_ranks(int n, const std::function<void(int)>& fn,
                                         std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  std::vector<pid_t> pids(static_cast<size_t>(n));
  std::vector<int> fds(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe");
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) {
      ::close(p[0]);
      int code = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::string m = e.what();
        (void)!::write(p[1], m.data(), m.size());
        code = 1;
      } catch (...) {
        code = 2;
      }
      ::close(p[1]);
      ::_exit(code);
    }
    ::close(p[1]);
    pids[static_cast<size_t>(r)] = pid;
    fds[static_cast<size_t>(r)] = p[0];
  }
  std::vector<RankResult> results(static_cast<size_t>(n));
  std::set<int> running;
  for (int r = 0; r < n; ++r) running.insert(r);
  auto until = std::chrono::steady_clock::now() + deadline;
  while (!running.empty()) {
    for (auto it = running.begin(); it != running.end();) {
      int st = 0;
      if (::waitpid(pids[static_cast<size_t>(*it)], &st, WNOHANG) > 0) {
        results[static_cast<size_t>(*it)].status = st;
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    if (running.empty()) break;
    if (std::chrono::steady_clock::now() > until) {
      for (int r : running) {
        ::kill(pids[static_cast<size_t>(r)], SIGKILL);
        int st = 0;
        ::waitpid(pids[static_cast<size_t>(r)], &st, 0);
        results[static_cast<size_t>(r)].status = st;
        results[static_cast<size_t>(r)].output = "killed: did not finish before the test deadline";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < n; ++r) {
    char buf[4096];
    ssize_t k;
    while ((k = ::read(fds[static_cast<size_t>(r)], buf, sizeof(buf))) > 0) {
      results[static_cast<size_t>(r)].output.append(buf, static_cast<size_t>(k));
    }
    ::close(fds[static_cast<size_t>(r)]);
  }
  return results;
}

// EXPECTs that every rank not in `may_die` exited with status 0.
inline void expect_all_ok(const std::vector<RankResult>& results, const std::set<int>& may_die = {}) {
  for (size_t r = 0; r < results.size(); ++r) {
    if (may_die.count(static_cast<int>(r))) continue;
    EXPECT_TRUE(results[r].exited_ok()) << "rank " << r << " (status " << results[r].status
                                        << "): " << results[r].output;
  }
}

// EXPECTs that `victim` died of a signal and every other rank exited with 0.
inline void expect_victim_died(const std::vector<RankResult>& results, int victim) {
  for (size_t r = 0; r < results.size(); ++r) {
    if (static_cast<int>(r) == victim) {
      EXPECT_TRUE(WIFSIGNALED(results[r].status)) << "the victim did not die";
    } else {
      EXPECT_TRUE(results[r].exited_ok()) << "rank " << r << ": " << results[r].output;
    }
  }
}

// How an op that must fail failed (inside ranks): `op` runs and must throw
// CommError, TimeoutError or InvalidArgument; if it returns, `succeeded` is
// thrown instead.
struct Failure {
  std::string message;
  bool invalid = false;  // InvalidArgument
  std::chrono::milliseconds took{0};
};
inline Failure failure_of(const std::function<void()>& op, const std::string& succeeded) {
  Failure f;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    op();
    throw std::runtime_error(succeeded);
  } catch (const InvalidArgument& e) {
    f.message = e.what(), f.invalid = true;
  } catch (const CommError& e) {
    f.message = e.what();
  } catch (const TimeoutError& e) {
    f.message = e.what();
  }
  f.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  return f;
}

}  // namespace torus::comm::ofi::test
