// torus/run/metrics.h — what a training run reports: JSON Lines metric
// files (JSON through nlohmann-json), a terminal progress bar, the one-line
// step summary, and process memory. LibTorch-free.
//
//   JsonlWriter log("run/metrics.jsonl");
//   log.write({{"event", "step"}, {"step", step}, {"loss", loss}});   // nlohmann::ordered_json
//
//   ProgressBar bar(total_steps);              // draws only if stderr is a terminal
//   bar.update(step + 1, tokens_per_s);
//   bar.finish();
//
//   TORUS_LOG_INFO("{}", format_step_line({.step = 40, .loss = 2.31, ...}));
//   // step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB
#pragma once

#include "torus/core/format.h"  // format_bytes, format_duration

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <limits>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torus::run {

// Appends one JSON object per line to a file (JSON Lines), flushing after
// each line so a crashed run keeps every line written. Not thread safe.
class JsonlWriter {
 public:
  // Opens `path` for appending (or truncates it when `truncate`). Throws
  // torus::Error naming the path and errno's text if it cannot be opened.
  explicit JsonlWriter(const std::string& path, bool truncate = false);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  // Writes `record` as one line of JSON and '\n', then flushes: keys in
  // insertion order, non-finite numbers as null, invalid UTF-8 bytes as
  // U+FFFD (so raw model samples stay valid JSON). Throws torus::Error if
  // the write fails. Blocks on file I/O.
  void write(const nlohmann::ordered_json& record);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// A one-line progress bar redrawn in place with '\r':
//   [######........................] 40/200 step | 1520 tok/s | eta 1m12s
// It draws only when its output is a terminal (isatty), so logs and pipes
// stay clean; otherwise every call is a no-op. Not thread safe; call from the
// thread that owns the output.
class ProgressBar {
 public:
  // Draws on `out` (stderr by default) if fileno(out) is a terminal. The ETA
  // is measured from construction.
  explicit ProgressBar(int64_t total, std::FILE* out = stderr, int width = 30);
  // Draws on `out` exactly when `enabled` (tests, or a caller that knows).
  ProgressBar(int64_t total, std::ostream& out, bool enabled, int width = 30);
  ~ProgressBar();  // finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }

  // Redraws for `done` of `total` steps at `tokens_per_s` (NaN or < 0:
  // omitted); the ETA is elapsed / done * (total - done).
  void update(int64_t done, double tokens_per_s);
  // Erases the bar's line (so a log line can be printed); the next update()
  // draws it again.
  void clear();
  // Ends the bar's line with '\n' if anything is drawn; later updates start a
  // new line.
  void finish();

  // The text of one bar without '\r' (eta_s < 0: "eta ?"). Pure; for tests.
  static std::string render(int64_t done, int64_t total, double tokens_per_s, double eta_s, int width = 30);

 private:
  void emit(std::string_view text);

  int64_t total_;
  int width_;
  std::FILE* file_ = nullptr;
  std::ostream* stream_ = nullptr;
  bool enabled_ = false;
  bool drawn_ = false;
  size_t last_len_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// The fields of one step line. A NaN field is left out of the line (except
// step), e.g. val_loss on steps without evaluation, or mfu when the peak
// FLOP/s of the device is unknown.
struct StepLine {
  int64_t step = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double lr = std::numeric_limits<double>::quiet_NaN();
  double tokens_per_s = std::numeric_limits<double>::quiet_NaN();
  double mfu = std::numeric_limits<double>::quiet_NaN();  // a fraction: 0.11 prints "MFU 11%"
  double mem_bytes = std::numeric_limits<double>::quiet_NaN();
  double loss_scale = std::numeric_limits<double>::quiet_NaN();  // fp16 runs: "scale 65536"
  int64_t skipped = -1;  // steps skipped so far (fp16 overflow); < 0: left out
  // MoE models: "aux 1.02 | drop 2.1% | imb 1.35" (mean aux loss over layers,
  // dropped share of the assignments, max/mean tokens per expert).
  double aux_loss = std::numeric_limits<double>::quiet_NaN();
  double drop_rate = std::numeric_limits<double>::quiet_NaN();
  double imbalance = std::numeric_limits<double>::quiet_NaN();
};

// "step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s |
// MFU 11% | mem 1.3 GiB" (+ " | scale 32768 | skipped 2" with a loss
// scale): losses and grad norm with 2 decimals (grad norms
// below 0.01 as 1.2e-3), lr as a 2-digit mantissa and exponent, tok/s
// rounded, MFU in whole percent (one decimal below 10%), memory by
// format_bytes().
std::string format_step_line(const StepLine& s);

// Peak resident set size of this process in bytes (getrusage ru_maxrss);
// 0 if unavailable.
int64_t peak_rss_bytes();

// Current resident set size in bytes (/proc/self/statm); 0 if unavailable.
int64_t current_rss_bytes();

}  // namespace torus::run
