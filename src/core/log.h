// Private: formatting log macros and the argument check macro for library
// code. fmt syntax: TORUS_LOG_INFO("rank {} joined {}", r, name).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "torus/core/error.h"
#include "torus/core/logging.h"

#define TORUS_LOG_AT(level, ...)                                   \
  do {                                                             \
    if (::torus::log_enabled(level)) {                             \
      ::torus::log_message(level, ::fmt::format(__VA_ARGS__));     \
    }                                                              \
  } while (0)

#define TORUS_LOG_TRACE(...) TORUS_LOG_AT(::torus::LogLevel::kTrace, __VA_ARGS__)
#define TORUS_LOG_DEBUG(...) TORUS_LOG_AT(::torus::LogLevel::kDebug, __VA_ARGS__)
#define TORUS_LOG_INFO(...) TORUS_LOG_AT(::torus::LogLevel::kInfo, __VA_ARGS__)
#define TORUS_LOG_WARN(...) TORUS_LOG_AT(::torus::LogLevel::kWarn, __VA_ARGS__)
#define TORUS_LOG_ERROR(...) TORUS_LOG_AT(::torus::LogLevel::kError, __VA_ARGS__)

// Throws `ExcType` with a formatted message when `cond` is false:
//   TORUS_CHECK(n >= 0, InvalidArgument, "count must be >= 0, got {}", n);
#define TORUS_CHECK(cond, ExcType, ...)                                  \
  do {                                                                   \
    if (!(cond)) [[unlikely]] {                                          \
      throw ::torus::ExcType(::fmt::format(__VA_ARGS__));                \
    }                                                                    \
  } while (0)

// Throws torus::Error for a failed system call, with errno's text and
// file:line: TORUS_CHECK_SYS(::bind(fd, ...), "bind {}", addr).
#define TORUS_CHECK_SYS(expr, ...)                                                        \
  do {                                                                                    \
    if ((expr) < 0) [[unlikely]] {                                                        \
      int torus_errno_ = errno;                                                           \
      throw ::torus::CommError(::fmt::format("{}: {} ({}:{})", ::fmt::format(__VA_ARGS__), \
                                             ::torus::detail::errno_string(torus_errno_),   \
                                             __FILE__, __LINE__));                        \
    }                                                                                     \
  } while (0)

namespace torus::detail {
std::string errno_string(int err);
}  // namespace torus::detail
