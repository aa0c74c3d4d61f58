// The nccl backend on real GPUs: every collective with closed-form results
// (every dtype and reduce op for all_reduce), in place and out of place,
// uneven all_to_all, grouped send/recv, barrier, stream ordering against the
// caller's stream, host-blocking waits, buffer release, split and abort.
// Ranks are threads, one per visible GPU (a single GPU gives a world of one).
// Without a GPU only the no-device errors are checked; the rest skips with
// the reason.
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

#include "device/gpu_test_util.h"
#include "nccl/nccl_test_util.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

using namespace std::chrono_literals;
using testing::Backends;
using testing::cuda;
using testing::decode;
using testing::download;
using testing::encode;
using testing::on_ranks;
using testing::upload;

constexpr Duration kTimeout = 120s;

TEST(NcclNoGpu, FailsClearly) {
  EXPECT_THROW(create_nccl_world_backend(BackendInit{}), InvalidArgument);
  if (cuda().count() > 0) GTEST_SKIP() << "a GPU is present: " << cuda().describe();
  NcclInit init;
  init.store = std::make_shared<testing::MemoryStore>();
  init.store_prefix = "t";
  init.timeout = 1s;
  try {
    create_nccl_backend(init);
    FAIL() << "must throw without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    TORUS_REQUIRE_ACCELERATOR();
    n_ = testing::nccl_test_ranks();
    world_ = testing::make_world(n_, std::string("test/") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { testing::destroy_world(world_); }
  NcclBackend& b(int r) { return *world_[static_cast<size_t>(r)]; }

  int n_ = 0;
  Backends world_;
};

// What all_reduce must produce at element i when rank q contributes
// (q + 1) + i % 3, with the dtype's own integer semantics.
double expected_reduce(ReduceOp op, DType t, int n, size_t i) {
  double base = static_cast<double>(i % 3);
  double sum = 0, prod = 1, mx = -1e300, mn = 1e300;
  uint64_t prod_u8 = 1;
  for (int q = 0; q < n; ++q) {
    double v = q + 1 + base;
    sum += v;
    prod *= v;
    prod_u8 = (prod_u8 * static_cast<uint64_t>(v)) & 0xff;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  switch (op) {
    case ReduceOp::kSum: return t == DType::kU8 ? static_cast<double>(static_cast<uint64_t>(sum) & 0xff) : sum;
    case ReduceOp::kAvg: return dtype_is_floating(t) ? sum / n : std::trunc(sum / n);
    case ReduceOp::kMax: return mx;
    case ReduceOp::kMin: return mn;
    case ReduceOp::kProd: return t == DType::kU8 ? static_cast<double>(prod_u8) : prod;
  }
  return 0;
}

double tolerance(DType t, double want) {
  switch (t) {
    // Products round once per rank (up to 7 roundings with 8 GPUs); averages
    // of non-power-of-two rank counts multiply by an inexact 1/n.
    case DType::kBF16: return 3e-2 * std::fabs(want);
    case DType::kF16: return 5e-3 * std::fabs(want);
    case DType::kF32: return 1e-6 * std::fabs(want);
    case DType::kF64: return 1e-12 * std::fabs(want);
    default: return 0;
  }
}

TEST_F(Nccl, AllReduceEveryDtypeAndOp) {
  const size_t count = 1003;
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (bool in_place : {false, true}) {
        on_ranks(n_, [&](int r) {
          std::vector<double> x(count);
          for (size_t i = 0; i < count; ++i) x[i] = r + 1 + static_cast<double>(i % 3);
          device::DeviceBuffer in = upload(encode(x, t));
          device::DeviceBuffer out(DeviceType::kCUDA, count * dtype_size(t));
          void* dst = in_place ? in.data() : out.data();
          WorkPtr w = b(r).all_reduce(in.data(), dst, count, t, op, kTimeout);
          w->wait();
          std::vector<double> got = decode(download(dst, count * dtype_size(t)), t);
          for (size_t i = 0; i < count; ++i) {
            double want = expected_reduce(op, t, n_, i);
            ASSERT_NEAR(got[i], want, tolerance(t, want))
                << dtype_name(t) << " " << reduce_op_name(op) << (in_place ? " in place" : "") << " rank " << r
                << " element " << i;
          }
        });
        if (HasFailure()) return;
      }
    }
  }
}

TEST_F(Nccl, ReduceScatterAndAllGather) {
  const size_t count = 4099;
  const int n = n_;
  on_ranks(n, [&](int r) {
    // reduce_scatter: block q of rank s holds s*100 + q*10 + i%5; rank r gets sum over s of block r.
    std::vector<double> x(count * static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; ++i) x[static_cast<size_t>(q) * count + i] = r * 100 + q * 10 + static_cast<double>(i % 5);
    }
    device::DeviceBuffer in = upload(encode(x, DType::kI64));
    device::DeviceBuffer out(DeviceType::kCUDA, count * 8);
    b(r).reduce_scatter(in.data(), out.data(), count, DType::kI64, ReduceOp::kSum, kTimeout)->wait();
    std::vector<double> got = decode(download(out.data(), count * 8), DType::kI64);
    for (size_t i = 0; i < count; ++i) {
      double want = 100.0 * n * (n - 1) / 2 + n * (r * 10 + static_cast<double>(i % 5));
      ASSERT_EQ(got[i], want) << "reduce_scatter rank " << r << " element " << i;
    }
    // all_gather in place: this rank's block already sits at offset r in out.
    std::vector<double> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = r * 1000 + static_cast<double>(i % 1000);
    device::DeviceBuffer gathered(DeviceType::kCUDA, count * static_cast<size_t>(n) * 4);
    std::vector<uint8_t> enc = encode(mine, DType::kF32);
    char* slot = gathered.as<char>() + static_cast<size_t>(r) * count * 4;
    cuda().copy(slot, enc.data(), enc.size());
    b(r).all_gather(slot, gathered.data(), count, DType::kF32, kTimeout)->wait();
    std::vector<double> all = decode(download(gathered.data(), count * static_cast<size_t>(n) * 4), DType::kF32);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(all[static_cast<size_t>(q) * count + i], q * 1000 + static_cast<double>(i % 1000))
            << "all_gather rank " << r << " block " << q;
      }
    }
  });
}

