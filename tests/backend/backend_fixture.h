// Backend conformance suite: the world backend under test and the helpers
// every test file shares.
//
// The suite runs on every rank of an mpirun job; all ranks run all tests in
// the same order, so every collective a test issues is matched. Tests check
// with EXPECT_* (never return early between collectives) so that a failure on
// one rank does not leave the others waiting.
//
// Configuration (environment):
//   TORUS_TEST_BACKEND        host backend name, default "mpi"
//   TORUS_TEST_TIMEOUT_MS     deadline of ordinary ops, default 60000
//   TORUS_TEST_FAULT_TIMEOUT_MS  deadline of the ops that are meant to time
//                             out, default 2000
//   TORUS_TEST_FAULT_MARGIN_MS   how late past its deadline a timeout may be
//                             reported, default 4000 (oversubscribed cores)
//
// Values are small integers, exact in every dtype (bf16 has 8 significant
// bits, u8 wraps at 256): rank r contributes value(r, i) in 1..13, or
// prod_value(r, i) in 1..2 for kProd, so that sums of up to 19 ranks and
// products of up to 7 ranks stay exact. Expected results are closed forms
// over the ranks, computed in double.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "torus/comm/backend.h"
#include "torus/core/dtype.h"

namespace torus::comm::test {

// The world backend of this process (set up once for the whole binary).
Backend& world();
BackendPtr world_ptr();
const std::string& backend_name();
Duration op_timeout();
Duration fault_timeout();
Duration fault_margin();

// A host buffer of n elements of dtype t with element access through double.
class Buf {
 public:
  Buf(DType t, size_t n, double fill = 0);
  DType dtype() const { return dtype_; }
  size_t size() const { return n_; }
  void* data() { return words_.data(); }
  const void* data() const { return words_.data(); }
  // Address of element i (i == size() allowed).
  char* at(size_t i) { return reinterpret_cast<char*>(words_.data()) + i * dtype_size(dtype_); }
  void set(size_t i, double v);
  double get(size_t i) const;

 private:
  DType dtype_;
  size_t n_;
  std::vector<uint64_t> words_;  // 8-byte aligned storage
};

// Contributions (see above).
double value(int rank, size_t i);
double prod_value(int rank, size_t i);
double input(ReduceOp op, int rank, size_t i);  // value or prod_value
// The reduction over ranks [0, n) of input(op, r, i), as the backend must
// deliver it in dtype t (kAvg: truncated for integers, exact quotient for
// floating types, compared with tolerance()).
double expected_reduce(ReduceOp op, DType t, int n, size_t i);
double tolerance(DType t, ReduceOp op, double expected);
constexpr double kSentinel = 99;  // fills outputs that must be overwritten or left alone

// EXPECTs that buf[offset + i] matches want(i) for i < n (within tol(i) when
// given), reporting the first mismatch and their number.
void expect_values(const Buf& buf, size_t offset, size_t n, const std::function<double(size_t)>& want,
                   const std::string& what, const std::function<double(size_t)>& tol = {});

// Waits for `work`; a failure is reported (ADD_FAILURE) instead of thrown.
void wait_ok(const WorkPtr& work, const std::string& what);

// EXPECTs that `fn` fails with CommError, either thrown by the issue call or
// by waiting on the Work it returns; returns the message.
std::string expect_comm_error(const std::function<WorkPtr()>& fn, const std::string& what);

// "f32 sum count 7 in-place", for SCOPED_TRACE.
std::string case_name(DType t, size_t count, bool in_place, const std::string& extra = "");

inline constexpr size_t kCounts[] = {0, 1, 7, 1031, size_t{1} << 18};

// gtest parameter name for a DType.
struct DTypeName {
  std::string operator()(const testing::TestParamInfo<DType>& info) const;
};

}  // namespace torus::comm::test
