// Ranks that pass different sizes to one collective get an error, never a
// result, without the debug mode: on the host segment (Note [Op
// signatures]) an InvalidArgument that names the disagreement; over the
// provider an error on a message of the wrong size, or — where the sizes
// make the ranks pick different algorithms, so that their messages never
// meet — the op's TimeoutError. Sizes span the mailbox, eager and pipelined
// forms. The ranks that passed the odd size and every rank that waits on
// them must fail; a rank that needs nothing from its peers (a broadcast's
// root) may finish.
#include <gtest/gtest.h>

#include "collective_checks.h"

namespace torus::comm::ofi::test {
namespace {

struct SizeCase {
  std::string name;
  JobSpec spec;
  bool may_time_out = false;
};

class SizeMismatch : public testing::TestWithParam<SizeCase> {};

// Rank 1 passes one element more than the others.
TEST_P(SizeMismatch, IsAnErrorOnTheRanksThatDisagree) {
  const bool may_time_out = GetParam().may_time_out;
  expect_all_ok(run_job(GetParam().spec, [may_time_out](Backend& world, int rank) {
    const Duration t{2000};
    for (size_t base : {size_t{4}, size_t{1000}, size_t{50000}}) {
      const size_t n = base + (rank == 1 ? 1 : 0);
      const std::string c = " (count " + std::to_string(n) + ")";
      auto refused = [&](const std::function<void()>& op, const std::string& what) {
        Failure f = failure_of(op, what + " with disagreeing counts succeeded" + c);
        const bool named = f.message.find("disagree") != std::string::npos ||
                           f.message.find("different sizes") != std::string::npos;
        const bool timed_out = f.message.find("timed out") != std::string::npos;
        require(named || (may_time_out && timed_out), what + ": unclear failure" + c + ": " + f.message);
      };
      // A failed op breaks the group: each case runs on a fresh one.
      auto fresh = [&] { return world.split(0, rank, "sizes", kT); };
      {
        auto g = fresh();
        std::vector<float> x(n, 1.f + rank);
        refused([&] { g->all_reduce(x.data(), x.data(), n, DType::kF32, ReduceOp::kSum, t)->wait(); },
                "all_reduce");
      }
      {
        auto g = fresh();
        std::vector<float> x(n, 1.f), y(n * static_cast<size_t>(g->size()));
        refused([&] { g->all_gather(x.data(), y.data(), n, DType::kF32, t)->wait(); }, "all_gather");
      }
      {
        auto g = fresh();
        std::vector<float> x(n * static_cast<size_t>(g->size()), 1.f), y(n);
        refused([&] { g->reduce_scatter(x.data(), y.data(), n, DType::kF32, ReduceOp::kSum, t)->wait(); },
                "reduce_scatter");
      }
      {
        // Root 0 passes the common size; rank 1 must not take its data.
        auto g = fresh();
        std::vector<float> x(n, 2.f);
        if (rank == 1) {
          refused([&] { g->broadcast(x.data(), n, DType::kF32, 0, t)->wait(); }, "broadcast");
        } else {
          try {
            g->broadcast(x.data(), n, DType::kF32, 0, t)->wait();
          } catch (const Error&) {
            // Ranks that wait on rank 1 (a relay) fail too.
          }
        }
      }
      {
        // Root 1 is the odd one and waits on everybody.
        auto g = fresh();
        std::vector<float> x(n, 1.f), y(n);
        if (rank == 1) {
          refused([&] { g->reduce(x.data(), y.data(), n, DType::kF32, ReduceOp::kSum, 1, t)->wait(); }, "reduce");
        } else {
          try {
            g->reduce(x.data(), y.data(), n, DType::kF32, ReduceOp::kSum, 1, t)->wait();
          } catch (const Error&) {
          }
        }
      }
      world.barrier(kT)->wait();
    }
  }));
}

SizeCase host_segment(int n) {
  SizeCase c{"segment_np" + std::to_string(n), one_host(n, "shm")};
  return c;
}
SizeCase provider(int n, const std::string& prov) {
  SizeCase c{prov + "_np" + std::to_string(n), one_host(n, prov, /*host_shm=*/false), true};
  c.spec.options.chunk_bytes = 16384;
  return c;
}

INSTANTIATE_TEST_SUITE_P(Ofi, SizeMismatch,
                         testing::Values(host_segment(2), host_segment(3), provider(2, "shm"), provider(3, "tcp")),
                         [](const testing::TestParamInfo<SizeCase>& i) { return i.param.name; });

}  // namespace
}  // namespace torus::comm::ofi::test