TEST_F(Nccl, AllToAllUneven) {
  const int n = n_;
  auto pair_count = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 3 + 1); };
  on_ranks(n, [&](int r) {
    std::vector<size_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    std::vector<double> x;
    for (int q = 0; q < n; ++q) {
      send[static_cast<size_t>(q)] = pair_count(r, q);
      recv[static_cast<size_t>(q)] = pair_count(q, r);
      for (size_t j = 0; j < send[static_cast<size_t>(q)]; ++j) x.push_back(r * 1000 + q * 10 + static_cast<double>(j));
    }
    size_t total_recv = std::accumulate(recv.begin(), recv.end(), size_t{0});
    device::DeviceBuffer in = upload(encode(x, DType::kI32));
    device::DeviceBuffer out(DeviceType::kCUDA, total_recv * 4);
    b(r).all_to_all(in.data(), out.data(), send, recv, DType::kI32, kTimeout)->wait();
    std::vector<double> got = decode(download(out.data(), total_recv * 4), DType::kI32);
    size_t k = 0;
    for (int q = 0; q < n; ++q) {
      for (size_t j = 0; j < recv[static_cast<size_t>(q)]; ++j, ++k) {
        ASSERT_EQ(got[k], q * 1000 + r * 10 + static_cast<double>(j)) << "rank " << r << " from " << q;
      }
    }
  });
}

