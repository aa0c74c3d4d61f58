// The inline path of small all_reduces on a one-host group (Note [Inline
// mailbox all_reduce] in host_collectives.h): results for every dtype and
// op in both its forms (mailbox, eager in-slots) and mixed with engine ops;
// a late peer hands the op to the engine without blocking the caller; ranks
// issuing two groups' ops in opposite orders do not deadlock; a peer that
// dies before joining makes the others fail naming it; the Work says what
// it was. The same for the other collectives, which start inline through
// the engine's coroutines (Note [Inline ops] in engine.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "collective_checks.h"
#include "torus/core/error.h"

namespace torus::comm::ofi::test {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

JobSpec inline_job(int n, size_t spin_us = 10) {
  JobSpec s = one_host(n, "shm");
  s.options.inline_spin_us = spin_us;
  return s;
}

class InlineRanks : public testing::TestWithParam<int> {};

// Every size on both sides of the mailbox limit (56 bytes) and of the eager
// limit, in f32/avg/i32/bf16 (check_all_reduce), then with f16 and f64,
// interleaved with large (engine) all_reduces and async small ones.
TEST_P(InlineRanks, ResultsMatchClosedFormsAcrossTheLimits) {
  const int n = GetParam();
  auto results = run_job(inline_job(n), [&](Backend& b, int rank) {
    for (size_t count : {1, 2, 13, 14, 15, 27, 28, 29, 100, 1000, 4095, 4096, 4097, 50000}) {
      check_all_reduce(b, count);
    }
    for (size_t count : {1, 28, 29, 3000}) {
      std::vector<uint16_t> h(count), out(count);
      for (size_t i = 0; i < count; ++i) h[i] = kernels::float_to_f16(static_cast<float>(contribution(rank, i)));
      b.all_reduce(h.data(), out.data(), count, DType::kF16, ReduceOp::kSum, kT)->wait();
      std::vector<float> f(count);
      for (size_t i = 0; i < count; ++i) f[i] = kernels::f16_to_float(out[i]);
      require_values(
          f, [&](size_t i) { return sum_over(n, i); }, "f16 sum count " + std::to_string(count));
      std::vector<double> d(count);
      for (size_t i = 0; i < count; ++i) d[i] = contribution(rank, i) + 0.25;
      b.all_reduce(d.data(), d.data(), count, DType::kF64, ReduceOp::kMax, kT)->wait();
      require_values(
          d, [&](size_t i) { return max_over(n, i) + 0.25; }, "f64 max count " + std::to_string(count));
    }
    // Async: a large op in flight makes the small ones behind it queue in
    // the engine (in order); then small ones back to back, waited at the end.
    std::vector<float> big = filled(rank, 1 << 20);
    std::vector<std::vector<float>> small(8, std::vector<float>(3));
    std::vector<WorkPtr> works;
    works.push_back(b.all_reduce(big.data(), big.data(), big.size(), DType::kF32, ReduceOp::kSum, kT));
    for (size_t k = 0; k < small.size(); ++k) {
      for (size_t i = 0; i < 3; ++i) small[k][i] = static_cast<float>(contribution(rank, i + k));
      works.push_back(b.all_reduce(small[k].data(), small[k].data(), 3, DType::kF32, ReduceOp::kSum, kT));
    }
    for (auto& w : works) w->wait();
    require_values(
        big, [&](size_t i) { return sum_over(n, i); }, "large all_reduce before small ones");
    for (size_t k = 0; k < small.size(); ++k) {
      require_values(
          small[k], [&](size_t i) { return sum_over(n, i + k); }, "small op " + std::to_string(k));
    }
  });
  expect_all_ok(results);
}

INSTANTIATE_TEST_SUITE_P(Ofi, InlineRanks, testing::Values(2, 3, 4));

// The same results with the inline path off (every op through the engine),
// on a few sizes: the two paths are one protocol.
TEST(Inline, OffGivesTheSameResults) {
  auto results = run_job(inline_job(3, 0), [&](Backend& b, int) {
    for (size_t count : {1, 14, 15, 1000}) check_all_reduce(b, count);
  });
  expect_all_ok(results);
}

// Rank 1 joins 300 ms late: rank 0's all_reduce() returns after its short
// spin with a Work that is not complete, the engine finishes it, and the
// result is right on both ranks; then the reverse, on the eager path.
TEST(Inline, LatePeerHandsTheOpToTheEngine) {
  auto results = run_job(inline_job(2), [&](Backend& b, int rank) {
    for (size_t count : {size_t{2}, size_t{1000}}) {
      const int late = count == 2 ? 1 : 0;
      b.barrier(kT)->wait();
      std::vector<float> x = filled(rank, count);
      if (rank == late) std::this_thread::sleep_for(Ms(300));
      const auto t0 = Clock::now();
      WorkPtr w = b.all_reduce(x.data(), x.data(), count, DType::kF32, ReduceOp::kSum, kT);
      const auto issued = std::chrono::duration_cast<Ms>(Clock::now() - t0);
      if (rank != late) {
        require(issued < Ms(100), "all_reduce() blocked its caller for " + std::to_string(issued.count()) + " ms");
        require(!w->is_completed(), "the op completed before the late peer joined");
      }
      w->wait();
      require_values(
          x, [&](size_t i) { return sum_over(2, i); }, "late-peer result count " + std::to_string(count));
    }
  });
  expect_all_ok(results);
}

// The same with the ops that start inline through the engine's coroutines
// (Engine::run_inline): an all_gather, a broadcast and a barrier whose
// peer is late hand over to the engine and complete correctly.
TEST(Inline, LatePeerHandsOtherCollectivesToTheEngine) {
  auto results = run_job(inline_job(3), [&](Backend& b, int rank) {
    for (int late = 0; late < 3; ++late) {
      b.barrier(kT)->wait();
      const size_t count = 100;
      std::vector<float> in = filled(rank, count), out(3 * count, -1.f), bc(count, -1.f);
      if (rank == late) bc = filled(7, count);
      if (rank == late) std::this_thread::sleep_for(Ms(200));
      const auto t0 = Clock::now();
      WorkPtr g = b.all_gather(in.data(), out.data(), count, DType::kF32, kT);
      WorkPtr c = b.broadcast(bc.data(), count, DType::kF32, late, kT);
      WorkPtr w = b.barrier(kT);
      const auto issued = std::chrono::duration_cast<Ms>(Clock::now() - t0);
      if (rank != late) {
        require(issued < Ms(100), "issuing blocked its caller for " + std::to_string(issued.count()) + " ms");
        require(!g->is_completed(), "the all_gather completed before the late peer joined");
      }
      g->wait();
      c->wait();
      w->wait();
      require_values(
          out, [&](size_t i) { return contribution(static_cast<int>(i / count), i % count); },
          "all_gather with rank " + std::to_string(late) + " late");
      require_values(
          bc, [&](size_t i) { return contribution(7, i); }, "broadcast from late rank " + std::to_string(late));
    }
  });
  expect_all_ok(results);
}

// A one-round broadcast (the mailbox, or one round of the root's in-slot)
// runs its own inline form: the root publishes and is done at once; a rank
// whose root is late hands the op to the engine without blocking. Every
// rank is late once (as the root and as a receiver), then many back to
// back from alternating roots.
TEST(Inline, OneRoundBroadcastWithALateRankCompletes) {
  auto results = run_job(inline_job(3), [&](Backend& b, int rank) {
    // 3 doubles travel in the root's mailbox, 1000 in one round of its in-slot.
    for (size_t count : {size_t{3}, size_t{1000}}) {
      const std::string c = " (" + std::to_string(count) + " doubles)";
      for (int late = 0; late < 3; ++late) {
        for (int root = 0; root < 3; ++root) {
          b.barrier(kT)->wait();
          std::vector<double> v(count, -1.0);
          if (rank == root) {
            for (size_t i = 0; i < count; ++i) v[i] = contribution(root, i) + 100.0 * late;
          }
          if (rank == late) std::this_thread::sleep_for(Ms(150));
          const auto t0 = Clock::now();
          WorkPtr w = b.broadcast(v.data(), v.size(), DType::kF64, root, kT);
          const auto issued = std::chrono::duration_cast<Ms>(Clock::now() - t0);
          require(issued < Ms(100), "issuing blocked its caller for " + std::to_string(issued.count()) + " ms" + c);
          if (rank == root) require(w->is_completed(), "the root of a one-round broadcast did not finish at once" + c);
          w->wait();
          require_values(
              v, [&](size_t i) { return contribution(root, i) + 100.0 * late; },
              "broadcast from root " + std::to_string(root) + " with rank " + std::to_string(late) + " late" + c);
        }
      }
      std::vector<float> x(count);
      for (int i = 0; i < 1000; ++i) {
        const int root = i % 3;
        for (size_t k = 0; k < count; ++k) x[k] = rank == root ? static_cast<float>(i + static_cast<int>(k)) : -1.f;
        b.broadcast(x.data(), count, DType::kF32, root, kT)->wait();
        require_values(
            x, [&](size_t k) { return static_cast<double>(i) + static_cast<double>(k); },
            "back-to-back broadcast " + std::to_string(i) + c);
      }
    }
  });
  expect_all_ok(results);
}

// Two groups with the same members; rank 0 issues A then B, rank 1 B then
// A, each waiting only at the end. Blocking inline ops would deadlock.
TEST(Inline, OppositeGroupOrdersDoNotDeadlock) {
  auto results = run_job(inline_job(2), [&](Backend& b, int rank) {
    auto ga = b.split(0, rank, "a", kT);
    auto gb = b.split(0, rank, "b", kT);
    for (int round = 0; round < 20; ++round) {
      float a = static_cast<float>(rank + 1), c = static_cast<float>(10 * (rank + 1));
      WorkPtr wa, wb;
      if (rank == 0) {
        wa = ga->all_reduce(&a, &a, 1, DType::kF32, ReduceOp::kSum, kT);
        wb = gb->all_reduce(&c, &c, 1, DType::kF32, ReduceOp::kSum, kT);
      } else {
        wb = gb->all_reduce(&c, &c, 1, DType::kF32, ReduceOp::kSum, kT);
        wa = ga->all_reduce(&a, &a, 1, DType::kF32, ReduceOp::kSum, kT);
      }
      wa->wait();
      wb->wait();
      require(a == 3.f && c == 30.f,
              "round " + std::to_string(round) + ": got " + std::to_string(a) + ", " + std::to_string(c));
    }
  });
  expect_all_ok(results);
}

// The victim dies instead of joining a small collective (rank 0 issues an
// all_reduce, rank 1 an all_gather: both inline forms); the others fail
// within the deadline with an error naming it.
TEST(Inline, DeadPeerIsNamed) {
  const Ms deadline(5000);
  auto results = run_job(inline_job(3), [&](Backend& b, int rank) {
    float x = 1.f;
    b.all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum, kT)->wait();
    b.barrier(kT)->wait();
    if (rank == 2) {
      std::this_thread::sleep_for(Ms(20));
      ::raise(SIGKILL);
    }
    const Failure f = failure_of(
        [&] {
          if (rank == 0) {
            b.all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum, deadline)->wait();
          } else {
            std::vector<float> out(3);
            b.all_gather(&x, out.data(), 1, DType::kF32, deadline)->wait();  // an engine-coroutine op
          }
        },
        "a collective with a dead peer succeeded");
    require(!f.invalid, "a dead peer reported as bad input: " + f.message);
    require(f.took <= deadline + Ms(2000), "failed only after " + std::to_string(f.took.count()) + " ms: " + f.message);
    require(contains(f.message, "world rank 2"), "the error does not name the dead peer: " + f.message);
  });
  expect_victim_died(results, 2);
}

