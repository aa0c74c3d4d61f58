// Conformance: the collectives of every dtype, reduce op and count, in place
// and out of place, on the world group (all_to_all and point to point have
// their own files).
#include <thread>

#include "backend_fixture.h"

namespace torus::comm::test {
namespace {

class Collectives : public testing::TestWithParam<DType> {};

std::function<double(size_t)> reduced(ReduceOp op, DType t, int n, size_t offset = 0) {
  return [=](size_t i) { return expected_reduce(op, t, n, offset + i); };
}
std::function<double(size_t)> reduce_tol(ReduceOp op, DType t, int n, size_t offset = 0) {
  return [=](size_t i) { return tolerance(t, op, expected_reduce(op, t, n, offset + i)); };
}

TEST_P(Collectives, AllReduce) {
  Backend& b = world();
  const DType t = GetParam();
  const int n = b.size(), me = b.rank();
  for (ReduceOp op : kAllReduceOps) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        std::string what = "all_reduce " + case_name(t, count, in_place, std::string(reduce_op_name(op)));
        Buf in(t, count);
        for (size_t i = 0; i < count; ++i) in.set(i, input(op, me, i));
        Buf out(t, in_place ? 0 : count, kSentinel);
        Buf& dst = in_place ? in : out;
        wait_ok(b.all_reduce(in.data(), dst.data(), count, t, op, op_timeout()), what);
        expect_values(dst, 0, count, reduced(op, t, n), what, reduce_tol(op, t, n));
      }
    }
  }
}

TEST_P(Collectives, ReduceScatter) {
  Backend& b = world();
  const DType t = GetParam();
  const int n = b.size(), me = b.rank();
  for (ReduceOp op : kAllReduceOps) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        std::string what = "reduce_scatter " + case_name(t, count, in_place, std::string(reduce_op_name(op)));
        const size_t total = count * static_cast<size_t>(n), mine = count * static_cast<size_t>(me);
        Buf in(t, total);
        for (size_t i = 0; i < total; ++i) in.set(i, input(op, me, i));
        Buf out(t, in_place ? 0 : count, kSentinel);
        void* dst = in_place ? static_cast<void*>(in.at(mine)) : out.data();
        wait_ok(b.reduce_scatter(in.data(), dst, count, t, op, op_timeout()), what);
        // Rank r's block is the reduction of every rank's block r.
        expect_values(in_place ? in : out, in_place ? mine : 0, count, reduced(op, t, n, mine), what,
                      reduce_tol(op, t, n, mine));
      }
    }
  }
}

