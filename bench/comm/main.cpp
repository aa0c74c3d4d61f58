// bench/comm/main.cpp — torus-bench-comm: the collective benchmark of Torus,
// in the format of nccl-tests, for any host backend.
//
//   mpirun -np 2 build/bench/torus-bench-comm -b 1K -e 256M -f 2 --backend mpi
//
// For each op and size it times the out-of-place and in-place forms (see
// collective_case.h), reports the MEDIAN over iterations of the slowest
// rank's time per op, derives algbw and busbw (bench/README.md), and — unless
// --no-check — runs the op once more on fresh data and counts the elements
// that differ from the closed-form expectation (#wrong). Rank 0 prints the
// table as it goes, a summary, and the single-core memcpy probe beside it;
// --json writes the records. Exit status: 0 if every check passed, 2 if some
// element was wrong, 1 on error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "collective_case.h"
#include "common/membw.h"
#include "common/options.h"
#include "torus/comm/shared_host.h"
#include "common/report.h"
#include "common/sweep.h"
#include "torus/comm/context.h"
#include "torus/core/error.h"
#include "torus/core/params.h"

namespace torus::bench {
namespace {

using comm::Backend;
using comm::OpType;
using comm::ReduceOp;

struct Options {
  SweepOptions sweep;
  std::string backend;  // empty: the bootstrap's default
  DType dtype = DType::kF32;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;
  comm::Duration timeout{std::chrono::minutes(5)};
  bool list_backends = false;
  BufferKind buffers = BufferKind::kTensor;  // --buffers
};

void print_help() {
  std::printf(
      "torus-bench-comm — collective benchmark of Torus in the format of nccl-tests.\n\n"
      "Usage: mpirun -np N torus-bench-comm [options]\n"
      "   eg: mpirun -np 2 torus-bench-comm -b 1K -e 256M -f 2 --backend mpi --json out.json\n\n"
      "%s"
      "\nTorus:\n"
      "      --backend NAME     host backend: mpi or ofi (default: TORUS_BACKEND, else the bootstrap's: the fastest usable)\n"
      "  -d, --dtype NAME       f32 (default), f64, f16, bf16, i32, i64, u8\n"
      "  -o, --redop NAME       sum (default), max or min (the reductions whose results are exact)\n"
      "  -r, --root N           root of broadcast and reduce (default 0)\n"
      "      --timeout-ms MS    deadline of each op (default 300000)\n"
      "      --buffers KIND     tensor (default): LibTorch's CPU allocator, as torus::init sets it up (on ofi\n"
      "                         with 2+ ranks on a host: the shared host allocator, unless\n"
      "                         TORUS_SHARED_HOST_ALLOC=off); heap (or user): aligned_alloc, memory no peer\n"
      "                         can map; shared: torus::comm::shared_host_alloc\n"
      "      --list-backends    print the host backends built into this Torus, one a line, and exit\n\n"
      "Ops: all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, reduce.\n"
      "Time is the median over iterations of the slowest rank's time for one op. Columns and\n"
      "busbw factors: see bench/README.md. The memcpy probe runs on rank 0 before the bootstrap.\n",
      sweep_options_help().c_str());
}

Options parse(int argc, char** argv) {
  Cli cli;
  Options o;
  add_sweep_options(cli, o.sweep, all_op_names(), all_op_names());
  cli.option("--backend", [&o](const std::string& v) { o.backend = v; });
  cli.option("-d,--dtype", [&o](const std::string& v) { o.dtype = dtype_from_name(v); });
  cli.option("-o,--redop", [&o](const std::string& v) {
    o.redop = comm::reduce_op_from_name(v);
    if (o.redop != ReduceOp::kSum && o.redop != ReduceOp::kMax && o.redop != ReduceOp::kMin) {
      throw InvalidArgument("--redop must be sum, max or min (the others have no exact expectation here)");
    }
  });
  cli.option("-r,--root", [&o](const std::string& v) { o.root = std::stoi(v); });
  cli.option("--timeout-ms", [&o](const std::string& v) { o.timeout = comm::Duration(std::stoll(v)); });
  cli.flag("--list-backends", [&o] { o.list_backends = true; });
  cli.option("--buffers", [&o](const std::string& v) {
    if (v == "tensor") {
      o.buffers = BufferKind::kTensor;
    } else if (v == "heap" || v == "user") {
      o.buffers = BufferKind::kHeap;
    } else if (v == "shared") {
      o.buffers = BufferKind::kShared;
    } else {
      throw InvalidArgument("--buffers must be tensor, heap or shared, not " + v);
    }
  });
  cli.parse(argc, argv);
  check_sweep_options(o.sweep);
  return o;
}

bool is_reduction(OpType op) {
  return op == OpType::kAllReduce || op == OpType::kReduceScatter || op == OpType::kReduce;
}
bool has_root(OpType op) {
  return op == OpType::kBroadcast || op == OpType::kReduce;
}

// 8-byte all-reduces until rank 0 has spent `ms` in them (SweepOptions::
// settle_ms); the MAX of its go-on flag keeps every rank in step.
void settle(Backend& be, double ms, comm::Duration timeout) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  double go = 1;
  while (go > 0) {
    go = (be.rank() == 0 && std::chrono::steady_clock::now() < end) ? 1.0 : 0.0;
    be.all_reduce(&go, &go, 1, DType::kF64, ReduceOp::kMax, timeout)->wait();
  }
}

class Runner {
 public:
  Runner(Backend& backend, const Options& o, Report& report) : be_(backend), o_(o), report_(report) {}

