// bench/collectives/mpi_peer.cpp — torus-bench-mpi-peer: the same benchmark
// as torus-bench-comm, calling Open MPI directly (MPI_Allreduce, ...), with no
// Torus in the path, so that Torus's overhead over MPI is visible side by
// side. f32 and sum only.
//
//   mpirun -np 2 torus-bench-mpi-peer -b 8 -e 256M -f 2 --json mpi.json
//
// It shares with torus-bench-comm the sweep, the data pattern, the timing
// (median over iterations of the slowest rank's time), the table and the JSON
// records (bench/common). Placements follow bench/comm/collective_case.h,
// except in-place reduce_scatter, where MPI_IN_PLACE leaves the block at the
// start of the buffer rather than at rank * block.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "common/membw.h"
#include "common/options.h"
#include "common/pattern.h"
#include "common/report.h"
#include "common/sweep.h"

namespace torus::bench {
namespace {

enum class Placement { kOutOfPlace, kInPlace };

// One op at one size: buffers, data, the MPI call, the check.
class MpiCase {
 public:
  MpiCase(const std::string& op, size_t bytes, int rank, int n) : op_(op), rank_(rank), n_(n) {
    count_ = op_count(op, bytes, sizeof(float), n);
    block_ = op_splits_per_rank(op) ? count_ / n : count_;
    pattern_.m = modulus_for(int64_t{1} << 24, n);
    in_.resize(op == "all_gather" ? block_ : op == "broadcast" ? 0 : count_);
    out_.resize(op == "reduce_scatter" ? block_ : count_);
  }

  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(float); }
  bool has(Placement p) const {
    if (op_ == "all_to_all") return p == Placement::kOutOfPlace;
    if (op_ == "broadcast") return p == Placement::kInPlace;
    return true;
  }

  void prepare(Placement p) {
    std::memset(out_.data(), 0xff, out_.size() * sizeof(float));  // NaN
    const bool ip = p == Placement::kInPlace;
    if (op_ == "all_to_all") {
      for (int d = 0; d < n_; ++d) fill(in_.data() + d * block_, block_, pattern_.table(rank_, d));
    } else if (op_ == "broadcast") {
      fill(out_.data(), count_, pattern_.table(rank_, 0));
    } else if (op_ == "all_gather") {
      fill(ip ? out_.data() + rank_ * block_ : in_.data(), block_, pattern_.table(rank_, 0));
    } else if (op_ == "reduce_scatter" || !ip) {
      fill(in_.data(), count_, pattern_.table(rank_, 0));  // reduce_scatter in place: MPI's recvbuf is in_
    } else {
      fill(out_.data(), count_, pattern_.table(rank_, 0));
    }
  }

