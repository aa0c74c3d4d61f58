// Multi-rank tests of the tensor-level ProcessGroup and DeviceMesh: input
// validation before any communication, every op on tensors (closed-form
// expectations), sub-groups from split/new_group/meshes, the debug-mode
// mismatch check, and deadlines. Run under mpirun with 1–4 ranks.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "torus/comm/device_mesh.h"
#include "torus/comm/process_group.h"
#include "comm/pg_world.h"
#include "torus/comm/shared_host.h"
#include "torus/core/error.h"

namespace torus::comm {
namespace {

using namespace std::chrono_literals;

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ProcessGroup, BadInputIsRejectedBeforeCommunication) {
  auto& g = *world();
  at::Tensor t = at::ones({4, 4});
  at::Tensor nc = t.t();  // non-contiguous
  EXPECT_THROW(g.all_reduce(nc), InvalidArgument);
  at::Tensor b = at::ones({4}, at::kBool);
  EXPECT_THROW(g.all_reduce(b), InvalidArgument);
  at::Tensor c = at::ones({4}, at::kComplexFloat);
  EXPECT_THROW(g.broadcast(c), InvalidArgument);
  at::Tensor wrong = at::zeros({g.size() * 4 + 1});
  at::Tensor out = at::zeros({4});
  EXPECT_THROW(g.reduce_scatter(wrong, out), InvalidArgument);
  EXPECT_THROW(g.all_gather(out, wrong), InvalidArgument);
  at::Tensor d = at::zeros({4}, at::kDouble);
  EXPECT_THROW(g.all_reduce(out, d), InvalidArgument);
  EXPECT_THROW(g.broadcast(out, BroadcastOptions{g.size()}), InvalidArgument);
  EXPECT_THROW(g.reduce(out, ReduceOptions{ReduceOp::kSum, -1}), InvalidArgument);
  EXPECT_THROW(g.send(out, g.size()), InvalidArgument);
  EXPECT_THROW(g.recv(out, 0, SendRecvOptions{-3}), InvalidArgument);
  AllToAllOptions bad_split;
  bad_split.input_split_sizes.assign(g.size(), 1);
  bad_split.input_split_sizes[0] += 1;  // sums to size+1 rows
  at::Tensor a2a_in = at::zeros({g.size(), 2}), a2a_out = at::zeros({g.size(), 2});
  EXPECT_THROW(g.all_to_all(a2a_in, a2a_out, bad_split), InvalidArgument);
  std::string msg = what_of([&] { g.all_reduce(nc); });
  EXPECT_NE(msg.find("not contiguous"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world"), std::string::npos) << msg;
  // Nothing was sent: the group still works, in step on every rank.
  at::Tensor ok = at::full({3}, 1.0);
  g.all_reduce(ok)->wait();
  EXPECT_TRUE(ok.eq(g.size()).all().item<bool>());
}

TEST(ProcessGroup, AllReduceEveryOpOnTensors) {
  auto& g = *world();
  const int n = g.size(), r = g.rank();
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong, at::kByte}) {
    for (ReduceOp op : kAllReduceOps) {
      // x_r[i] = (r + i) % 3 + 1: small, exact in every dtype.
      at::Tensor idx = at::arange(37, at::kLong);
      at::Tensor x = ((idx + r) % 3 + 1).to(dtype).reshape({37});
      at::Tensor expect = at::zeros({37}, at::kDouble);
      for (int64_t i = 0; i < 37; ++i) {
        double s = 0, p = 1, mx = -1e9, mn = 1e9;
        for (int q = 0; q < n; ++q) {
          double v = (q + i) % 3 + 1;
          s += v;
          p *= v;
          mx = std::max(mx, v);
          mn = std::min(mn, v);
        }
        double e = op == ReduceOp::kSum ? s : op == ReduceOp::kProd ? p : op == ReduceOp::kMax ? mx : mn;
        if (op == ReduceOp::kAvg) e = at::isFloatingType(dtype) ? s / n : std::trunc(s / n);
        expect[i] = e;
      }
      if (dtype == at::kByte && op == ReduceOp::kProd) expect = expect.fmod(256);
      at::Tensor in_place = x.clone();
      g.all_reduce(in_place, AllReduceOptions{op})->wait();
      at::Tensor out = at::empty_like(x);
      g.all_reduce(x, out, AllReduceOptions{op})->wait();
      double tol = dtype == at::kBFloat16 ? 1e-2 : dtype == at::kHalf ? 1e-3 : 1e-6;
      EXPECT_TRUE(at::allclose(in_place.to(at::kDouble), expect, tol, 0)) << c10::toString(dtype) << " "
                                                                            << reduce_op_name(op);
      EXPECT_TRUE(at::equal(in_place, out)) << "in-place and out-of-place agree";
      EXPECT_TRUE(at::equal(x, ((idx + r) % 3 + 1).to(dtype))) << "out-of-place leaves the input alone";
    }
  }
}

TEST(ProcessGroup, DataMovementOpsOnMultiDimTensors) {
  auto& g = *world();
  const int n = g.size(), r = g.rank();
  // all_gather: block q holds q*100 + element index.
  at::Tensor in = at::arange(6, at::kFloat).reshape({2, 3}) + 100 * r;
  at::Tensor gathered = at::empty({n, 2, 3});
  g.all_gather(in, gathered)->wait();
  for (int q = 0; q < n; ++q) EXPECT_TRUE(at::equal(gathered[q], at::arange(6, at::kFloat).reshape({2, 3}) + 100 * q));

  // all_gather in place: input is this rank's block of the output.
  at::Tensor buf = at::zeros({n * 5}, at::kLong);
  at::Tensor mine = buf.narrow(0, r * 5, 5);
  mine.fill_(r + 1);
  g.all_gather(mine, buf)->wait();
  for (int q = 0; q < n; ++q) EXPECT_TRUE(buf.narrow(0, q * 5, 5).eq(q + 1).all().item<bool>());

  // reduce_scatter: block b of every rank's input is (b + 1) * (r + 1);
  // rank r receives (r + 1) * sum_q (q + 1) = (r + 1) * n(n+1)/2.
  at::Tensor rs_in = at::empty({n, 4}, at::kDouble);
  for (int b = 0; b < n; ++b) rs_in[b].fill_((b + 1) * (r + 1));
  at::Tensor rs_out = at::empty({4}, at::kDouble);
  g.reduce_scatter(rs_in, rs_out)->wait();
  EXPECT_TRUE(rs_out.eq((r + 1) * n * (n + 1) / 2.0).all().item<bool>());

  // Uneven all_to_all: rank r sends (q + 1) rows of value 10*r + q to rank q.
  std::vector<int64_t> in_split(n), out_split(n);
  for (int q = 0; q < n; ++q) {
    in_split[q] = q + 1;
    out_split[q] = r + 1;
  }
  int64_t in_rows = std::accumulate(in_split.begin(), in_split.end(), int64_t{0});
  at::Tensor a_in = at::empty({in_rows, 2}, at::kInt);
  int64_t row = 0;
  for (int q = 0; q < n; ++q)
    for (int k = 0; k < q + 1; ++k) a_in[row++].fill_(10 * r + q);
  at::Tensor a_out = at::full({n * (r + 1), 2}, -1, at::kInt);
  g.all_to_all(a_in, a_out, AllToAllOptions{in_split, out_split})->wait();
  for (int q = 0; q < n; ++q)
    EXPECT_TRUE(a_out.narrow(0, q * (r + 1), r + 1).eq(10 * q + r).all().item<bool>()) << "from rank " << q;

  // broadcast and reduce from every root.
  for (int root = 0; root < n; ++root) {
    at::Tensor t = at::full({3, 3}, r == root ? 7.5 : 0.0);
    g.broadcast(t, BroadcastOptions{root})->wait();
    EXPECT_TRUE(t.eq(7.5).all().item<bool>());
    at::Tensor s = at::full({5}, r + 1, at::kLong);
    g.reduce(s, ReduceOptions{ReduceOp::kSum, root})->wait();
    EXPECT_TRUE(s.eq(r == root ? n * (n + 1) / 2 : r + 1).all().item<bool>());
  }

  // send/recv around a ring (single rank: to itself).
  at::Tensor send_buf = at::full({16}, r, at::kFloat);
  at::Tensor recv_buf = at::full({16}, -1, at::kFloat);
  auto rw = g.recv(recv_buf, (r - 1 + n) % n, SendRecvOptions{5});
  auto sw = g.send(send_buf, (r + 1) % n, SendRecvOptions{5});
  sw->wait();
  rw->wait();
  EXPECT_TRUE(recv_buf.eq((r - 1 + n) % n).all().item<bool>());
  g.barrier()->wait();

  // Zero-element tensors are valid collectives.
  at::Tensor empty = at::empty({0});
  g.all_reduce(empty)->wait();
  EXPECT_EQ(empty.numel(), 0);
}

TEST(ProcessGroup, WorkCarriesItsDescription) {
  auto& g = *world();
  // Two ops in flight at once (on separate buffers: concurrent ops must not
  // share memory, see docs/comm.md).
  at::Tensor t = at::ones({10});
  at::Tensor u = at::full({10}, 2.0);
  auto w1 = g.all_reduce(t);
  auto w2 = g.all_reduce(u);
  w2->wait();
  w1->wait();
  EXPECT_TRUE(w1->is_completed());
  EXPECT_EQ(w2->info().seq, w1->info().seq + 1);
  EXPECT_EQ(w1->info().op, OpType::kAllReduce);
  EXPECT_EQ(w1->info().group, "world");
  EXPECT_TRUE(t.eq(g.size()).all().item<bool>());
  EXPECT_TRUE(u.eq(2 * g.size()).all().item<bool>());
}

TEST(ProcessGroup, SubGroupsFromSplitAndRankLists) {
  auto& g = *world();
  const int n = g.size(), r = g.rank();
  auto parity = g.split(r % 2, r, "parity");
  ASSERT_NE(parity, nullptr);
  EXPECT_EQ(parity->size(), (n + 1 - r % 2) / 2);
  EXPECT_EQ(parity->rank(), r / 2);
  at::Tensor t = at::full({4}, r, at::kLong);
  parity->all_reduce(t)->wait();
  int64_t expect = 0;
  for (int q = r % 2; q < n; q += 2) expect += q;
  EXPECT_TRUE(t.eq(expect).all().item<bool>());
  EXPECT_EQ(parity->global_rank(parity->rank()), r);

  // The last rank and rank 0, in that order.
  auto pair = g.new_group(n == 1 ? std::vector<int>{0} : std::vector<int>{n - 1, 0}, "ends");
  if (r == n - 1 || r == 0) {
    ASSERT_NE(pair, nullptr);
    EXPECT_EQ(pair->rank(), r == n - 1 ? 0 : (n == 1 ? 0 : 1));
    at::Tensor b = at::full({2}, r == n - 1 ? 42 : 0, at::kInt);
    pair->broadcast(b, BroadcastOptions{0})->wait();
    EXPECT_TRUE(b.eq(42).all().item<bool>());
  } else {
    EXPECT_EQ(pair, nullptr);
  }
  EXPECT_THROW(g.new_group({0, 0}, "dup"), InvalidArgument);
  EXPECT_THROW(g.new_group({n}, "outside"), InvalidArgument);
}

TEST(DeviceMesh, GroupsPerDimensionAndCombination) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  EXPECT_THROW(DeviceMesh(w, {{"dp", n + 1}}), InvalidArgument);
  EXPECT_THROW(DeviceMesh(w, {{"tp", n}, {"qp", 1}}), InvalidArgument);
  if (n % 2 != 0) {
    DeviceMesh mesh(w, {{"dp", n}});
    EXPECT_EQ(mesh.group("dp")->size(), n);
    EXPECT_EQ(mesh.group("tp")->size(), 1);
    return;
  }
  DeviceMesh mesh(w, {{"dp", n / 2}, {"tp", 2}});
  EXPECT_EQ(mesh.coord("tp"), r % 2);
  EXPECT_EQ(mesh.coord("dp"), r / 2);
  // tp group = {r - r%2, r - r%2 + 1}; dp group = {r%2, r%2 + 2, ...}.
  at::Tensor t = at::full({1}, r, at::kLong);
  mesh.group("tp")->all_reduce(t)->wait();
  EXPECT_EQ(t.item<int64_t>(), 2 * (r - r % 2) + 1);
  at::Tensor d = at::full({1}, r, at::kLong);
  mesh.group("dp")->all_reduce(d)->wait();
  int64_t dp_sum = 0;
  for (int q = r % 2; q < n; q += 2) dp_sum += q;
  EXPECT_EQ(d.item<int64_t>(), dp_sum);
  EXPECT_EQ(mesh.group(std::vector<std::string>{"tp", "dp"})->size(), n);
  EXPECT_EQ(mesh.group(std::vector<std::string>{"pp"})->size(), 1);
  EXPECT_EQ(mesh.group(std::vector<std::string>{"pp", "tp"}).get(), mesh.group("tp").get());
  if (n > 2) EXPECT_EQ(mesh.group("tp")->name(), "tp");  // with n == 2 the tp group is the world
}

