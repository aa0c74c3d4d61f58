// The ofi backend on Neuron device memory (a world made as "ofi-neuron",
// Note [Device buffers] in src/comm/ofi/device_ops.cpp), on several ranks
// over the fake runtime: every op, dtype and reduce op — including those the
// runtime's own collectives lack (broadcast, reduce, all-to-all, send/recv,
// f64, product, average) — with buffers at offsets inside larger
// allocations, against the conformance suite's closed forms
// (tests/backend/backend_fixture.h); host memory and short buffers refused
// before anything is sent; and whether point to point moved the bytes
// through host memory or handed the device buffer to the provider.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend_fixture.h"
#include "device_buffers.h"
#include "torus/core/error.h"

namespace torus::comm::test {
namespace {

const DType kAllTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                           DType::kI32, DType::kI64, DType::kU8};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg};
constexpr size_t kPad = 3;  // elements before every buffer: the ops see pointers inside an allocation

// n elements at offset kPad of a Neuron allocation of n + 2 kPad, the pads
// holding the sentinel (checked untouched by expect_pads).
struct Padded {
  Padded(DType t, size_t n) : n(n), buf(t, n + 2 * kPad) { buf.upload(Buf(t, n + 2 * kPad, kSentinel)); }
  char* data() const { return buf.at(kPad); }
  void upload(const Buf& host) { dev().copy(data(), host.data(), n * dtype_size(buf.dtype)); }
  Buf download() const { return buf.download(); }  // with the pads: element i is at kPad + i
  size_t n;
  DevBuf buf;
};

void expect_pads(const Buf& got, size_t n, const std::string& what) {
  expect_values(got, 0, kPad, [](size_t) { return kSentinel; }, what + " (before)");
  expect_values(got, kPad + n, kPad, [](size_t) { return kSentinel; }, what + " (after)");
}

Buf inputs(DType t, ReduceOp op, int rank, size_t n, size_t first = 0) {
  Buf h(t, n);
  for (size_t i = 0; i < n; ++i) h.set(i, input(op, rank, first + i));
  return h;
}

class OfiNeuronOps : public testing::TestWithParam<DType> {};

TEST_P(OfiNeuronOps, AllReduce) {
  Backend& w = world();
  const DType t = GetParam();
  for (ReduceOp op : kAllOps) {
    for (size_t n : kCounts) {
      if (n > 1031 && op != ReduceOp::kSum) continue;  // the large case once per dtype
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(case_name(t, n, in_place, std::string(reduce_op_name(op))));
        Padded in(t, n), out(t, n);
        in.upload(inputs(t, op, w.rank(), n));
        Padded& dst = in_place ? in : out;
        wait_ok(w.all_reduce(in.data(), dst.data(), n, t, op, op_timeout()), "all_reduce");
        Buf got = dst.download();
        expect_values(got, kPad, n, [&](size_t i) { return expected_reduce(op, t, w.size(), i); }, "all_reduce",
                      [&](size_t i) { return tolerance(t, op, expected_reduce(op, t, w.size(), i)); });
        expect_pads(got, n, "all_reduce");
      }
    }
  }
}

TEST_P(OfiNeuronOps, ReduceScatterAndReduce) {
  Backend& w = world();
  const DType t = GetParam();
  const size_t p = static_cast<size_t>(w.size());
  for (ReduceOp op : kAllOps) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1031}}) {
      SCOPED_TRACE(case_name(t, n, false, std::string(reduce_op_name(op))));
      auto want = [&](size_t i) { return expected_reduce(op, t, w.size(), i); };
      auto tol = [&](size_t i) { return tolerance(t, op, want(i)); };
      Padded in(t, p * n), out(t, n);
      in.upload(inputs(t, op, w.rank(), p * n));
      wait_ok(w.reduce_scatter(in.data(), out.data(), n, t, op, op_timeout()), "reduce_scatter");
      const size_t base = static_cast<size_t>(w.rank()) * n;
      Buf got = out.download();
      expect_values(got, kPad, n, [&](size_t i) { return want(base + i); }, "reduce_scatter",
                    [&](size_t i) { return tol(base + i); });
      expect_pads(got, n, "reduce_scatter");
      for (int root : {0, w.size() - 1}) {
        Padded rin(t, n), rout(t, n);
        rin.upload(inputs(t, op, w.rank(), n));
        wait_ok(w.reduce(rin.data(), rout.data(), n, t, op, root, op_timeout()), "reduce");
        Buf r = rout.download();
        if (w.rank() == root) {
          expect_values(r, kPad, n, want, "reduce at the root", tol);
        } else {
          expect_values(r, kPad, n, [](size_t) { return kSentinel; }, "reduce elsewhere: untouched");
        }
        expect_pads(r, n, "reduce");
      }
    }
  }
}