  void run_op(OpType op) {
    const std::string name(comm::op_type_name(op));
    if (!be_.supports(op, o_.dtype, o_.redop)) {
      report_.note("skipped " + name + ": backend " + std::string(be_.name()) + " does not serve it for " +
                   std::string(dtype_name(o_.dtype)) + (is_reduction(op) ? "/" + reduce_name() : ""));
      return;
    }
    for (size_t bytes : o_.sweep.sweep()) {
      CollectiveCase c(be_, op, o_.dtype, o_.redop, o_.root, bytes, o_.timeout, o_.buffers);
      Row row;
      for (Placement p : {Placement::kOutOfPlace, Placement::kInPlace}) {
        if (!c.has(p)) continue;
        Record r = measure(c, p);
        r.op = name;
        r.redop = is_reduction(op) ? reduce_name() : "none";
        r.root = has_root(op) ? o_.root : -1;
        derive_bandwidth(r);
        (p == Placement::kInPlace ? row.in_place : row.out_of_place) = r;
      }
      report_.row(row);
    }
  }

 private:
  std::string reduce_name() const { return std::string(comm::reduce_op_name(o_.redop)); }

  void barrier() { be_.barrier(o_.timeout)->wait(); }

  Record measure(CollectiveCase& c, Placement p) {
    Record r;
    r.backend = std::string(be_.name());
    r.ranks = be_.size();
    r.bytes = c.bytes();
    r.count = c.count();
    r.dtype = std::string(dtype_name(o_.dtype));
    r.in_place = p == Placement::kInPlace;
    r.iters = iterations_for(c.bytes(), o_.sweep.iters, o_.sweep.iter_budget);
    const int warmup = o_.sweep.warmup == 0 ? 0 : warmup_for(c.bytes(), o_.sweep.warmup, o_.sweep.iter_budget);

    c.prepare(p);
    barrier();
    for (int i = 0; i < warmup; ++i) c.issue(p)->wait();
    barrier();
    // Each op is timed on its own; the ops run back to back, as in
    // nccl-tests, but the median of single ops is robust to the preemptions
    // an oversubscribed host inflicts.
    std::vector<double> us(static_cast<size_t>(r.iters));
    for (double& t : us) {
      const auto t0 = std::chrono::steady_clock::now();
      c.issue(p)->wait();
      t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    be_.all_reduce(us.data(), us.data(), us.size(), DType::kF64, ReduceOp::kMax, o_.timeout)->wait();
    r.time_us = median(us);

    if (o_.sweep.check) {
      c.prepare(p);
      c.issue(p)->wait();
      double wrong = static_cast<double>(c.wrong(p));
      be_.all_reduce(&wrong, &wrong, 1, DType::kF64, ReduceOp::kSum, o_.timeout)->wait();
      r.wrong = static_cast<int64_t>(wrong);
    }
    return r;
  }

  Backend& be_;
  const Options& o_;
  Report& report_;
};

int run(const Options& o) {
  comm::InitOptions init;
  init.host_backend = o.backend;

  // The probe runs before the bootstrap, on rank 0 alone, so that no
  // collective traffic shares the memory system with it.
  const comm::LaunchInfo launch = comm::detect_launch(init);
  std::optional<MemcpyProbe> probe;
  if (o.sweep.probe && launch.rank == 0) probe = memcpy_probe();

  auto ctx = comm::Context::create(init);
  // As torus::init does; the report says what the tensor buffers are.
  const bool shared_alloc = o.buffers == BufferKind::kTensor && comm::maybe_install_shared_host_allocator(*ctx);
  Backend& be = *ctx->host_backend();
  if (o.root < 0 || o.root >= be.size()) throw InvalidArgument("--root must be a rank of the world");
  const bool leader = be.rank() == 0;
  Report report(leader ? stdout : nullptr);
  report.preamble("torus-bench-comm", std::string(be.name()), be.size(), std::string(dtype_name(o.dtype)),
                  std::string(comm::reduce_op_name(o.redop)), o.sweep.iters, o.sweep.warmup, o.sweep.iter_budget,
                  o.sweep.check, probe);
  report.note(o.buffers == BufferKind::kHeap     ? "buffers: heap (aligned_alloc)"
              : o.buffers == BufferKind::kShared ? "buffers: shared_host_alloc"
              : shared_alloc                     ? "buffers: tensor storage from the shared host allocator"
                                                 : "buffers: tensor storage from LibTorch's CPU allocator");
  if (auto prov = env_lookup("FI_PROVIDER"); prov && be.name() == "ofi") report.note("FI_PROVIDER=" + *prov);

  try {
    settle(be, o.sweep.settle_ms, o.timeout);
    Runner runner(be, o, report);
    int index = 0;
    for (const std::string& op : o.sweep.ops) {
      report.begin_op(op, ++index, static_cast<int>(o.sweep.ops.size()));
      runner.run_op(comm::op_type_from_name(op));
    }
  } catch (const std::exception& e) {
    // Leave no peer waiting on this rank until its deadline.
    be.abort(e.what());
    throw;
  }
  const int64_t wrong = report.summary();
  if (leader && !o.sweep.json.empty() && !write_json(o.sweep.json, report.records(), probe)) return 1;
  return wrong == 0 ? 0 : 2;
}

}  // namespace
}  // namespace torus::bench

int main(int argc, char** argv) {
  torus::bench::Options options;
  try {
    options = torus::bench::parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-comm: %s\n", e.what());
    return 1;
  }
  if (options.sweep.help) {
    torus::bench::print_help();
    return 0;
  }
  if (options.list_backends) {
    for (const std::string& name : torus::comm::Context::available_host_backends()) std::printf("%s\n", name.c_str());
    return 0;
  }
  try {
    return torus::bench::run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torus-bench-comm: error: %s\n", e.what());
    return 1;
  }
}
