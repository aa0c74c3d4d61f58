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

#include "torus/comm/store.h"

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

// Note [Fork with no threads]: the ranks are forked, so the test process
// must have no other thread when it forks: a child inherits any lock another
// thread holds at that moment (malloc's, OpenSSL's) and deadlocks on it — a
// store server thread handling the first ranks' handshakes while a later
// rank is forked did exactly that (the child hung before authenticating).
// The store server therefore runs in a process of its own, forked first
// while the test process is still single-threaded.
class StoreServerProcess {
 public:
  explicit StoreServerProcess(const std::string& token) {
    int port_pipe[2], hold_pipe[2];
    if (::pipe(port_pipe) != 0 || ::pipe(hold_pipe) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      ::close(port_pipe[0]);
      ::close(hold_pipe[1]);
      int port = -1;
      try {
        TcpStoreServer::Options o;
        o.token = token;
        TcpStoreServer server(o);
        port = server.port();
        (void)!::write(port_pipe[1], &port, sizeof port);
        ::close(port_pipe[1]);
        char c;
        while (::read(hold_pipe[0], &c, 1) > 0) {
        }  // until the test process closes its end (or dies)
      } catch (...) {
        (void)!::write(port_pipe[1], &port, sizeof port);
      }
      ::_exit(0);
    }
    ::close(port_pipe[1]);
    ::close(hold_pipe[0]);
    hold_ = hold_pipe[1];
    if (::read(port_pipe[0], &port_, sizeof port_) != static_cast<ssize_t>(sizeof port_)) port_ = -1;
    ::close(port_pipe[0]);
    if (port_ <= 0) throw std::runtime_error("the store server process did not start");
  }
  ~StoreServerProcess() {
    ::close(hold_);
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  StoreServerProcess(const StoreServerProcess&) = delete;
  StoreServerProcess& operator=(const StoreServerProcess&) = delete;
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  int port_ = -1;
};

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