  void issue(Placement p) {
    const bool ip = p == Placement::kInPlace;
    const int c = static_cast<int>(count_), b = static_cast<int>(block_);
    const void* in = ip ? MPI_IN_PLACE : in_.data();
    if (op_ == "all_reduce") {
      MPI_Allreduce(in, out_.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op_ == "reduce_scatter") {
      MPI_Reduce_scatter_block(in, ip ? in_.data() : out_.data(), b, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op_ == "all_gather") {
      MPI_Allgather(in, b, MPI_FLOAT, out_.data(), b, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op_ == "all_to_all") {
      MPI_Alltoall(in_.data(), b, MPI_FLOAT, out_.data(), b, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op_ == "broadcast") {
      MPI_Bcast(out_.data(), c, MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else if (op_ == "reduce") {
      // MPI_IN_PLACE is only valid at the root; elsewhere the data is sent from out_.
      const void* send = ip ? (rank_ == 0 ? MPI_IN_PLACE : out_.data()) : in_.data();
      MPI_Reduce(send, out_.data(), c, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    }
  }

  int64_t wrong(Placement p) const {
    const auto sum = pattern_.reduced_table(n_, "sum");
    if (op_ == "all_reduce") return count_wrong(out_.data(), count_, sum, 0);
    if (op_ == "reduce") return rank_ == 0 ? count_wrong(out_.data(), count_, sum, 0) : 0;
    if (op_ == "reduce_scatter") {
      return count_wrong(p == Placement::kInPlace ? in_.data() : out_.data(), block_, sum, rank_ * block_);
    }
    if (op_ == "broadcast") return count_wrong(out_.data(), count_, pattern_.table(0, 0), 0);
    int64_t wrong = 0;  // all_gather, all_to_all
    for (int s = 0; s < n_; ++s) {
      const auto expected = op_ == "all_gather" ? pattern_.table(s, 0) : pattern_.table(s, rank_);
      wrong += count_wrong(out_.data() + s * block_, block_, expected, 0);
    }
    return wrong;
  }

 private:
  static void fill(float* p, size_t count, const std::vector<int64_t>& table) {
    for_each_expected(table, 0, count, [&](size_t i, int64_t v) { p[i] = static_cast<float>(v); });
  }
  static int64_t count_wrong(const float* p, size_t count, const std::vector<int64_t>& table, size_t first) {
    int64_t wrong = 0;
    for_each_expected(table, first, count, [&](size_t i, int64_t v) { wrong += p[i] != static_cast<float>(v); });
    return wrong;
  }

  std::string op_;
  int rank_, n_;
  size_t count_, block_;
  Pattern pattern_;
  std::vector<float> in_, out_;
};

Record measure(MpiCase& c, Placement p, const std::string& op, int n, const SweepOptions& o) {
  Record r;
  r.backend = "openmpi";
  r.op = op;
  r.ranks = n;
  r.bytes = c.bytes();
  r.count = c.count();
  r.dtype = "f32";
  r.redop = op == "all_reduce" || op == "reduce_scatter" || op == "reduce" ? "sum" : "none";
  r.root = op == "broadcast" || op == "reduce" ? 0 : -1;
  r.in_place = p == Placement::kInPlace;
  r.iters = iterations_for(c.bytes(), o.iters, o.iter_budget);
  const int warmup = o.warmup == 0 ? 0 : warmup_for(c.bytes(), o.warmup, o.iter_budget);

  c.prepare(p);
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < warmup; ++i) c.issue(p);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<double> us(static_cast<size_t>(r.iters));
  for (double& t : us) {
    const auto t0 = std::chrono::steady_clock::now();
    c.issue(p);
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  MPI_Allreduce(MPI_IN_PLACE, us.data(), static_cast<int>(us.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  r.time_us = median(us);
  if (o.check) {
    c.prepare(p);
    c.issue(p);
    long long wrong = c.wrong(p);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    r.wrong = wrong;
  }
  derive_bandwidth(r);
  return r;
}

int run(const SweepOptions& o) {
  // Before MPI_Init, every rank may probe; only rank 0 does (OMPI_COMM_WORLD_RANK),
  // so that the others do not share the memory system with it.
  std::optional<MemcpyProbe> probe;
  const char* env_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (o.probe && (env_rank == nullptr || std::string(env_rank) == "0")) probe = memcpy_probe();

  MPI_Init(nullptr, nullptr);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (rank != 0) probe.reset();
  Report report(rank == 0 ? stdout : nullptr);
  report.preamble("torus-bench-mpi-peer", "openmpi (direct MPI calls)", n, "f32", "sum", o.iters, o.warmup,
                  o.iter_budget, o.check, probe);
  {
    // As torus-bench-comm (SweepOptions::settle_ms): let the scheduler spread the ranks.
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(o.settle_ms);
    double go = 1;
    while (go > 0) {
      go = (rank == 0 && std::chrono::steady_clock::now() < end) ? 1.0 : 0.0;
      MPI_Allreduce(MPI_IN_PLACE, &go, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
  }
  int index = 0;
  for (const std::string& op : o.ops) {
    report.begin_op(op, ++index, static_cast<int>(o.ops.size()));
    for (size_t bytes : o.sweep()) {
      MpiCase c(op, bytes, rank, n);
      Row row;
      for (Placement p : {Placement::kOutOfPlace, Placement::kInPlace}) {
        if (c.has(p)) (p == Placement::kInPlace ? row.in_place : row.out_of_place) = measure(c, p, op, n, o);
      }
      report.row(row);
    }
  }
  const int64_t wrong = report.summary();
  int status = wrong == 0 ? 0 : 2;
  if (rank == 0 && !o.json.empty() && !write_json(o.json, report.records(), probe)) status = 1;
  MPI_Finalize();
  return status;
}

}  // namespace
}  // namespace torus::bench

int main(int argc, char** argv) {
  using namespace torus::bench;
  SweepOptions o;
  try {
    Cli cli;
    add_sweep_options(cli, o, all_op_names(), all_op_names());
    cli.parse(argc, argv);
    check_sweep_options(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-mpi-peer: %s\n", e.what());
    return 1;
  }
  if (o.help) {
    std::printf(
        "torus-bench-mpi-peer — the collective benchmark on raw Open MPI calls (f32, sum), for\n"
        "comparison with torus-bench-comm; same columns, timing and checks.\n\n"
        "Usage: mpirun -np N torus-bench-mpi-peer [options]\n\n%s",
        sweep_options_help().c_str());
    return 0;
  }
  return run(o);
}
