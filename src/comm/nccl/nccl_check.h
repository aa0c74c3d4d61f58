// Private: the one check macro for NCCL, and the error text helpers.
//
//   TORUS_CHECK_NCCL(ncclGetUniqueId(&id), nullptr);
//
// throws (InvalidArgument for ncclInvalidArgument/ncclInvalidUsage, else
// CommError) "NCCL error: ncclGetUniqueId(&id) failed: <ncclGetErrorString>
// (<ncclGetLastError>) at file:line" unless the call returns ncclSuccess.
// Calls on non-blocking communicators that may return ncclInProgress are
// checked with nccl_ok_or_in_progress() instead.
#pragma once

#include <nccl.h>

#include <string>

namespace torus::comm::nccl {

// "unhandled system error (run with NCCL_DEBUG=INFO for details): <last error>"
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm);

[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* expr, ncclComm_t comm, const char* file,
                                   int line);

inline bool nccl_ok_or_in_progress(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

}  // namespace torus::comm::nccl

#define TORUS_CHECK_NCCL(expr, handle)                                                           \
  do {                                                                                           \
    ncclResult_t torus_nccl_res_ = (expr);                                                       \
    if (torus_nccl_res_ != ncclSuccess) [[unlikely]] {                                           \
      ::torus::comm::nccl::throw_nccl_error(torus_nccl_res_, #expr, (handle), __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)