// A root that never waits for the others (a one-round broadcast) must not
// reuse a mailbox that a slower peer has not read yet: all_reduce,
// broadcast, all_reduce over and over, on more ranks than cores so that a
// rank is often preempted between seeing a mailbox's round and reading its
// data. Every result is checked.
// Inline and through the engine (spin 0).
TEST(Inline, RootRunningAheadDoesNotOverwriteUnreadMailboxes) {
  for (size_t spin_us : {10, 0}) {
    SCOPED_TRACE("inline spin " + std::to_string(spin_us) + " us");
    auto results = run_job(inline_job(4, spin_us), [&](Backend& b, int rank) {
      for (int i = 0; i < 3000; ++i) {
        double x = rank + i, total = 0;
        for (int q = 0; q < 4; ++q) total += q + i;
        b.all_reduce(&x, &x, 1, DType::kF64, ReduceOp::kSum, kT)->wait();
        require(x == total, "first all_reduce of iteration " + std::to_string(i) + ": " + std::to_string(x));
        double v = rank == 0 ? 1000.0 + i : -1.0;
        b.broadcast(&v, 1, DType::kF64, 0, kT)->wait();
        require(v == 1000.0 + i, "broadcast of iteration " + std::to_string(i));
        double y = 2.0 * (rank + i);
        b.all_reduce(&y, &y, 1, DType::kF64, ReduceOp::kSum, kT)->wait();
        require(y == 2 * total, "second all_reduce of iteration " + std::to_string(i) + ": " + std::to_string(y));
      }
    });
    expect_all_ok(results);
  }
}

