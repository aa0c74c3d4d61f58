// Private: the one check macro for libfabric calls.
//
// TORUS_CHECK_OFI(expr, fmt, args...) evaluates a libfabric call returning an
// int/ssize_t and throws torus::CommError when it is negative, with the
// caller's message, libfabric's own error string (fi_strerror), the error
// number and file:line. Error policy (as in aws-ofi-nccl): hot, retriable
// paths (posting while the queue is full, polling a completion queue) look
// at the return code themselves; everything else goes through this macro.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <string>

#include "core/log.h"

namespace torus::comm::ofi {

// "Connection refused (-111)" for a negative libfabric return code.
inline std::string ofi_error_string(long rc) {
  long e = rc < 0 ? -rc : rc;
  return fmt::format("{} ({})", fi_strerror(static_cast<int>(e)), rc);
}

}  // namespace torus::comm::ofi

#define TORUS_CHECK_OFI(expr, ...)                                                                       \
  do {                                                                                                   \
    long torus_ofi_rc_ = static_cast<long>(expr);                                                        \
    if (torus_ofi_rc_ < 0) [[unlikely]] {                                                                \
      throw ::torus::CommError(::fmt::format("{}: {} ({}:{})", ::fmt::format(__VA_ARGS__),               \
                                             ::torus::comm::ofi::ofi_error_string(torus_ofi_rc_),        \
                                             __FILE__, __LINE__));                                       \
    }                                                                                                    \
  } while (0)
