#include "torus/core/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <string>

#include "core/log.h"
#include "torus/core/params.h"

namespace torus {
namespace {

LogLevel initial_level() {
  // The logger must work before (and without) the parameter layer, so it
  // takes TORUS_LOG_LEVEL through a helper that never throws; env_params()
  // rejects a bad value at start-up.
  return initial_log_level_from_env();
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}
std::atomic<int> g_rank{-1};
std::atomic<int> g_world{0};

}  // namespace

LogLevel parse_log_level(std::string_view s) {
  std::string v(s);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "trace" || v == "0") return LogLevel::kTrace;
  if (v == "debug" || v == "1") return LogLevel::kDebug;
  if (v == "info" || v == "2") return LogLevel::kInfo;
  if (v == "warn" || v == "warning" || v == "3") return LogLevel::kWarn;
  if (v == "error" || v == "4") return LogLevel::kError;
  if (v == "off" || v == "none" || v == "5") return LogLevel::kOff;
  throw InvalidArgument(fmt::format("unknown log level '{}' (expected trace, debug, info, warn, error or off)", s));
}

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

void set_log_level(LogLevel level) { level_ref().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_ref().load(std::memory_order_relaxed)); }

void set_log_rank(int rank, int world_size) {
  g_rank.store(rank);
  g_world.store(world_size);
}

void log_message(LogLevel level, std::string_view message) {
  if (!log_enabled(level) || level == LogLevel::kOff) return;
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  int ms = static_cast<int>(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  static constexpr char kLetters[] = {'T', 'D', 'I', 'W', 'E', 'O'};
  int rank = g_rank.load(std::memory_order_relaxed);
  std::string who = rank < 0 ? std::string("r?") : fmt::format("r{}/{}", rank, g_world.load());
  std::string line = fmt::format("[torus {:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03} {} {}] {}\n", tm.tm_year + 1900,
                                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms, who,
                                 kLetters[static_cast<int>(level)], message);
  // One write(2) per line keeps lines from different threads whole.
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace torus
