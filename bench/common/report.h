// bench/common/report.h — the output of the collective benchmarks: the
// nccl-tests table on stdout and the JSON records, shared by torus-bench-comm
// and the raw Open MPI peer so their outputs line up column for column.
//
// Table (one section per op; see bench/README.md for the columns):
//                                          out-of-place                  in-place
//   size  count  type  redop  root   time algbw busbw #wrong   time algbw busbw #wrong  iters
//
// JSON: a list of records, one per (op, size, placement),
//   {"backend", "op", "ranks", "bytes", "count", "dtype", "redop", "root",
//    "in_place", "iters", "time_us", "algbw_gbps", "busbw_gbps", "wrong"}
// plus {"probe": "memcpy", "bytes", "gbps"} when a probe ran. "wrong" is -1
// when the result was not checked. Standard library only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "membw.h"

namespace torus::bench {

struct Record {
  std::string backend;
  std::string op;
  int ranks = 0;
  size_t bytes = 0;
  size_t count = 0;
  std::string dtype;
  std::string redop;  // "-" for ops without a reduction
  int root = -1;      // -1 for rootless ops
  bool in_place = false;
  int iters = 0;
  double time_us = 0;  // median over iterations of the slowest rank's time
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  int64_t wrong = -1;  // summed over ranks; -1: not checked
};

// Fills algbw/busbw of `r` from bytes, time_us, op and ranks.
void derive_bandwidth(Record& r);

// A table row: out-of-place and in-place results of one op at one size;
// either may be absent (the op has no such form, or it is not supported).
struct Row {
  std::optional<Record> out_of_place;
  std::optional<Record> in_place;
};

class Report {
 public:
  // `out` receives the table (rank 0 only passes stdout; others pass null).
  explicit Report(std::FILE* out) : out_(out) {}

  // Header lines: what runs, how time is taken, and the probe beside it.
  void preamble(const std::string& tool, const std::string& backend, int ranks, const std::string& dtype,
                const std::string& redop, int iters, int warmup, size_t iter_budget, bool check,
                const std::optional<MemcpyProbe>& probe);
  void begin_op(const std::string& op, int index, int total);
  void row(const Row& row);            // prints it at once (progress) and keeps its records
  void note(const std::string& line);  // "# line"
  // Per-op and overall average busbw, #wrong totals; returns total #wrong.
  int64_t summary();

  const std::vector<Record>& records() const { return records_; }

 private:
  std::FILE* out_;
  std::optional<MemcpyProbe> probe_;
  std::vector<Record> records_;
  std::vector<std::string> op_order_;
};

// Writes `records` (and the probe record, if any) as a JSON list to `path`.
// Returns false (and prints why on stderr) if the file cannot be written.
bool write_json(const std::string& path, const std::vector<Record>& records, const std::optional<MemcpyProbe>& probe);

}  // namespace torus::bench
