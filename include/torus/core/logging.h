// torus/core/logging.h — the rank-prefixed logger.
//
// One process-wide logger writes lines of the form
//   [torus 2026-11-29 16:05:12.123 r3/4 I] message
// to stderr. The level comes from TORUS_LOG_LEVEL (trace, debug, info, warn,
// error, off; default info) and can be changed at run time. The rank prefix is
// set once the bootstrap knows the rank ("r?" before that).
//
// Thread safe: each line is written with a single write(2) call. This header
// carries no formatting library; library code formats through the private
// macros TORUS_LOG_INFO(...) etc. (src/core/log.h, fmt syntax).
#pragma once

#include <string_view>

namespace torus {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// Parses "trace".."off" (case-insensitive) or "0".."5"; throws InvalidArgument.
LogLevel parse_log_level(std::string_view s);
std::string_view log_level_name(LogLevel level);

void set_log_level(LogLevel level);
LogLevel log_level();
inline bool log_enabled(LogLevel level) { return level >= log_level(); }

// Sets the "rN/W" prefix; called by the bootstrap.
void set_log_rank(int rank, int world_size);

// Writes one line (a trailing newline is added) if `level` is enabled.
void log_message(LogLevel level, std::string_view message);

}  // namespace torus