TEST_P(OfiNeuronOps, AllGatherAndBroadcast) {
  Backend& w = world();
  const DType t = GetParam();
  const size_t p = static_cast<size_t>(w.size());
  for (size_t n : kCounts) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(case_name(t, n, in_place));
      Padded out(t, p * n), in(t, n);
      const Buf mine = inputs(t, ReduceOp::kSum, w.rank(), n);
      void* src = in.data();
      if (in_place) {
        src = out.data() + static_cast<size_t>(w.rank()) * n * dtype_size(t);
        dev().copy(src, mine.data(), n * dtype_size(t));
      } else {
        in.upload(mine);
      }
      wait_ok(w.all_gather(src, out.data(), n, t, op_timeout()), "all_gather");
      Buf got = out.download();
      for (size_t r = 0; r < p; ++r) {
        expect_values(got, kPad + r * n, n, [&](size_t i) { return value(static_cast<int>(r), i); }, "all_gather");
      }
      expect_pads(got, p * n, "all_gather");
    }
    for (int root = 0; root < w.size(); ++root) {
      SCOPED_TRACE("broadcast from " + std::to_string(root) + " " + case_name(t, n, true));
      Padded b(t, n);
      if (w.rank() == root) b.upload(inputs(t, ReduceOp::kSum, root, n));
      wait_ok(w.broadcast(b.data(), n, t, root, op_timeout()), "broadcast");
      Buf got = b.download();
      expect_values(got, kPad, n, [&](size_t i) { return value(root, i); }, "broadcast");
      expect_pads(got, n, "broadcast");
    }
  }
}

// Rank s sends count(s, d) elements to rank d, uneven in both directions;
// element e of that block holds value(s, d * 1000 + e).
TEST_P(OfiNeuronOps, AllToAll) {
  Backend& w = world();
  const DType t = GetParam();
  const size_t p = static_cast<size_t>(w.size());
  const size_t me = static_cast<size_t>(w.rank());
  for (size_t scale : {size_t{1}, size_t{300}}) {
    auto count = [&](size_t s, size_t d) { return ((s + 2 * d) % 3 + 1) * scale; };
    std::vector<size_t> sc(p), rc(p);
    size_t ns = 0, nr = 0;
    for (size_t j = 0; j < p; ++j) {
      sc[j] = count(me, j);
      rc[j] = count(j, me);
      ns += sc[j];
      nr += rc[j];
    }
    SCOPED_TRACE(case_name(t, ns, false, "scale " + std::to_string(scale)));
    Buf h(t, ns);
    for (size_t j = 0, k = 0; j < p; ++j) {
      for (size_t e = 0; e < sc[j]; ++e) h.set(k++, value(w.rank(), j * 1000 + e));
    }
    Padded in(t, ns), out(t, nr);
    in.upload(h);
    wait_ok(w.all_to_all(in.data(), out.data(), sc, rc, t, op_timeout()), "all_to_all");
    Buf got = out.download();
    for (size_t j = 0, k = kPad; j < p; ++j) {
      expect_values(got, k, rc[j], [&](size_t e) { return value(static_cast<int>(j), me * 1000 + e); },
                    "all_to_all from " + std::to_string(j));
      k += rc[j];
    }
    expect_pads(got, nr, "all_to_all");
  }
}

INSTANTIATE_TEST_SUITE_P(OfiNeuron, OfiNeuronOps, testing::ValuesIn(kAllTypes), DTypeName());

// Calls of the fake runtime that move bytes between host and device memory
// (nrt_tensor_read / nrt_tensor_write), from its test-only counter; -1 when
// the loaded runtime has none (a real one).
long long host_transfers() {
  const char* lib = std::getenv("TORUS_NEURON_LIBRARY");
  void* h = lib != nullptr ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  if (h == nullptr) return -1;
  auto* fn = reinterpret_cast<unsigned long long (*)()>(dlsym(h, "torus_fake_nrt_host_transfers"));
  long long n = fn != nullptr ? static_cast<long long>(fn()) : -1;
  dlclose(h);
  return n;
}

// A ring exchange: every rank sends n elements to the next and receives from
// the previous. On the fake runtime, TORUS_TEST_OFI_ZERO_COPY (tests.cmake)
// says whether the world hands device buffers to the provider (1: no host
// transfer during the exchange) or moves them through host memory (0: one
// per op); a real runtime counts nothing, and only the values are checked.
TEST(OfiNeuron, SendRecvMovesDeviceBuffers) {
  Backend& w = world();
  EXPECT_EQ(w.device_type(), DeviceType::kNeuron);
  const bool counted = host_transfers() >= 0;
  const char* zc = std::getenv("TORUS_TEST_OFI_ZERO_COPY");
  if (counted) ASSERT_NE(zc, nullptr) << "tests.cmake sets TORUS_TEST_OFI_ZERO_COPY";
  const bool zero_copy = zc != nullptr && std::string(zc) == "1";
  const int next = (w.rank() + 1) % w.size(), prev = (w.rank() + w.size() - 1) % w.size();
  for (DType t : kAllTypes) {
    for (size_t n : {size_t{1}, size_t{1031}, size_t{1} << 18}) {
      SCOPED_TRACE(case_name(t, n, false));
      Padded s(t, n), r(t, n);
      s.upload(inputs(t, ReduceOp::kSum, w.rank(), n, 17));
      const long long before = host_transfers();
      WorkPtr rw = w.recv(r.data(), n, t, prev, 5, op_timeout());
      WorkPtr sw = w.send(s.data(), n, t, next, 5, op_timeout());
      wait_ok(sw, "send");
      wait_ok(rw, "recv");
      if (counted) EXPECT_EQ(host_transfers() - before, zero_copy ? 0 : 2) << "host transfers in a send and a recv";
      Buf got = r.download();
      expect_values(got, kPad, n, [&](size_t i) { return value(prev, 17 + i); }, "recv");
      expect_pads(got, n, "recv");
    }
  }
}

