// Metrics: the JSON Lines file (nlohmann-json records: order kept, NaN as
// null, invalid UTF-8 replaced), the step line and its number formats, the progress bar (drawn only
// when enabled; never on a non-terminal FILE*) and the RSS helpers.
#include "torus/run/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "torus/core/error.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(JsonlWriter, AppendsOneObjectPerLine) {
  char tmpl[] = "/tmp/torus_jsonl_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string path = tmpl;
  {
    JsonlWriter w(path);
    EXPECT_EQ(w.path(), path);
    w.write({{"step", 0}, {"loss", 5.5}});
    // Flushed after each line: readable before the writer closes.
    EXPECT_EQ(read_all(path), "{\"step\":0,\"loss\":5.5}\n");
    w.write({{"step", 1}, {"loss", NAN}, {"note", "two\nlines"}, {"raw", "a\xFF"}});
  }
  const std::string two = read_all(path);
  EXPECT_EQ(std::count(two.begin(), two.end(), '\n'), 2);
  // Parsed back by an independent reader of the same library: NaN became
  // null, the invalid byte U+FFFD, the key order is kept.
  const auto second = nlohmann::ordered_json::parse(two.substr(two.find('\n') + 1));
  EXPECT_TRUE(second["loss"].is_null());
  EXPECT_EQ(second["note"], "two\nlines");
  EXPECT_EQ(second["raw"], "a\xEF\xBF\xBD");
  EXPECT_EQ(second.begin().key(), "step");
  {
    JsonlWriter w(path);  // appends
    w.write({{"k", true}});
  }
  const std::string three = read_all(path);
  EXPECT_EQ(std::count(three.begin(), three.end(), '\n'), 3);
  EXPECT_EQ(three.substr(three.rfind('{')), "{\"k\":true}\n");
  {
    JsonlWriter w(path, /*truncate=*/true);
    w.write({{"k", false}});
  }
  EXPECT_EQ(read_all(path), "{\"k\":false}\n");
  std::remove(path.c_str());

  try {
    JsonlWriter w("/nonexistent-dir/metrics.jsonl");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/metrics.jsonl"), std::string::npos) << e.what();
  }
}

TEST(StepLine, ExactFormat) {
  StepLine s;
  s.step = 40;
  s.loss = 2.31;
  s.val_loss = 2.40;
  s.grad_norm = 0.82;
  s.lr = 3e-4;
  s.tokens_per_s = 1520;
  s.mfu = 0.11;
  s.mem_bytes = 1.3 * 1024 * 1024 * 1024;
  EXPECT_EQ(format_step_line(s),
            "step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB");
  s.val_loss = NAN;
  EXPECT_EQ(format_step_line(s),
            "step 40 | loss 2.31 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB");
  s.mfu = NAN;
  s.grad_norm = 0.00123;
  s.lr = 1.0;
  s.tokens_per_s = 987.6;
  s.mem_bytes = 512.0 * 1024 * 1024;
  EXPECT_EQ(format_step_line(s), "step 40 | loss 2.31 | grad_norm 1.2e-3 | lr 1.0e0 | 988 tok/s | mem 512.0 MiB");
  StepLine t;
  t.step = 7;
  t.mfu = 0.045;
  t.lr = 2.5e-5;
  EXPECT_EQ(format_step_line(t), "step 7 | lr 2.5e-5 | MFU 4.5%");
  EXPECT_EQ(format_step_line(StepLine{}), "step 0");
  t.loss_scale = 32768;
  t.skipped = 2;
  EXPECT_EQ(format_step_line(t), "step 7 | lr 2.5e-5 | MFU 4.5% | scale 32768 | skipped 2");
}

TEST(StepLine, BytesAndDurations) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(3 * 1024), "3.0 KiB");
  EXPECT_EQ(format_bytes(1536.0 * 1024 * 1024), "1.5 GiB");
  EXPECT_EQ(format_bytes(2.0 * 1024 * 1024 * 1024 * 1024), "2.0 TiB");
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(72), "1m12s");
  EXPECT_EQ(format_duration(605), "10m05s");
  EXPECT_EQ(format_duration(2 * 3600 + 3 * 60 + 59), "2h03m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(NAN), "?");
}

TEST(ProgressBar, RenderExact) {
  EXPECT_EQ(ProgressBar::render(40, 200, 1520, 72, 10), "[##........] 40/200 step | 1520 tok/s | eta 1m12s");
  EXPECT_EQ(ProgressBar::render(0, 200, NAN, -1, 10), "[..........] 0/200 step | eta ?");
  EXPECT_EQ(ProgressBar::render(200, 200, 99.5, 0, 4), "[####] 200/200 step | 100 tok/s | eta 0s");
  EXPECT_EQ(ProgressBar::render(150, 200, 1, 5, 30).substr(0, 32),
            "[" + std::string(22, '#') + std::string(8, '.') + "]");
}

TEST(ProgressBar, DrawsOnlyWhenEnabled) {
  std::ostringstream on, off;
  {
    ProgressBar bar(10, on, /*enabled=*/true, 10);
    ProgressBar quiet(10, off, /*enabled=*/false, 10);
    EXPECT_TRUE(bar.enabled());
    EXPECT_FALSE(quiet.enabled());
    bar.update(5, 100);
    quiet.update(5, 100);
    std::string first = on.str();
    EXPECT_EQ(first.rfind("\r[#####.....] 5/10 step | 100 tok/s | eta ", 0), 0u) << first;
    bar.update(6, 100);
    EXPECT_EQ(on.str().substr(first.size(), 20), "\r[######....] 6/10 s");
    bar.finish();
    EXPECT_EQ(on.str().back(), '\n');
    bar.finish();  // once only
  }
  const std::string drawn = on.str();
  EXPECT_EQ(std::count(drawn.begin(), drawn.end(), '\n'), 1);
  EXPECT_EQ(off.str(), "");

  // A FILE* that is not a terminal: disabled, writes nothing.
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(10, f);
    EXPECT_FALSE(bar.enabled());
    bar.update(3, 10);
    bar.finish();
  }
  EXPECT_EQ(std::ftell(f), 0);
  std::fclose(f);
}

TEST(ProgressBar, ClearBlanksTheLine) {
  std::ostringstream os;
  ProgressBar bar(4, os, true, 4);
  bar.update(1, NAN);
  const std::string drawn = os.str();  // "\r[#...] 1/4 step | eta ..."
  bar.clear();
  const std::string cleared = os.str().substr(drawn.size());
  EXPECT_EQ(cleared, "\r" + std::string(drawn.size() - 1, ' ') + "\r");
  bar.finish();  // nothing drawn since clear(): no newline
  EXPECT_EQ(os.str().find('\n'), std::string::npos);
}

TEST(Memory, RssHelpers) {
  const int64_t before = current_rss_bytes();
  EXPECT_GT(before, 0);
  // Touch 64 MiB: both the current and the peak RSS must see it.
  const size_t n = 64u << 20;
  std::vector<char> big(n);
  std::memset(big.data(), 1, n);
  const int64_t now = current_rss_bytes();
  EXPECT_GE(now, static_cast<int64_t>(n));
  EXPECT_GE(peak_rss_bytes(), now - (4 << 20));  // peak sampled by the kernel, allow some slack
  EXPECT_EQ(big[n / 2], 1);
}

}  // namespace
}  // namespace torus::train_test
