// The neuron comm backend on the fake runtime, on several ranks (mpirun):
// every op, dtype, reduce op and size the capability query accepts, with
// buffers in Neuron device memory at any offset, against the closed forms of
// the backend conformance suite (tests/backend/backend_fixture.h); the
// refusals of everything it does not accept; split; and, under the fake's
// fault switches (tests.cmake), a collective that never completes and a
// peer whose device dies.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "backend/backend_fixture.h"
#include "device_buffers.h"
#include "torus/core/error.h"
#include "torus/device/device.h"

namespace torus::comm::test {
namespace {

const DType kNeuronTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8};
const ReduceOp kNeuronOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};

class NeuronCollectives : public testing::TestWithParam<DType> {};

TEST_P(NeuronCollectives, AllReduce) {
  Backend& w = world();
  const DType t = GetParam();
  for (ReduceOp op : kNeuronOps) {
    ASSERT_TRUE(w.supports(OpType::kAllReduce, t, op));
    for (size_t n : kCounts) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(case_name(t, n, in_place, std::string(reduce_op_name(op))));
        Buf host(t, n);
        for (size_t i = 0; i < n; ++i) host.set(i, input(op, w.rank(), i));
        DevBuf in(t, n), out(t, n);
        in.upload(host);
        out.upload(Buf(t, n, kSentinel));
        void* dst = in_place ? in.mem.data() : out.mem.data();
        wait_ok(w.all_reduce(in.mem.data(), dst, n, t, op, op_timeout()), "all_reduce");
        Buf got = in_place ? in.download() : out.download();
        expect_values(got, 0, n, [&](size_t i) { return expected_reduce(op, t, w.size(), i); }, "all_reduce");
      }
    }
  }
}

TEST_P(NeuronCollectives, ReduceScatter) {
  Backend& w = world();
  const DType t = GetParam();
  const size_t p = static_cast<size_t>(w.size());
  for (ReduceOp op : kNeuronOps) {
    for (size_t n : kCounts) {
      if (n > 1031) continue;  // p * n elements: the large case is covered by all_reduce
      SCOPED_TRACE(case_name(t, n, false, std::string(reduce_op_name(op))));
      // Block r of every rank's input holds input(op, rank, r*n + i).
      Buf host(t, p * n);
      for (size_t i = 0; i < p * n; ++i) host.set(i, input(op, w.rank(), i));
      DevBuf in(t, p * n), out(t, n);
      in.upload(host);
      wait_ok(w.reduce_scatter(in.mem.data(), out.mem.data(), n, t, op, op_timeout()), "reduce_scatter");
      const size_t base = static_cast<size_t>(w.rank()) * n;
      expect_values(out.download(), 0, n, [&](size_t i) { return expected_reduce(op, t, w.size(), base + i); },
                    "reduce_scatter");
    }
  }
}