TEST(OfiNeuron, RefusesHostMemoryAndShortBuffersBeforeSending) {
  Backend& w = world();
  DevBuf b(DType::kF32, 8);
  std::vector<float> host(8);
  auto refused = [](const std::function<void()>& fn, const std::string& what, const std::string& says) {
    try {
      fn();
      ADD_FAILURE() << what << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  const size_t counts[4] = {1, 1, 1, 1};
  std::span<const size_t> c(counts, static_cast<size_t>(w.size()));
  refused([&] { w.all_reduce(host.data(), b.mem.data(), 8, DType::kF32, ReduceOp::kSum, op_timeout()); },
          "all_reduce from host memory", "ofi all_reduce on group 'world'");
  refused([&] { w.broadcast(b.mem.data(), 9, DType::kF32, 0, op_timeout()); }, "a broadcast past the allocation",
          "the buffer must be 36 bytes of neuron device memory");
  refused([&] { w.send(host.data(), 8, DType::kF32, 0, 0, op_timeout()); }, "send from host memory",
          "ofi send on group 'world'");
  refused([&] { w.recv(b.at(4), 8, DType::kF32, 0, 0, op_timeout()); }, "a recv past the allocation", "recv");
  refused([&] { w.all_to_all(b.mem.data(), host.data(), c, c, DType::kF32, op_timeout()); },
          "all_to_all into host memory", "the output must be");
  // Nothing was sent: the world is healthy and in step.
  wait_ok(w.barrier(op_timeout()), "barrier after the refusals");
}

TEST(OfiNeuron, SplitGroupsTakeDeviceMemoryToo) {
  Backend& w = world();
  BackendPtr sub = w.split(w.rank() % 2, w.rank(), "parity", op_timeout());
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->device_type(), DeviceType::kNeuron);
  Padded b(DType::kF64, 1);
  Buf h(DType::kF64, 1, w.rank() + 0.5);
  b.upload(h);
  wait_ok(sub->all_reduce(b.data(), b.data(), 1, DType::kF64, ReduceOp::kSum, op_timeout()), "sub all_reduce");
  double want = 0;
  for (int r = w.rank() % 2; r < w.size(); r += 2) want += r + 0.5;
  EXPECT_EQ(b.download().get(kPad), want);
}

// Under the fake's READ_FAIL_BYTES / READ_FAIL_RANK (tests.cmake): one rank's
// copy of its input out of device memory fails. That rank's op fails with
// CommError naming the op, its sequence number, the group and the runtime's
// status; the peers fail too (the failing rank's abort notice, or the
// deadline), within the deadline; the group stays broken.
TEST(OfiNeuronFaults, AFailedDeviceCopyEndsTheOpOnEveryRank) {
  const char* bytes_env = std::getenv("TORUS_TEST_FAKE_NRT_READ_FAIL_BYTES");
  const char* rank_env = std::getenv("TORUS_TEST_FAKE_NRT_READ_FAIL_RANK");
  ASSERT_TRUE(bytes_env != nullptr && rank_env != nullptr) << "selected by tests.cmake with the fake's READ_FAIL_*";
  Backend& w = world();
  const size_t n = static_cast<size_t>(std::atoll(bytes_env)) / sizeof(float);
  const int failing = std::atoi(rank_env);
  BackendPtr g = w.split(0, w.rank(), "faulty", op_timeout());
  Padded b(DType::kF32, n);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    g->all_reduce(b.data(), b.data(), n, DType::kF32, ReduceOp::kSum, fault_timeout())->wait();
    ADD_FAILURE() << "the op completed";
  } catch (const CommError& e) {  // TimeoutError included: a peer may give up before the notice arrives
    message = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, fault_timeout() + fault_margin());
  if (w.rank() == failing) {
    EXPECT_NE(message.find("all_reduce seq 1 on group 'faulty' (rank " + std::to_string(g->rank())),
              std::string::npos) << message;
    EXPECT_NE(message.find("NRT_HW_ERROR"), std::string::npos) << message;
    EXPECT_NE(message.find("from device memory"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("all_reduce seq 1 on group 'faulty'"), std::string::npos) << message;
  }
  try {
    g->all_reduce(b.data(), b.data(), 1, DType::kF32, ReduceOp::kSum, op_timeout())->wait();
    ADD_FAILURE() << "an op on the broken group completed";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("is broken"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torus::comm::test
