// Measured peaks kept per host (torus/device/peak_cache.h).
#include "torus/device/peak_cache.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "torus/config.h"
#include "torus/core/params.h"

namespace torus::device {
namespace {

using Json = nlohmann::json;
constexpr const char* kFormat = "torus-peak-cache-1";

bool same_key(const Json& e, const PeakKey& k) {
  return e.value("host", "") == k.host && e.value("cpu", "") == k.cpu_model && e.value("dtype", "") == k.dtype &&
         e.value("threads", -1) == k.threads && e.value("torus", "") == k.version;
}

// The file's entries, or an empty list (with a warning when it exists but
// does not parse).
Json read_entries(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Json::array();
  try {
    Json j = Json::parse(in);
    if (j.value("format", "") == kFormat && j.contains("entries") && j["entries"].is_array()) return j["entries"];
  } catch (const Json::exception&) {
  }
  TORUS_LOG_WARN("peak cache: '{}' is not a {} file; ignored (it is rewritten at the next measurement)", path, kFormat);
  return Json::array();
}

}  // namespace

PeakKey host_peak_key(const std::string& dtype, int threads) {
  PeakKey k;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) k.host = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    const size_t value = colon == std::string::npos ? colon : line.find_first_not_of(" \t", colon + 1);
    if (value != std::string::npos) k.cpu_model = line.substr(value);
    break;
  }
  k.dtype = dtype;
  k.threads = threads;
  k.version = TORUS_VERSION;
  return k;
}

const std::string& peak_cache_path() {
  return env_params().peak_cache;
}

std::optional<CachedPeak> read_cached_peak(const std::string& path, const PeakKey& key) {
  if (path.empty()) return std::nullopt;
  for (const Json& e : read_entries(path)) {
    if (!e.is_object() || !same_key(e, key)) continue;
    const double flops = e.value("flops", 0.0);
    if (!(flops > 0)) continue;
    return CachedPeak{flops, e.value("measured_unix", int64_t{0})};
  }
  return std::nullopt;
}

void write_cached_peak(const std::string& path, const PeakKey& key, double flops) {
  if (path.empty()) return;
  Json entries = Json::array();
  for (const Json& e : read_entries(path)) {
    if (e.is_object() && !same_key(e, key)) entries.push_back(e);
  }
  entries.push_back({{"host", key.host},
                     {"cpu", key.cpu_model},
                     {"dtype", key.dtype},
                     {"threads", key.threads},
                     {"torus", key.version},
                     {"flops", flops},
                     {"measured_unix", static_cast<int64_t>(std::time(nullptr))}});
  const Json doc = {{"format", kFormat}, {"entries", entries}};
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump(1) << '\n';
    out.close();
    if (!out) {
      TORUS_LOG_WARN("peak cache: cannot write '{}'; the peak is not kept", tmp);
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    TORUS_LOG_WARN("peak cache: cannot rename '{}' to '{}': {}; the peak is not kept", tmp, path, ec.message());
    std::filesystem::remove(tmp, ec);
  }
}

std::string format_utc_date(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace torus::device