TEST_F(Nccl, BroadcastAndReduceBf16F16) {
  const size_t count = 777;
  const int n = n_;
  const int root = n - 1;
  on_ranks(n, [&](int r) {
    std::vector<double> x(count, 0.0);
    if (r == root) {
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<double>(i % 100) - 50;
    }
    device::DeviceBuffer buf = upload(encode(x, DType::kBF16));
    b(r).broadcast(buf.data(), count, DType::kBF16, root, kTimeout)->wait();
    std::vector<double> got = decode(download(buf.data(), count * 2), DType::kBF16);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], static_cast<double>(i % 100) - 50) << "broadcast rank " << r;

    std::vector<double> y(count, r + 1);
    device::DeviceBuffer in = upload(encode(y, DType::kF16));
    device::DeviceBuffer out(DeviceType::kCUDA, count * 2);
    void* dst = r == 0 ? out.data() : nullptr;  // the output only matters on the root
    b(r).reduce(in.data(), dst, count, DType::kF16, ReduceOp::kSum, 0, kTimeout)->wait();
    if (r == 0) {
      std::vector<double> sum = decode(download(out.data(), count * 2), DType::kF16);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(sum[i], n * (n + 1) / 2.0) << "reduce element " << i;
    }
  });
}

TEST_F(Nccl, GroupedSendRecvRingAndPairs) {
  const size_t count = 65537;
  const int n = n_;
  on_ranks(n, [&](int r) {
    int next = (r + 1) % n;
    int prev = (r + n - 1) % n;
    std::vector<double> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = r * 10 + static_cast<double>(i % 7);
    device::DeviceBuffer src = upload(encode(x, DType::kF32));
    device::DeviceBuffer dst(DeviceType::kCUDA, count * 4);
    // A ring in one grouped call: with one rank, a send to itself.
    P2POp ops[2] = {{P2POp::Kind::kSend, src.data(), count, DType::kF32, next},
                    {P2POp::Kind::kRecv, dst.data(), count, DType::kF32, prev}};
    b(r).batch_send_recv(ops, kTimeout)->wait();
    std::vector<double> got = decode(download(dst.data(), count * 4), DType::kF32);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], prev * 10 + static_cast<double>(i % 7)) << "ring rank " << r;
    // Single send/recv between pairs (0->1, 2->3, ...).
    if (n >= 2 && (r % 2 == 1 || r + 1 < n)) {
      if (r % 2 == 0) {
        b(r).send(src.data(), count, DType::kF32, r + 1, 0, kTimeout)->wait();
      } else {
        b(r).recv(dst.data(), count, DType::kF32, r - 1, 0, kTimeout)->wait();
        std::vector<double> pair = decode(download(dst.data(), count * 4), DType::kF32);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(pair[i], (r - 1) * 10 + static_cast<double>(i % 7));
      }
    }
    b(r).barrier(kTimeout)->wait();
  });
}

// The comm stream must wait for the work queued before the op on the
// caller's stream, and wait() must order the caller's stream after the op —
// with no host synchronisation in between.
TEST_F(Nccl, OrderedAgainstTheCallersStream) {
  const size_t bytes = size_t{64} << 20;
  const int n = n_;
  on_ranks(n, [&](int r) {
    device::Stream s = cuda().create_stream();
    device::StreamGuard guard(s);
    device::DeviceBuffer buf(DeviceType::kCUDA, bytes);
    device::PinnedBuffer host(DeviceType::kCUDA, 4096);
    for (int round = 0; round < 3; ++round) {
      for (int k = 0; k < 8; ++k) cuda().fill_async(buf.data(), 0, bytes, s);  // keep s busy
      cuda().fill_async(buf.data(), r + 1 + round, bytes, s);
      WorkPtr w = b(r).all_reduce(buf.data(), buf.data(), bytes, DType::kU8, ReduceOp::kMax, kTimeout);
      w->wait();  // s waits on the op's end event; the host does not block
      cuda().copy_async(host.data(), buf.as<char>() + bytes - 4096, 4096, s);
      s.synchronize();
      for (int i = 0; i < 4096; ++i) {
        ASSERT_EQ(host.as<uint8_t>()[i], n + round) << "rank " << r << " round " << round << " byte " << i;
      }
      EXPECT_TRUE(w->is_completed());
    }
  });
}