// An inline Work carries the op's description and sequence number, which
// go on counting across inline and engine ops.
TEST(Inline, WorkDescribesTheOp) {
  auto results = run_job(inline_job(2), [&](Backend& b, int) {
    float x[5] = {1, 2, 3, 4, 5};
    WorkPtr w1 = b.all_reduce(x, x, 5, DType::kF32, ReduceOp::kSum, kT);
    w1->wait();
    WorkPtr w2 = b.barrier(kT);
    w2->wait();
    WorkPtr w3 = b.all_reduce(x, x, 5, DType::kF32, ReduceOp::kSum, kT);
    w3->wait();
    const WorkInfo& i = w3->info();
    require(i.op == OpType::kAllReduce && i.sizes == std::vector<int64_t>{5} && i.dtype == DType::kF32 &&
                i.group == "world",
            "info: " + i.describe());
    require(w2->info().seq == w1->info().seq + 1 && i.seq == w1->info().seq + 2,
            "sequence numbers " + std::to_string(w1->info().seq) + ", " + std::to_string(w2->info().seq) + ", " +
                std::to_string(i.seq));
    require(w3->succeeded() && w3->exception() == nullptr, "a completed inline op reports success");
    require(x[4] == 20.f, "result");
  });
  expect_all_ok(results);
}

}  // namespace
}  // namespace torus::comm::ofi::test