TEST_P(Collectives, AllGather) {
  Backend& b = world();
  const DType t = GetParam();
  const int n = b.size(), me = b.rank();
  for (size_t count : kCounts) {
    for (bool in_place : {false, true}) {
      std::string what = "all_gather " + case_name(t, count, in_place);
      Buf out(t, count * static_cast<size_t>(n), kSentinel);
      Buf in(t, in_place ? 0 : count);
      Buf& src = in_place ? out : in;
      const size_t src_offset = in_place ? count * static_cast<size_t>(me) : 0;
      for (size_t i = 0; i < count; ++i) src.set(src_offset + i, value(me, i));
      wait_ok(b.all_gather(src.at(src_offset), out.data(), count, t, op_timeout()), what);
      expect_values(
          out, 0, out.size(), [&](size_t i) { return value(static_cast<int>(i / count), i % count); }, what);
    }
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  Backend& b = world();
  const DType t = GetParam();
  const int n = b.size(), me = b.rank();
  for (int root = 0; root < n; ++root) {
    for (size_t count : kCounts) {
      std::string what = "broadcast root " + std::to_string(root) + " " + case_name(t, count, true);
      Buf buf(t, count, kSentinel);
      if (me == root) {
        for (size_t i = 0; i < count; ++i) buf.set(i, value(root, i));
      }
      wait_ok(b.broadcast(buf.data(), count, t, root, op_timeout()), what);
      expect_values(
          buf, 0, count, [&](size_t i) { return value(root, i); }, what);
    }
  }
}

TEST_P(Collectives, ReduceToEveryRoot) {
  Backend& b = world();
  const DType t = GetParam();
  const int n = b.size(), me = b.rank();
  for (int root = 0; root < n; ++root) {
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : kCounts) {
        for (bool in_place : {false, true}) {
          std::string what = "reduce root " + std::to_string(root) + " " +
                             case_name(t, count, in_place, std::string(reduce_op_name(op)));
          Buf in(t, count);
          for (size_t i = 0; i < count; ++i) in.set(i, input(op, me, i));
          Buf out(t, in_place ? 0 : count, kSentinel);
          // Non-roots may pass a null output; do so for one count.
          void* dst = in_place ? in.data() : (me != root && count == 7 ? nullptr : out.data());
          wait_ok(b.reduce(in.data(), dst, count, t, op, root, op_timeout()), what);
          if (me == root) {
            expect_values(in_place ? in : out, 0, count, reduced(op, t, n), what, reduce_tol(op, t, n));
          } else if (in_place) {
            expect_values(
                in, 0, count, [&](size_t i) { return input(op, me, i); }, what + " (non-root untouched)");
          } else {
            expect_values(
                out, 0, out.size(), [](size_t) { return kSentinel; }, what + " (non-root untouched)");
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, Collectives, testing::ValuesIn(kAllDTypes), DTypeName());

TEST(CollectivesMisc, BarrierWaitsForTheLastRank) {
  Backend& b = world();
  wait_ok(b.barrier(op_timeout()), "first barrier");
  constexpr auto kDelay = std::chrono::milliseconds(600);
  if (b.rank() == 0) std::this_thread::sleep_for(kDelay);
  auto t0 = std::chrono::steady_clock::now();
  wait_ok(b.barrier(op_timeout()), "second barrier");
  auto waited = std::chrono::steady_clock::now() - t0;
  if (b.rank() != 0) EXPECT_GE(waited, kDelay / 2) << "the barrier did not wait for rank 0";
}

TEST(CollectivesMisc, ManyOpsInFlight) {
  Backend& b = world();
  const int n = b.size(), me = b.rank();
  constexpr int kOps = 16;
  constexpr size_t kCount = 1031;
  std::vector<Buf> bufs;
  for (int k = 0; k < kOps; ++k) {
    bufs.emplace_back(DType::kF32, kCount);
    for (size_t i = 0; i < kCount; ++i) bufs.back().set(i, value(me, i) + k);
  }
  Buf gathered(DType::kI64, kCount * static_cast<size_t>(n), kSentinel);
  Buf mine(DType::kI64, kCount);
  for (size_t i = 0; i < kCount; ++i) mine.set(i, value(me, i));
  Buf bcast(DType::kBF16, kCount, kSentinel);
  if (me == n - 1) {
    for (size_t i = 0; i < kCount; ++i) bcast.set(i, value(n - 1, i));
  }

  std::vector<WorkPtr> works;
  for (int k = 0; k < kOps / 2; ++k)
    works.push_back(b.all_reduce(bufs[k].data(), bufs[k].data(), kCount, DType::kF32, ReduceOp::kSum, op_timeout()));
  works.push_back(b.all_gather(mine.data(), gathered.data(), kCount, DType::kI64, op_timeout()));
  works.push_back(b.broadcast(bcast.data(), kCount, DType::kBF16, n - 1, op_timeout()));
  for (int k = kOps / 2; k < kOps; ++k)
    works.push_back(b.all_reduce(bufs[k].data(), bufs[k].data(), kCount, DType::kF32, ReduceOp::kSum, op_timeout()));
  for (auto it = works.rbegin(); it != works.rend(); ++it) wait_ok(*it, (*it)->info().describe());

  for (int k = 0; k < kOps; ++k) {
    expect_values(
        bufs[k], 0, kCount, [&](size_t i) { return expected_reduce(ReduceOp::kSum, DType::kF32, n, i) + n * k; },
        "all_reduce " + std::to_string(k));
  }
  expect_values(
      gathered, 0, gathered.size(), [&](size_t i) { return value(static_cast<int>(i / kCount), i % kCount); },
      "all_gather");
  expect_values(
      bcast, 0, kCount, [&](size_t i) { return value(n - 1, i); }, "broadcast");
}

TEST(CollectivesMisc, WorkInfoDescribesTheOp) {
  Backend& b = world();
  Buf x(DType::kF32, 5, 1);
  WorkPtr w1 = b.all_reduce(x.data(), x.data(), 5, DType::kF32, ReduceOp::kMax, op_timeout());
  WorkPtr w2 = b.barrier(op_timeout());
  wait_ok(w1, "all_reduce");
  wait_ok(w2, "barrier");
  EXPECT_TRUE(w1->is_completed());
  EXPECT_TRUE(w1->succeeded());
  EXPECT_EQ(w1->info().op, OpType::kAllReduce);
  EXPECT_EQ(w1->info().group, b.group().name);
  EXPECT_EQ(w1->info().rank, b.rank());
  EXPECT_EQ(w1->info().group_size, b.size());
  EXPECT_EQ(w1->info().dtype, DType::kF32);
  EXPECT_GE(w1->info().seq, 1u);
  EXPECT_EQ(w2->info().seq, w1->info().seq + 1);
  EXPECT_EQ(w2->info().op, OpType::kBarrier);
  EXPECT_NE(w1->info().describe().find("all_reduce"), std::string::npos);
}

TEST(CollectivesMisc, SupportsEverythingItServes) {
  Backend& b = world();
  EXPECT_EQ(b.name(), backend_name());
  EXPECT_EQ(b.device_type(), DeviceType::kCPU);
  EXPECT_EQ(b.group().global_ranks.size(), static_cast<size_t>(b.size()));
  for (int r = 0; r < b.size(); ++r) EXPECT_EQ(b.group().global_ranks[static_cast<size_t>(r)], r) << "world group";
  // DESIGN.md: host backends serve every op, dtype and reduce op.
  for (OpType op : kAllOpTypes) {
    for (DType t : kAllDTypes) {
      for (ReduceOp r : kAllReduceOps) {
        EXPECT_TRUE(b.supports(op, t, r)) << op_type_name(op) << " " << dtype_name(t) << " " << reduce_op_name(r);
      }
    }
  }
}

}  // namespace
}  // namespace torus::comm::test