TEST_P(NeuronCollectives, AllGather) {
  Backend& w = world();
  const DType t = GetParam();
  const size_t p = static_cast<size_t>(w.size());
  for (size_t n : kCounts) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(case_name(t, n, in_place));
      Buf host(t, n);
      for (size_t i = 0; i < n; ++i) host.set(i, value(w.rank(), i));
      DevBuf out(t, p * n), in(t, n);
      out.upload(Buf(t, p * n, kSentinel));
      void* src = in.mem.data();
      if (in_place) {
        src = out.at(static_cast<size_t>(w.rank()) * n);
        dev().copy(src, host.data(), n * dtype_size(t));
      } else {
        in.upload(host);
      }
      wait_ok(w.all_gather(src, out.mem.data(), n, t, op_timeout()), "all_gather");
      Buf got = out.download();
      for (size_t r = 0; r < p; ++r) {
        expect_values(got, r * n, n, [&](size_t i) { return value(static_cast<int>(r), i); }, "all_gather");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Neuron, NeuronCollectives, testing::ValuesIn(kNeuronTypes), DTypeName());

TEST(NeuronBackend, WorksOnSubRangesOfAnAllocation) {
  // Elements [5, 5 + n) of a larger buffer: the backend hands the runtime a
  // slice of the allocation's tensor; the elements around it stay untouched.
  Backend& w = world();
  const size_t n = 100;
  DevBuf buf(DType::kF32, n + 10);
  Buf host(DType::kF32, n + 10, kSentinel);
  for (size_t i = 0; i < n; ++i) host.set(5 + i, value(w.rank(), i));
  buf.upload(host);
  wait_ok(w.all_reduce(buf.at(5), buf.at(5), n, DType::kF32, ReduceOp::kSum, op_timeout()), "all_reduce");
  Buf got = buf.download();
  expect_values(got, 0, 5, [](size_t) { return kSentinel; }, "before");
  expect_values(got, 5, n, [&](size_t i) { return expected_reduce(ReduceOp::kSum, DType::kF32, w.size(), i); },
                "inside");
  expect_values(got, 5 + n, 5, [](size_t) { return kSentinel; }, "after");
}

TEST(NeuronBackend, BarrierAndSplit) {
  Backend& w = world();
  wait_ok(w.barrier(op_timeout()), "barrier");
  // Even and odd ranks, ordered by descending rank.
  BackendPtr sub = w.split(w.rank() % 2, -w.rank(), "parity", op_timeout());
  ASSERT_NE(sub, nullptr);
  int members = (w.size() + 1 - w.rank() % 2) / 2;
  EXPECT_EQ(sub->size(), members);
  EXPECT_EQ(sub->group().name, "parity");
  EXPECT_EQ(sub->group().global_ranks[static_cast<size_t>(sub->rank())], w.rank());
  EXPECT_GT(sub->group().global_ranks.front(), sub->group().global_ranks.back() - 1);
  DevBuf b(DType::kI32, 1);
  Buf h(DType::kI32, 1, w.rank());
  b.upload(h);
  wait_ok(sub->all_reduce(b.mem.data(), b.mem.data(), 1, DType::kI32, ReduceOp::kSum, op_timeout()), "sub");
  double want = 0;
  for (int r = w.rank() % 2; r < w.size(); r += 2) want += r;
  EXPECT_EQ(b.download().get(0), want);
  EXPECT_EQ(w.split(-1, 0, "none", op_timeout()), nullptr);
}

TEST(NeuronBackend, RefusesWhatTheRuntimeDoesNotOffer) {
  Backend& w = world();
  EXPECT_EQ(w.name(), "neuron");
  EXPECT_EQ(w.device_type(), DeviceType::kNeuron);
  DevBuf b(DType::kF32, 8);
  size_t counts[8] = {};
  auto unsupported = [](const std::function<void()>& fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << what << " was accepted";
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find("Neuron runtime 2.99.0.0"), std::string::npos) << e.what();
    }
  };
  unsupported([&] { w.broadcast(b.mem.data(), 8, DType::kF32, 0, op_timeout()); }, "broadcast");
  unsupported([&] { w.reduce(b.mem.data(), b.mem.data(), 8, DType::kF32, ReduceOp::kSum, 0, op_timeout()); },
              "reduce");
  unsupported([&] {
    w.all_to_all(b.mem.data(), b.at(4), std::span<const size_t>(counts, static_cast<size_t>(w.size())),
                 std::span<const size_t>(counts, static_cast<size_t>(w.size())), DType::kF32, op_timeout());
  }, "all_to_all");
  unsupported([&] { w.send(b.mem.data(), 1, DType::kF32, 0, 0, op_timeout()); }, "send");
  unsupported([&] { w.recv(b.mem.data(), 1, DType::kF32, 0, 0, op_timeout()); }, "recv");
  unsupported([&] { w.all_reduce(b.mem.data(), b.mem.data(), 1, DType::kF64, ReduceOp::kSum, op_timeout()); },
              "f64");
  unsupported([&] { w.all_reduce(b.mem.data(), b.mem.data(), 1, DType::kF32, ReduceOp::kProd, op_timeout()); },
              "prod");
  unsupported([&] { w.all_reduce(b.mem.data(), b.mem.data(), 1, DType::kF32, ReduceOp::kAvg, op_timeout()); },
              "avg");
  for (OpType op : {OpType::kBroadcast, OpType::kReduce, OpType::kAllToAll, OpType::kSend, OpType::kRecv}) {
    EXPECT_FALSE(w.supports(op, DType::kF32)) << op_type_name(op);
  }
  EXPECT_FALSE(w.supports(OpType::kAllReduce, DType::kF64));
  EXPECT_FALSE(w.supports(OpType::kAllReduce, DType::kF32, ReduceOp::kProd));
  // Host memory is refused before anything is issued.
  std::vector<float> host(8);
  EXPECT_THROW(w.all_reduce(host.data(), host.data(), 8, DType::kF32, ReduceOp::kSum, op_timeout()),
               InvalidArgument);
  // Past the end of the allocation.
  EXPECT_THROW(w.all_reduce(b.mem.data(), b.mem.data(), 9, DType::kF32, ReduceOp::kSum, op_timeout()),
               InvalidArgument);
  EXPECT_THROW(w.all_reduce(b.mem.data(), b.mem.data(), 1, DType::kF32, ReduceOp::kSum, Duration(0)),
               InvalidArgument);
  // The group is still healthy after the refusals.
  wait_ok(w.barrier(op_timeout()), "barrier after refusals");
}