TEST_F(Nccl, HostWaitAndBufferRelease) {
  const size_t count = size_t{1} << 22;
  on_ranks(n_, [&](int r) {
    device::DeviceBuffer buf(DeviceType::kCUDA, count * 4);
    cuda().fill_async(buf.data(), 0, count * 4, cuda().default_stream(r));
    WorkPtr w = b(r).all_reduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kSum, kTimeout);
    auto sentinel = std::make_shared<int>(r);
    std::weak_ptr<int> alive = sentinel;
    w->keep_alive(std::move(sentinel));
    w->wait(std::chrono::milliseconds(60000));  // host-blocking
    EXPECT_TRUE(w->succeeded());
    EXPECT_TRUE(alive.expired()) << "completing the work releases what it keeps alive";
    EXPECT_EQ(w->info().op, OpType::kAllReduce);
    EXPECT_EQ(w->info().group, "world");
    EXPECT_GT(w->info().seq, 0u);
  });
}

TEST_F(Nccl, SplitByParityInReverseOrder) {
  const int n = n_;
  on_ranks(n, [&](int r) {
    std::shared_ptr<Backend> sub = b(r).split(r % 2, -r, "parity", kTimeout);
    ASSERT_NE(sub, nullptr);
    std::vector<int> members;
    for (int q = n - 1; q >= 0; --q) {
      if (q % 2 == r % 2) members.push_back(q);  // key -q: descending parent rank
    }
    EXPECT_EQ(sub->group().name, "parity");
    EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
    EXPECT_EQ(sub->group().global_ranks, members);
    EXPECT_EQ(sub->group().global_ranks[static_cast<size_t>(sub->rank())], r);
    device::DeviceBuffer one = upload(encode({static_cast<double>(r + 1)}, DType::kI32));
    sub->all_reduce(one.data(), one.data(), 1, DType::kI32, ReduceOp::kSum, kTimeout)->wait();
    double want = 0;
    for (int q : members) want += q + 1;
    EXPECT_EQ(decode(download(one.data(), 4), DType::kI32)[0], want);
    EXPECT_EQ(b(r).split(-1, 0, "none", kTimeout), nullptr);
    sub.reset();  // finalised together with the peers of this thread's group
  });
}

TEST_F(Nccl, AbortBreaksTheGroup) {
  std::barrier all_done(n_);
  on_ranks(n_, [&](int r) {
    device::DeviceBuffer buf(DeviceType::kCUDA, 1024);
    b(r).all_reduce(buf.data(), buf.data(), 256, DType::kF32, ReduceOp::kSum, kTimeout)->wait(std::chrono::milliseconds(60000));
    all_done.arrive_and_wait();  // nobody aborts while a peer may still be in the op
    b(r).abort("test abort");
    b(r).abort("twice is fine");
    EXPECT_TRUE(b(r).broken());
    try {
      b(r).all_reduce(buf.data(), buf.data(), 256, DType::kF32, ReduceOp::kSum, kTimeout);
      ADD_FAILURE() << "an op on a broken group must throw";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
    }
  });
}

TEST_F(Nccl, RejectsBadArgumentsBeforeCommunicating) {
  device::DeviceBuffer buf(DeviceType::kCUDA, 64);
  NcclBackend& r0 = b(0);
  EXPECT_THROW(r0.all_reduce(buf.data(), buf.data(), 4, DType::kF32, ReduceOp::kSum, Duration(0)), InvalidArgument);
  EXPECT_THROW(r0.broadcast(buf.data(), 4, DType::kF32, n_, kTimeout), InvalidArgument);
  EXPECT_THROW(r0.send(buf.data(), 4, DType::kF32, 0, 0, kTimeout), InvalidArgument);
  EXPECT_THROW(r0.recv(buf.data(), 4, DType::kF32, 0, -1, kTimeout), InvalidArgument);
  EXPECT_THROW(r0.all_reduce(nullptr, buf.data(), 4, DType::kF32, ReduceOp::kSum, kTimeout), InvalidArgument);
  std::vector<size_t> wrong(static_cast<size_t>(n_) + 1, 1);
  EXPECT_THROW(r0.all_to_all(buf.data(), buf.data(), wrong, wrong, DType::kF32, kTimeout), InvalidArgument);
  EXPECT_TRUE(r0.supports(OpType::kAllReduce, DType::kBF16, ReduceOp::kAvg));
  EXPECT_EQ(r0.name(), "nccl");
  EXPECT_EQ(r0.device_type(), DeviceType::kCUDA);
  EXPECT_FALSE(r0.broken());
}

}  // namespace
}  // namespace torus::comm
