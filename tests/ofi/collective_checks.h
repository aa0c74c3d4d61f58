// Collective checks shared by the ofi tests: every op of the Backend
// interface on one group, checked against closed forms (ofi_world.h's
// contributions). Each throws (require) on the first wrong result, so it
// runs inside forked ranks or stand-alone rank processes alike.
#pragma once

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "ofi_world.h"

namespace torus::comm::ofi::test {

inline const Duration kT{20000};

inline double sum_over(int n, size_t i) {
  double s = 0;
  for (int r = 0; r < n; ++r) s += contribution(r, i);
  return s;
}
inline double max_over(int n, size_t i) {
  double m = 0;
  for (int r = 0; r < n; ++r) m = std::max(m, contribution(r, i));
  return m;
}

inline void check_all_reduce(Backend& b, size_t count) {
  const int n = b.size(), me = b.rank();
  const std::string c = " count " + std::to_string(count);
  std::vector<float> in = filled(me, count), out(count, -1.f);
  b.all_reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
  require_values(out, [&](size_t i) { return sum_over(n, i); }, "all_reduce sum out-of-place" + c);
  b.all_reduce(in.data(), in.data(), count, DType::kF32, ReduceOp::kAvg, kT)->wait();
  require_values(in, [&](size_t i) { return sum_over(n, i) / n; }, "all_reduce avg in-place" + c, 1e-5);
  std::vector<int32_t> xi(count);
  for (size_t i = 0; i < count; ++i) xi[i] = static_cast<int32_t>(contribution(me, i));
  b.all_reduce(xi.data(), xi.data(), count, DType::kI32, ReduceOp::kMax, kT)->wait();
  require_values(xi, [&](size_t i) { return max_over(n, i); }, "all_reduce max i32" + c);
  std::vector<uint16_t> h(count), hout(count);
  for (size_t i = 0; i < count; ++i) h[i] = kernels::float_to_bf16(static_cast<float>(contribution(me, i)));
  b.all_reduce(h.data(), hout.data(), count, DType::kBF16, ReduceOp::kSum, kT)->wait();
  std::vector<float> hf(count);
  for (size_t i = 0; i < count; ++i) hf[i] = kernels::bf16_to_float(hout[i]);
  require_values(hf, [&](size_t i) { return sum_over(n, i); }, "all_reduce bf16 sum" + c);
}

inline void check_rooted(Backend& b, size_t count) {
  const int n = b.size(), me = b.rank();
  for (int root = 0; root < n; ++root) {
    const std::string c = " count " + std::to_string(count) + " root " + std::to_string(root);
    std::vector<float> buf = me == root ? filled(root, count) : std::vector<float>(count, -1.f);
    b.broadcast(buf.data(), count, DType::kF32, root, kT)->wait();
    require_values(buf, [&](size_t i) { return contribution(root, i); }, "broadcast" + c);
    std::vector<float> in = filled(me, count), out(count, -1.f);
    b.reduce(in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, root, kT)->wait();
    if (me == root) {
      require_values(out, [&](size_t i) { return sum_over(n, i); }, "reduce" + c);
    } else {
      require_values(out, [](size_t) { return -1.0; }, "reduce left a non-root's out alone" + c);
    }
  }
}

inline void check_gather_scatter(Backend& b, size_t count) {
  const int n = b.size(), me = b.rank();
  const size_t un = static_cast<size_t>(n);
  const std::string c = " count " + std::to_string(count);
  std::vector<float> in = filled(me, count), out(un * count, -1.f);
  b.all_gather(in.data(), out.data(), count, DType::kF32, kT)->wait();
  require_values(out, [&](size_t i) { return contribution(static_cast<int>(i / count), i % count); },
                 "all_gather" + c);
  std::vector<float> big(un * count), mine(count, -1.f);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(contribution(me, i));
  b.reduce_scatter(big.data(), mine.data(), count, DType::kF32, ReduceOp::kSum, kT)->wait();
  require_values(mine, [&](size_t i) { return sum_over(n, static_cast<size_t>(me) * count + i); },
                 "reduce_scatter" + c);
  // Uneven all_to_all: rank s sends (s + d) % 3 * k elements to rank d.
  const size_t k = count / 4 + 1;
  std::vector<size_t> sc(un), rc(un);
  for (int d = 0; d < n; ++d) sc[static_cast<size_t>(d)] = static_cast<size_t>((me + d) % 3) * k;
  for (int s = 0; s < n; ++s) rc[static_cast<size_t>(s)] = static_cast<size_t>((s + me) % 3) * k;
  std::vector<float> a2a_in(std::accumulate(sc.begin(), sc.end(), size_t{0}));
  std::vector<float> a2a_out(std::accumulate(rc.begin(), rc.end(), size_t{0}), -1.f);
  for (size_t d = 0, off = 0; d < un; off += sc[d], ++d) {
    for (size_t i = 0; i < sc[d]; ++i) a2a_in[off + i] = static_cast<float>(me * 1000 + static_cast<int>(d) * 10 + static_cast<int>(i % 7));
  }
  b.all_to_all(a2a_in.data(), a2a_out.data(), sc, rc, DType::kF32, kT)->wait();
  for (size_t s = 0, off = 0; s < un; off += rc[s], ++s) {
    for (size_t i = 0; i < rc[s]; ++i) {
      require(a2a_out[off + i] == static_cast<float>(static_cast<int>(s) * 1000 + me * 10 + static_cast<int>(i % 7)),
              "all_to_all block from rank " + std::to_string(s) + c);
    }
  }
}

inline void check_p2p_and_barrier(Backend& b) {
  const int n = b.size(), me = b.rank();
  std::vector<float> out = filled(me, 5000), in(5000, -1.f);
  WorkPtr r = b.recv(in.data(), in.size(), DType::kF32, (me + n - 1) % n, 3, kT);
  WorkPtr s = b.send(out.data(), out.size(), DType::kF32, (me + 1) % n, 3, kT);
  s->wait();
  r->wait();
  require_values(in, [&](size_t i) { return contribution((me + n - 1) % n, i); }, "send/recv ring");
  for (int i = 0; i < 3; ++i) b.barrier(kT)->wait();
}

// Splits the group by rank parity (reversed order by key) and checks
// collectives on each half, then a group of everybody but rank 0.
inline void check_split(Backend& b) {
  const int n = b.size(), me = b.rank();
  std::shared_ptr<Backend> half = b.split(me % 2, -me, "parity", kT);
  require(half != nullptr, "split returned no group");
  const int hn = half->size();
  require(hn == (n + 1 - me % 2) / 2, "split group size");
  std::vector<float> x(50000, static_cast<float>(me + 1));
  half->all_reduce(x.data(), x.data(), x.size(), DType::kF32, ReduceOp::kSum, kT)->wait();
  double want = 0;
  for (int r = me % 2; r < n; r += 2) want += r + 1;
  require_values(x, [&](size_t) { return want; }, "all_reduce on the parity group");
  std::vector<float> y(1000, static_cast<float>(me));
  half->broadcast(y.data(), y.size(), DType::kF32, hn - 1, kT)->wait();
  require_values(y, [&](size_t) { return static_cast<double>(me % 2); }, "broadcast from the parity group's last rank");
  std::shared_ptr<Backend> rest = b.split(me == 0 ? -1 : 0, me, "rest", kT);
  require((me == 0) == (rest == nullptr), "color < 0 must give no group");
  if (rest) {
    rest->barrier(kT)->wait();
    std::vector<int32_t> z(7, me);
    rest->all_reduce(z.data(), z.data(), 7, DType::kI32, ReduceOp::kMax, kT)->wait();
    require(z[6] == n - 1, "max over the rest");
  }
  b.barrier(kT)->wait();
}

// Half types are summed in f32 and rounded once (Note [Half sums across
// hosts]): rank 0 gives 256 (bf16) or 2048 (f16), ranks 1 and 2 give 1, the
// rest 0. The exact sums 258 and 2050 are representable; rounding a host's
// partial 256 + 1 to 16 bits first loses the 1 (tie to even) and yields 256
// or 2048. Small and large counts take the leader and the block paths.
inline void check_half_rounding(Backend& b) {
  const int n = b.size(), me = b.rank();
  if (n < 3) return;
  struct Case {
    DType dtype;
    float big;
    uint16_t (*to)(float);
    float (*from)(uint16_t);
  };
  const Case cases[] = {{DType::kBF16, 256.f, kernels::float_to_bf16, kernels::bf16_to_float},
                        {DType::kF16, 2048.f, kernels::float_to_f16, kernels::f16_to_float}};
  for (const Case& k : cases) {
    const float mine = me == 0 ? k.big : me <= 2 ? 1.f : 0.f;
    const double want = k.big + 2.0;
    for (size_t count : {size_t{1}, size_t{9}, size_t{100003}}) {
      const std::string c = " " + std::string(dtype_name(k.dtype)) + " count " + std::to_string(count);
      std::vector<uint16_t> in(count, k.to(mine)), out(count, 0);
      b.all_reduce(in.data(), out.data(), count, k.dtype, ReduceOp::kSum, kT)->wait();
      std::vector<float> got(count);
      for (size_t i = 0; i < count; ++i) got[i] = k.from(out[i]);
      require_values(got, [&](size_t) { return want; }, "all_reduce rounded once" + c);
      for (int root : {0, n - 1}) {
        std::fill(out.begin(), out.end(), uint16_t{0});
        b.reduce(in.data(), out.data(), count, k.dtype, ReduceOp::kSum, root, kT)->wait();
        if (me != root) continue;
        for (size_t i = 0; i < count; ++i) got[i] = k.from(out[i]);
        require_values(got, [&](size_t) { return want; }, "reduce rounded once, root " + std::to_string(root) + c);
      }
    }
  }
}

inline void check_everything(Backend& b, int) {
  for (size_t count : {size_t{1}, size_t{5}, size_t{3000}, size_t{200003}}) check_all_reduce(b, count);
  for (size_t count : {size_t{7}, size_t{70001}}) check_rooted(b, count);
  for (size_t count : {size_t{3}, size_t{40000}}) check_gather_scatter(b, count);
  check_half_rounding(b);
  check_p2p_and_barrier(b);
  if (b.size() > 1) check_split(b);
}

}  // namespace torus::comm::ofi::test