// --- faults (tests.cmake runs these with the fake's fault switches) ----------------

long long env_num(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoll(v) : -1;
}

// Issues an f32 all_reduce of `bytes` input bytes on a fresh group and
// returns the failure message, checking that it came within the deadline.
template <typename Error>
std::string expect_failure(size_t bytes) {
  Backend& w = world();
  BackendPtr g = w.split(0, w.rank(), "faulty", op_timeout());
  size_t n = bytes / sizeof(float);
  DevBuf b(DType::kF32, n);
  auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    g->all_reduce(b.mem.data(), b.mem.data(), n, DType::kF32, ReduceOp::kSum, fault_timeout())->wait();
    ADD_FAILURE() << "the faulty op completed";
  } catch (const Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected error type: " << e.what();
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, fault_timeout() + fault_margin());
  // The group stays broken: the next op fails at once with CommError.
  auto later = g->all_reduce(b.mem.data(), b.mem.data(), 1, DType::kF32, ReduceOp::kSum, op_timeout());
  try {
    later->wait();
    ADD_FAILURE() << "an op on the broken group completed";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce seq 2 on group 'faulty'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is broken"), std::string::npos) << e.what();
  }
  return message;
}

TEST(NeuronFaults, ACollectiveThatNeverCompletesTimesOut) {
  long long bytes = env_num("TORUS_TEST_FAKE_NRT_HANG_BYTES");
  ASSERT_GE(bytes, 0) << "selected by tests.cmake with TORUS_TEST_FAKE_NRT_HANG_BYTES";
  std::string m = expect_failure<TimeoutError>(static_cast<size_t>(bytes));
  EXPECT_NE(m.find("all_reduce seq 1 on group 'faulty' (rank " + std::to_string(world().rank())), std::string::npos)
      << m;
}

TEST(NeuronFaults, ADeadPeerEndsInErrorsOnEveryRank) {
  long long bytes = env_num("TORUS_TEST_FAKE_NRT_DEAD_BYTES");
  long long dead = env_num("TORUS_TEST_FAKE_NRT_DEAD_RANK");
  ASSERT_TRUE(bytes >= 0 && dead >= 0) << "selected by tests.cmake with TORUS_TEST_FAKE_NRT_DEAD_RANK/_BYTES";
  if (world().rank() == dead) {
    std::string m = expect_failure<CommError>(static_cast<size_t>(bytes));
    EXPECT_NE(m.find("NRT_HW_ERROR"), std::string::npos) << m;
    EXPECT_NE(m.find("group 'faulty'"), std::string::npos) << m;
  } else {
    std::string m = expect_failure<TimeoutError>(static_cast<size_t>(bytes));
    EXPECT_NE(m.find("all_reduce seq 1 on group 'faulty'"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace torus::comm::test
