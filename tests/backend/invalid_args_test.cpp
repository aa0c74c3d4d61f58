// Conformance: bad input is rejected on the calling rank, before any
// communication, with InvalidArgument (or Unsupported for what the backend
// cannot serve) — and takes no sequence number, so the group stays in step.
#include <climits>
#include <cstdint>

#include "backend_fixture.h"
#include "torus/core/error.h"

namespace torus::comm::test {
namespace {

// EXPECTs that `fn` throws exactly `Expected` from the issue call.
template <class Expected>
void expect_rejected(const std::function<WorkPtr()>& fn, const std::string& what) {
  try {
    WorkPtr w = fn();
    ADD_FAILURE() << what << ": accepted (returned a Work for " << (w ? w->info().describe() : "null") << ")";
    if (w) w->wait();
  } catch (const Expected&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw the wrong error type: " << e.what();
  }
}

TEST(InvalidArgs, EveryOpRejectsBadInputLocally) {
  BackendPtr w = world_ptr();
  Backend& b = *w;
  const int n = b.size(), me = b.rank();
  const Duration t = op_timeout();
  const DType f32 = DType::kF32;
  Buf buf(f32, 64 * static_cast<size_t>(n), 1), other(f32, 64 * static_cast<size_t>(n), 1);
  void* p = buf.data();
  void* q = other.data();
  // Byte size overflows size_t: no buffer can hold it.
  const size_t huge = SIZE_MAX / 2;

  // A valid op before: its seq is the reference.
  WorkPtr before = b.all_reduce(p, p, 4, f32, ReduceOp::kSum, t);
  wait_ok(before, "all_reduce before");

  using IA = InvalidArgument;
  // Timeouts must be > 0 here (the ProcessGroup resolves defaults).
  expect_rejected<IA>([&] { return b.all_reduce(p, q, 4, f32, ReduceOp::kSum, Duration(0)); }, "all_reduce timeout 0");
  expect_rejected<IA>([&] { return b.barrier(Duration(-5)); }, "barrier negative timeout");
  expect_rejected<IA>([&] { return b.broadcast(p, 4, f32, 0, Duration(0)); }, "broadcast timeout 0");

  // all_reduce
  expect_rejected<IA>([&] { return b.all_reduce(p, q, huge, f32, ReduceOp::kSum, t); }, "all_reduce count overflow");
  expect_rejected<IA>([&] { return b.all_reduce(nullptr, q, 4, f32, ReduceOp::kSum, t); }, "all_reduce null in");
  expect_rejected<IA>([&] { return b.all_reduce(p, nullptr, 4, f32, ReduceOp::kSum, t); }, "all_reduce null out");
  // reduce_scatter / all_gather: size()*count overflows
  expect_rejected<IA>([&] { return b.reduce_scatter(p, q, huge, f32, ReduceOp::kSum, t); },
                      "reduce_scatter count overflow");
  expect_rejected<IA>([&] { return b.reduce_scatter(nullptr, q, 4, f32, ReduceOp::kMax, t); },
                      "reduce_scatter null in");
  expect_rejected<IA>([&] { return b.all_gather(p, q, huge, f32, t); }, "all_gather count overflow");
  expect_rejected<IA>([&] { return b.all_gather(p, nullptr, 4, f32, t); }, "all_gather null out");
  // all_to_all
  std::vector<size_t> ones(static_cast<size_t>(n), 1), short_counts(static_cast<size_t>(n) + 1, 1);
  expect_rejected<IA>([&] { return b.all_to_all(p, q, short_counts, ones, f32, t); }, "all_to_all counts size");
  expect_rejected<IA>([&] { return b.all_to_all(p, q, ones, short_counts, f32, t); }, "all_to_all recv counts size");
  expect_rejected<IA>([&] { return b.all_to_all(p, p, ones, ones, f32, t); }, "all_to_all in aliases out");
  std::vector<size_t> self_mismatch = ones;
  self_mismatch[static_cast<size_t>(me)] = 2;
  expect_rejected<IA>([&] { return b.all_to_all(p, q, self_mismatch, ones, f32, t); },
                      "all_to_all self counts disagree");
  std::vector<size_t> huge_counts(static_cast<size_t>(n), huge);
  expect_rejected<IA>([&] { return b.all_to_all(p, q, huge_counts, huge_counts, f32, t); },
                      "all_to_all count overflow");
  // broadcast / reduce: roots
  for (int root : {-1, n, n + 5}) {
    expect_rejected<IA>([&] { return b.broadcast(p, 4, f32, root, t); }, "broadcast root " + std::to_string(root));
    expect_rejected<IA>([&] { return b.reduce(p, q, 4, f32, ReduceOp::kSum, root, t); },
                        "reduce root " + std::to_string(root));
  }
  expect_rejected<IA>([&] { return b.broadcast(p, huge, f32, 0, t); }, "broadcast count overflow");
  expect_rejected<IA>([&] { return b.broadcast(nullptr, 4, f32, 0, t); }, "broadcast null buf");
  expect_rejected<IA>([&] { return b.reduce(p, q, huge, f32, ReduceOp::kSum, 0, t); }, "reduce count overflow");
  expect_rejected<IA>([&] { return b.reduce(p, nullptr, 4, f32, ReduceOp::kSum, me, t); }, "reduce null out on root");
  // send / recv: peers and tags
  for (int peer : {-1, n}) {
    expect_rejected<IA>([&] { return b.send(p, 4, f32, peer, 0, t); }, "send peer " + std::to_string(peer));
    expect_rejected<IA>([&] { return b.recv(p, 4, f32, peer, 0, t); }, "recv peer " + std::to_string(peer));
  }
  expect_rejected<IA>([&] { return b.send(p, 4, f32, me, -1, t); }, "send negative tag");
  expect_rejected<IA>([&] { return b.recv(p, 4, f32, me, -3, t); }, "recv negative tag");
  expect_rejected<IA>([&] { return b.send(p, huge, f32, me, 0, t); }, "send count overflow");
  expect_rejected<IA>([&] { return b.recv(nullptr, 4, f32, me, 0, t); }, "recv null buf");
  // split
  try {
    (void)b.split(0, 0, "bad", Duration(0));
    ADD_FAILURE() << "split with timeout 0 accepted";
  } catch (const InvalidArgument&) {
  }

  // Whatever supports() declines must throw Unsupported without communicating.
  for (OpType op : kAllOpTypes) {
    for (DType dt : kAllDTypes) {
      for (ReduceOp r : kAllReduceOps) {
        if (b.supports(op, dt, r)) continue;
        Buf x(dt, 4 * static_cast<size_t>(n)), y(dt, 4 * static_cast<size_t>(n));
        std::vector<size_t> c(static_cast<size_t>(n), 4);
        std::string what = std::string("unsupported ") + std::string(op_type_name(op)) + " " +
                           std::string(dtype_name(dt)) + " " + std::string(reduce_op_name(r));
        expect_rejected<Unsupported>(
            [&]() -> WorkPtr {
              switch (op) {
                case OpType::kAllReduce:
                  return b.all_reduce(x.data(), y.data(), 4, dt, r, t);
                case OpType::kReduceScatter:
                  return b.reduce_scatter(x.data(), y.data(), 4, dt, r, t);
                case OpType::kAllGather:
                  return b.all_gather(x.data(), y.data(), 4, dt, t);
                case OpType::kAllToAll:
                  return b.all_to_all(x.data(), y.data(), c, c, dt, t);
                case OpType::kBroadcast:
                  return b.broadcast(x.data(), 4, dt, 0, t);
                case OpType::kReduce:
                  return b.reduce(x.data(), y.data(), 4, dt, r, 0, t);
                case OpType::kSend:
                  return b.send(x.data(), 4, dt, me, 0, t);
                case OpType::kRecv:
                  return b.recv(x.data(), 4, dt, me, 0, t);
                case OpType::kBarrier:
                  return b.barrier(t);
              }
              return nullptr;
            },
            what);
      }
    }
  }

  if (backend_name() == "mpi") {
    // MPI counts are int: more than INT_MAX elements is a valid request the
    // mpi backend cannot serve (the buffer is never touched).
    const size_t over = static_cast<size_t>(INT_MAX) + 1;
    expect_rejected<Unsupported>([&] { return b.all_reduce(p, q, over, DType::kU8, ReduceOp::kSum, t); },
                                 "mpi all_reduce count > INT_MAX");
    expect_rejected<Unsupported>([&] { return b.send(p, over, DType::kU8, me, 0, t); }, "mpi send count > INT_MAX");
    std::vector<size_t> big(static_cast<size_t>(n), 0);
    big[static_cast<size_t>(me)] = over;
    expect_rejected<Unsupported>([&] { return b.all_to_all(p, q, big, big, DType::kU8, t); },
                                 "mpi all_to_all total > INT_MAX");
  }

  // Nothing above took a sequence number or reached the peers.
  WorkPtr after = b.all_reduce(p, p, 4, f32, ReduceOp::kSum, t);
  wait_ok(after, "all_reduce after");
  EXPECT_EQ(after->info().seq, before->info().seq + 1);
  expect_values(
      buf, 0, 4, [&](size_t) { return static_cast<double>(n) * n; }, "all_reduce after the bad calls");
}

}  // namespace
}  // namespace torus::comm::test