TEST(ProcessGroup, DebugModeNamesTheMismatchingRank) {
  auto& g = *world();
  if (g.size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  auto dbg = g.split(0, g.rank(), "debug");
  dbg->set_debug(true);
  at::Tensor t = at::ones({g.rank() == 1 ? 5 : 4});
  std::string msg = what_of([&] { dbg->all_reduce(t)->wait(); });
  EXPECT_NE(msg.find("mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  // Matching calls still pass the check.
  at::Tensor ok = at::ones({4});
  dbg->all_reduce(ok)->wait();
  EXPECT_TRUE(ok.eq(g.size()).all().item<bool>());
}

// The odd one out is named against the majority, also when it is rank 0
// (three or more ranks); on a tie (two ranks) rank 0's call counts as the
// majority, so rank 1 is named; one rank has nobody to disagree with.
TEST(ProcessGroup, DebugModeNamesRankZeroWhenItIsTheOddOne) {
  auto& g = *world();
  auto dbg = g.split(0, g.rank(), "debug0");
  dbg->set_debug(true);
  at::Tensor t = at::ones({g.rank() == 0 ? 5 : 4});
  std::string msg = what_of([&] { dbg->all_reduce(t)->wait(); });
  if (g.size() >= 3) {
    EXPECT_NE(msg.find("rank 0 called all_reduce(dtype f32, numel 5"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("rank 1 called"), std::string::npos) << msg;
  } else if (g.size() == 2) {
    EXPECT_NE(msg.find("rank 1 called all_reduce(dtype f32, numel 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(rank 0 among them) called all_reduce(dtype f32, numel 5"), std::string::npos) << msg;
  } else {
    EXPECT_EQ(msg, "") << "a one-rank group disagreed with itself";
    EXPECT_TRUE(t.eq(1).all().item<bool>());
  }
}

// Messages name the call that was made and spell dtypes as Torus does.
TEST(ProcessGroup, MessagesNameTheCallAndTorusDtypes) {
  auto& g = *world();
  std::string msg = what_of([&] { g.new_group({0, g.size()}, "bad"); });
  EXPECT_NE(msg.find("new_group 'bad'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(g.size())), std::string::npos) << msg;
  EXPECT_EQ(msg.find("barrier"), std::string::npos) << msg;
  at::Tensor nc = at::ones({4, 4}).t();
  msg = what_of([&] { g.broadcast(nc); });
  EXPECT_NE(msg.find("broadcast on group 'world': the tensor (shape [4, 4]"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("  "), std::string::npos) << msg;
  for (auto [type, name] : {std::pair{at::kChar, "i8"}, std::pair{at::kShort, "i16"}, std::pair{at::kBool, "bool"}}) {
    at::Tensor x = at::ones({4}, type);
    msg = what_of([&] { g.all_reduce(x); });
    EXPECT_NE(msg.find(std::string("dtype ") + name + " is not supported"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("Char"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("Short"), std::string::npos) << msg;
  }
  at::Tensor f = at::zeros({4}), d = at::zeros({4}, at::kDouble), u = at::zeros({4}, at::kByte);
  msg = what_of([&] { g.all_reduce(f, d); });
  EXPECT_NE(msg.find("input dtype f32 differs from output dtype f64"), std::string::npos) << msg;
  msg = what_of([&] { g.all_reduce(u, f); });
  EXPECT_NE(msg.find("input dtype u8 differs"), std::string::npos) << msg;
}

TEST(ProcessGroup, MissingRankEndsInTimeoutErrorNamingTheOp) {
  auto& g = *world();
  if (g.size() < 2) GTEST_SKIP() << "a missing peer needs two ranks";
  auto victim = g.split(0, g.rank(), "victim");
  victim->set_timeout(1500ms);
  at::Tensor t = at::ones({1000});
  if (g.rank() != g.size() - 1) {  // the last rank never joins
    auto start = std::chrono::steady_clock::now();
    std::string msg = what_of([&] { victim->all_reduce(t)->wait(); });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("victim"), std::string::npos) << msg;
    EXPECT_NE(msg.find("seq"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1000"), std::string::npos) << msg;
    EXPECT_GE(s, 1.4);
    EXPECT_LT(s, 1.5 + 3.0) << "deadline plus a small margin";
    EXPECT_THROW(victim->all_reduce(t)->wait(), Error) << "the group is broken after a timeout";
  }
  g.barrier()->wait();  // the world group is unaffected
}

}  // namespace
}  // namespace torus::comm
