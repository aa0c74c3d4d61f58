// Private: the one check macro for Open MPI calls, and the dtype/op mapping
// of the mpi backend.
//
// Every communicator Torus creates has MPI_ERRORS_RETURN set, so MPI reports
// failures as return codes; TORUS_CHECK_MPI turns a code other than
// MPI_SUCCESS into a torus::CommError carrying MPI's own error string and
// file:line. Like every MPI call in Torus, it may only be used on the MPI
// progress thread (mpi_runtime.h).
#pragma once

#include <mpi.h>

#include <string>

#include "core/log.h"
#include "torus/comm/types.h"
#include "torus/core/dtype.h"

namespace torus::comm::mpi {

// MPI's text for an error code ("MPI_ERR_TRUNCATE: message truncated").
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", code);
  return std::string(text, static_cast<size_t>(len));
}

// Throws CommError("MPI_Comm_split(...) failed: <MPI's text> (file:line)").
#define TORUS_CHECK_MPI(expr)                                                                                        \
  do {                                                                                                               \
    int torus_mpi_rc_ = (expr);                                                                                      \
    if (torus_mpi_rc_ != MPI_SUCCESS) [[unlikely]] {                                                                 \
      throw ::torus::CommError(::fmt::format(                                                                        \
          "{} failed: {} ({}:{})", #expr, ::torus::comm::mpi::mpi_error_string(torus_mpi_rc_), __FILE__, __LINE__)); \
    }                                                                                                                \
  } while (0)

// The MPI datatype that moves (not reduces) elements of `t`: f16 and bf16
// travel as MPI_UINT16_T; reductions of them are staged in f32 instead.
inline MPI_Datatype mpi_transfer_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kF16:
    case DType::kBF16:
      return MPI_UINT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
  }
  throw InvalidArgument(fmt::format("invalid dtype value {}", static_cast<int>(t)));
}

// kAvg reduces with MPI_SUM; the division by the group size follows.
inline MPI_Op mpi_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kProd:
      return MPI_PROD;
  }
  throw InvalidArgument(fmt::format("invalid reduce op value {}", static_cast<int>(op)));
}

}  // namespace torus::comm::mpi
