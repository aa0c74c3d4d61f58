// JSON Lines writer, progress bar, step-line formatting and RSS helpers.
#include "torus/run/metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <ostream>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "torus/core/error.h"

namespace torus::run {
namespace {

// "3.0e-04" -> "3.0e-4", "1.0e+00" -> "1.0e0".
std::string compact_exponent(double v, int decimals) {
  std::string s = fmt::format("{:.{}e}", v, decimals);
  size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e);
  std::string exp = s.substr(e + 1);
  bool neg = !exp.empty() && exp[0] == '-';
  size_t k = (!exp.empty() && (exp[0] == '-' || exp[0] == '+')) ? 1 : 0;
  while (k + 1 < exp.size() && exp[k] == '0') ++k;
  return mant + "e" + (neg ? "-" : "") + exp.substr(k);
}

}  // namespace

// --- JsonlWriter ----------------------------------------------------------------

JsonlWriter::JsonlWriter(const std::string& path, bool truncate) : path_(path) {
  file_ = std::fopen(path.c_str(), truncate ? "w" : "a");
  if (file_ == nullptr) {
    int err = errno;
    throw Error(fmt::format("cannot open metrics file '{}': {}", path, ::torus::detail::errno_string(err)));
  }
}

JsonlWriter::~JsonlWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonlWriter::write(const nlohmann::ordered_json& record) {
  std::string line = record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  line.push_back('\n');
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    int err = errno;
    throw Error(fmt::format("cannot write metrics file '{}': {}", path_, ::torus::detail::errno_string(err)));
  }
}

// --- ProgressBar ----------------------------------------------------------------

ProgressBar::ProgressBar(int64_t total, std::FILE* out, int width)
    : total_(total), width_(width), file_(out), start_(std::chrono::steady_clock::now()) {
  enabled_ = out != nullptr && ::isatty(::fileno(out)) == 1;
}

ProgressBar::ProgressBar(int64_t total, std::ostream& out, bool enabled, int width)
    : total_(total), width_(width), stream_(&out), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  try {
    finish();
  } catch (...) {
  }
}

std::string ProgressBar::render(int64_t done, int64_t total, double tokens_per_s, double eta_s, int width) {
  width = std::max(width, 1);
  const double frac = total > 0 ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(std::floor(frac * width));
  std::string out = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
  out += fmt::format("{}/{} step", done, total);
  if (std::isfinite(tokens_per_s) && tokens_per_s >= 0) out += fmt::format(" | {:.0f} tok/s", tokens_per_s);
  out += " | eta " + format_duration(eta_s);
  return out;
}

void ProgressBar::emit(std::string_view text) {
  std::string line = "\r";
  line.append(text);
  if (text.size() < last_len_) line.append(last_len_ - text.size(), ' ');
  last_len_ = text.size();
  if (file_ != nullptr) {
    std::fputs(line.c_str(), file_);
    std::fflush(file_);
  } else if (stream_ != nullptr) {
    *stream_ << line << std::flush;
  }
}

void ProgressBar::update(int64_t done, double tokens_per_s) {
  if (!enabled_) return;
  double eta = -1;
  if (done > 0) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    eta = elapsed / static_cast<double>(done) * static_cast<double>(std::max<int64_t>(total_ - done, 0));
  }
  emit(render(done, total_, tokens_per_s, eta, width_));
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  emit("");
  emit("");  // back at column 0 over a blank line
  last_len_ = 0;
  drawn_ = false;
}

void ProgressBar::finish() {
  if (!enabled_ || !drawn_) return;
  if (file_ != nullptr) {
    std::fputs("\n", file_);
    std::fflush(file_);
  } else if (stream_ != nullptr) {
    *stream_ << '\n' << std::flush;
  }
  drawn_ = false;
  last_len_ = 0;
}

// --- formatting -----------------------------------------------------------------

std::string format_step_line(const StepLine& s) {
  std::string out = fmt::format("step {}", s.step);
  if (!std::isnan(s.loss)) out += fmt::format(" | loss {:.2f}", s.loss);
  if (!std::isnan(s.val_loss)) out += fmt::format(" | val {:.2f}", s.val_loss);
  if (!std::isnan(s.grad_norm)) {
    const double g = s.grad_norm;
    out += " | grad_norm " + ((g != 0 && std::fabs(g) < 0.01) ? compact_exponent(g, 1) : fmt::format("{:.2f}", g));
  }
  if (!std::isnan(s.lr)) out += " | lr " + compact_exponent(s.lr, 1);
  if (!std::isnan(s.tokens_per_s)) out += fmt::format(" | {:.0f} tok/s", s.tokens_per_s);
  if (!std::isnan(s.mfu)) {
    const double pct = s.mfu * 100;
    out += std::fabs(pct) < 10 ? fmt::format(" | MFU {:.1f}%", pct) : fmt::format(" | MFU {:.0f}%", pct);
  }
  if (!std::isnan(s.mem_bytes)) out += " | mem " + format_bytes(s.mem_bytes);
  if (!std::isnan(s.loss_scale)) out += fmt::format(" | scale {:g}", s.loss_scale);
  if (s.skipped >= 0) out += fmt::format(" | skipped {}", s.skipped);
  if (!std::isnan(s.aux_loss)) out += fmt::format(" | aux {:.3f}", s.aux_loss);
  if (!std::isnan(s.drop_rate)) out += fmt::format(" | drop {:.1f}%", s.drop_rate * 100);
  if (!std::isnan(s.imbalance)) out += fmt::format(" | imb {:.2f}", s.imbalance);
  return out;
}

// --- memory ---------------------------------------------------------------------

int64_t peak_rss_bytes() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
}

int64_t current_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? resident_pages * page : 0;
}

}  // namespace torus::run
