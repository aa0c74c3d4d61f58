// The NCCL watchdog policy (src/comm/nccl/watchdog.h) with fake hooks and an
// injected clock: completion releases buffers, a deadline or an asynchronous
// error aborts the communicator exactly once and before any op fails, a
// broken group refuses new ops, and the abort gate keeps an aborted op from
// reading as a success. No GPU, no NCCL.
#include "comm/nccl/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "torus/core/error.h"

namespace torus::comm::nccl {
namespace {

using namespace std::chrono_literals;

WorkInfo op_info(uint64_t seq) {
  WorkInfo w;
  w.seq = seq;
  w.op = OpType::kAllReduce;
  w.group = "tp";
  w.rank = 1;
  w.group_size = 2;
  w.dtype = DType::kBF16;
  w.sizes = {1024};
  return w;
}

// A fake communicator and clock.
struct Fake {
  Clock::time_point now = Clock::time_point{} + 1h;
  std::string async_error;
  std::atomic<int> aborts{0};
  std::string abort_reason;
  std::function<void()> on_abort;  // runs inside the abort hook

  WatchdogHooks hooks() {
    WatchdogHooks h;
    h.async_error = [this] { return async_error; };
    h.abort = [this](const std::string& reason) {
      ++aborts;
      abort_reason = reason;
      if (on_abort) on_abort();
    };
    h.now = [this] { return now; };
    return h;
  }
};

Watchdog::Options manual() { return {"tp", 1, 1ms, false}; }

template <typename E>
std::string failure_of(const std::shared_ptr<Work>& w) {
  try {
    std::rethrow_exception(w->exception());
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
}

TEST(NcclWatchdog, CompletesAndReleasesBuffers) {
  Fake fake;
  Watchdog wd(fake.hooks(), manual());
  auto work = std::make_shared<Work>(op_info(1));
  auto buffer = std::make_shared<int>(7);
  std::weak_ptr<int> alive = buffer;
  work->keep_alive(std::move(buffer));
  bool done = false;
  wd.track(work, [&] { return done; }, fake.now + 10s);
  wd.poll();
  EXPECT_FALSE(work->is_completed());
  EXPECT_FALSE(alive.expired());
  EXPECT_EQ(wd.in_flight(), 1u);
  done = true;
  wd.poll();
  EXPECT_TRUE(work->succeeded());
  EXPECT_TRUE(alive.expired()) << "the buffer must be released once the op completed";
  EXPECT_EQ(wd.in_flight(), 0u);
  EXPECT_EQ(fake.aborts, 0);
}

TEST(NcclWatchdog, DeadlineAbortsOnceThenFailsEveryOp) {
  Fake fake;
  Watchdog wd(fake.hooks(), manual());
  auto first = std::make_shared<Work>(op_info(1));
  auto second = std::make_shared<Work>(op_info(2));
  auto finished = std::make_shared<Work>(op_info(3));
  bool finished_done = false;
  wd.track(first, [] { return false; }, fake.now + 2s);
  wd.track(second, [] { return false; }, fake.now + 60s);
  wd.track(finished, [&] { return finished_done; }, fake.now + 1s);
  // The abort comes before any op fails, so that no buffer is released while
  // the device may still use it.
  fake.on_abort = [&] {
    EXPECT_FALSE(first->is_completed());
    EXPECT_FALSE(second->is_completed());
  };
  fake.now += 1500ms;
  finished_done = true;  // completed just past its deadline: a success, not a timeout
  wd.poll();
  EXPECT_TRUE(finished->succeeded());
  EXPECT_EQ(fake.aborts, 0);
  fake.now += 1s;
  wd.poll();
  EXPECT_EQ(fake.aborts, 1);
  EXPECT_TRUE(wd.broken());
  std::string msg = failure_of<TimeoutError>(first);
  EXPECT_NE(msg.find("all_reduce seq 1 on group 'tp' (rank 1/2, bf16, sizes [1024])"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2000 ms"), std::string::npos) << msg;
  std::string other = failure_of<CommError>(second);
  EXPECT_NE(other.find("seq 2"), std::string::npos) << other;
  EXPECT_NE(other.find("was aborted"), std::string::npos) << other;
  // A broken group fails new ops at once, and never aborts twice.
  auto later = std::make_shared<Work>(op_info(4));
  wd.track(later, [] { return true; }, fake.now + 10s);
  EXPECT_NE(failure_of<CommError>(later).find("broken"), std::string::npos);
  fake.now += 1h;
  wd.poll();
  wd.abort("again");
  EXPECT_EQ(fake.aborts, 1);
}

TEST(NcclWatchdog, AsynchronousErrorAborts) {
  Fake fake;
  Watchdog wd(fake.hooks(), manual());
  auto work = std::make_shared<Work>(op_info(5));
  wd.track(work, [] { return false; }, fake.now + 10s);
  wd.poll();
  EXPECT_FALSE(wd.broken());
  fake.async_error = "remote process exited or there was a network error";
  wd.poll();
  EXPECT_EQ(fake.aborts, 1);
  std::string msg = failure_of<CommError>(work);
  EXPECT_NE(msg.find("asynchronous error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("remote process exited"), std::string::npos) << msg;
}

TEST(NcclWatchdog, UserAbortIsIdempotent) {
  Fake fake;
  Watchdog wd(fake.hooks(), manual());
  auto work = std::make_shared<Work>(op_info(6));
  wd.track(work, [] { return false; }, fake.now + 10s);
  wd.abort("user says stop");
  wd.abort("user says stop again");
  EXPECT_EQ(fake.aborts, 1);
  EXPECT_EQ(fake.abort_reason, "user says stop");
  EXPECT_NE(failure_of<CommError>(work).find("user says stop"), std::string::npos);
  EXPECT_EQ(wd.broken_reason(), "user says stop");
}

TEST(NcclWatchdog, FailingProbeBreaksTheGroup) {
  Fake fake;
  Watchdog wd(fake.hooks(), manual());
  auto bad = std::make_shared<Work>(op_info(7));
  auto other = std::make_shared<Work>(op_info(8));
  wd.track(bad, [] () -> bool { throw Error("CUDA error: cudaEventQuery failed: an illegal memory access"); },
           fake.now + 10s);
  wd.track(other, [] { return false; }, fake.now + 10s);
  wd.poll();
  EXPECT_EQ(fake.aborts, 1);
  EXPECT_NE(failure_of<Error>(bad).find("illegal memory access"), std::string::npos);
  EXPECT_TRUE(other->is_completed());
  EXPECT_FALSE(other->succeeded());
}

// Note [Abort gate]: once the gate is closed, a probe that would now report
// completion (kernels of an aborted communicator exit early) is not asked.
TEST(NcclWatchdog, GateClosesBeforeTheAbort) {
  Fake fake;
  Watchdog wd(fake.hooks(), manual());
  bool gate_closed_during_abort = false;
  fake.on_abort = [&] {
    std::lock_guard<std::mutex> lock(wd.gate()->mu);
    gate_closed_during_abort = wd.gate()->broken;
  };
  wd.abort("stop");
  EXPECT_TRUE(gate_closed_during_abort);
  int probes = 0;
  auto work = std::make_shared<Work>(op_info(9));
  wd.track(work, [&] { return ++probes > 0; }, fake.now + 1s);
  wd.poll();
  EXPECT_EQ(probes, 0);
  EXPECT_FALSE(work->succeeded());
}

TEST(NcclWatchdog, BackgroundThreadCompletesAndDrains) {
  WatchdogHooks hooks;  // real clock
  hooks.async_error = [] { return std::string(); };
  hooks.abort = [](const std::string&) {};
  Watchdog wd(std::move(hooks), {"dp", 0, 1ms, true});
  std::atomic<bool> done{false};
  auto work = std::make_shared<Work>(op_info(10));
  wd.track(work, [&] { return done.load(); }, Clock::now() + 60s);
  std::thread flip([&] {
    std::this_thread::sleep_for(20ms);
    done = true;
  });
  work->wait(10s);  // woken by the watchdog thread
  flip.join();
  EXPECT_TRUE(work->succeeded());
  auto stuck = std::make_shared<Work>(op_info(11));
  wd.track(stuck, [] { return false; }, Clock::now() + 60s);
  EXPECT_FALSE(wd.drain(30ms));
  EXPECT_EQ(wd.in_flight(), 1u);
  wd.abort("test over");
  EXPECT_TRUE(wd.drain(30ms));
}

}  // namespace
}  // namespace torus::comm::nccl
