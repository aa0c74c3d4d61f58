// Corpus: directory loading order, '\n' joins, link handling (duplicates read
// once, directory-link loops not followed, dangling links skipped), errors,
// split sizes; BatchSampler: splitmix64 reference values, pinned offsets
// (computed independently in Python), determinism, window bounds, row slices
// and coverage.
#include "torus/run/corpus.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <string>

#include "torus/core/error.h"

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/torus_corpus_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_; }
  std::string write(const std::string& rel, const std::string& text) const {
    fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

 private:
  std::string path_;
};

std::string as_string(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Corpus, DirectoryIsSortedJoinedAndDeduplicated) {
  TempDir d;
  d.write("b.txt", "BBB");
  d.write("a.txt", "AA");
  d.write("sub/c.txt", "C");
  d.write("sub/deeper/d.txt", "DD\n");
  fs::create_symlink(fs::path(d.path()) / "a.txt", fs::path(d.path()) / "link_to_a");  // same file again
  fs::create_directory_symlink(d.path(), fs::path(d.path()) / "loop");                 // a directory loop
  fs::create_symlink(fs::path(d.path()) / "missing", fs::path(d.path()) / "dangling");
  Corpus c = Corpus::load(d.path());
  // Sorted by relative path: a.txt, b.txt, link_to_a (skipped: a.txt again),
  // sub/c.txt, sub/deeper/d.txt; one '\n' between files.
  EXPECT_EQ(as_string(c.bytes()), "AA\nBBB\nC\nDD\n");
  ASSERT_EQ(c.files().size(), 4u);
  EXPECT_EQ(fs::path(c.files()[0]).filename(), "a.txt");
  EXPECT_EQ(fs::path(c.files()[3]).filename(), "d.txt");
  EXPECT_EQ(c.size(), 2u + 1 + 3 + 1 + 1 + 1 + 3);
  EXPECT_EQ(c.source(), d.path());
}

TEST(Corpus, SingleFileAndErrors) {
  TempDir d;
  std::string f = d.write("one.txt", "hello world");
  Corpus c = Corpus::load(f);
  EXPECT_EQ(as_string(c.bytes()), "hello world");
  EXPECT_EQ(c.files(), std::vector<std::string>{f});

  std::string err = error_of([&] { Corpus::load(d.path() + "/nope"); });
  EXPECT_NE(err.find(d.path() + "/nope"), std::string::npos) << err;
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;

  TempDir empty;
  err = error_of([&] { Corpus::load(empty.path()); });
  EXPECT_NE(err.find("is empty"), std::string::npos) << err;
  std::string zero = d.write("zero.txt", "");
  EXPECT_THROW(Corpus::load(zero), InvalidArgument);
}

TEST(Corpus, SplitTakesTheTailForValidation) {
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  Corpus c = Corpus::from_bytes(bytes, "gen");
  CorpusSplit s = c.split(0.1);
  ASSERT_EQ(s.train.size(), 900u);
  ASSERT_EQ(s.val.size(), 100u);
  EXPECT_TRUE(std::equal(s.train.begin(), s.train.end(), bytes.begin()));
  EXPECT_TRUE(std::equal(s.val.begin(), s.val.end(), bytes.begin() + 900));
  EXPECT_EQ(c.split(0.0).val.size(), 0u);
  EXPECT_EQ(c.split(0.0).train.size(), 1000u);
  EXPECT_EQ(c.split(0.0015).val.size(), 2u);  // 1.5 rounds away from zero
  EXPECT_EQ(c.split(0.0014).val.size(), 1u);
  EXPECT_EQ(c.split(0.999).train.size(), 1u);
  EXPECT_THROW(c.split(1.0), InvalidArgument);
  EXPECT_THROW(c.split(-0.1), InvalidArgument);
  EXPECT_THROW(c.split(NAN), InvalidArgument);
}

TEST(Corpus, DefaultCorpusLoadsWhenPresent) {
  EXPECT_EQ(default_corpus_path(), "/usr/share/common-licenses");
  if (!fs::is_directory(default_corpus_path())) GTEST_SKIP() << "no " << default_corpus_path();
  Corpus c = Corpus::load(default_corpus_path());
  ASSERT_FALSE(c.files().empty());
  // Distinct files, and the bytes are exactly their sizes plus the joins.
  std::set<std::pair<dev_t, ino_t>> ids;
  size_t total = 0;
  for (const std::string& f : c.files()) {
    struct stat sb {};
    ASSERT_EQ(::stat(f.c_str(), &sb), 0) << f;
    EXPECT_TRUE(ids.insert({sb.st_dev, sb.st_ino}).second) << "read twice: " << f;
    total += static_cast<size_t>(sb.st_size);
  }
  EXPECT_EQ(c.size(), total + c.files().size() - 1);
  EXPECT_GT(c.size(), 10000u);
}

TEST(BatchSampler, Splitmix64ReferenceValues) {
  // The first three outputs of the reference splitmix64 generator seeded with
  // 0: the state advances by 0x9E3779B97F4A7C15 before each output, and
  // splitmix64(x) is the output for state x.
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(splitmix64(0x3C6EF372FE94F82Aull), 0x06C45D188009454Full);
}

TEST(BatchSampler, PinnedOffsets) {
  // Computed by an independent Python model of Note [Deterministic batches]:
  //   key = sm(sm(seed) ^ step); v = sm(key ^ row); offset = (v * n) >> 64
  // with 1000 bytes and seq_len 16 (n = 984 offsets).
  std::vector<uint8_t> data(1000);
  BatchSampler s(data, 16, 4, 42);
  EXPECT_EQ(s.num_offsets(), 984);
  const int64_t step0[] = {380, 701, 851, 167};
  const int64_t step7[] = {329, 216, 236, 943};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(s.offset(0, r), step0[r]) << r;
    EXPECT_EQ(s.offset(7, r), step7[r]) << r;
  }
}

TEST(BatchSampler, DeterministicAndInsideTheSpan) {
  std::vector<uint8_t> data(5000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 31 + i / 7) & 0xFF);
  const int64_t seq = 64, batch = 8;
  BatchSampler a(data, seq, batch, 1234, "test data");
  BatchSampler b(data, seq, batch, 1234);
  BatchSampler other_seed(data, seq, batch, 1235);
  EXPECT_EQ(a.window(), seq + 1);
  for (int64_t step : {0, 1, 2, 100, 99999}) {
    std::vector<int64_t> x = a.batch(step);
    ASSERT_EQ(x.size(), static_cast<size_t>(batch * (seq + 1)));
    EXPECT_EQ(x, b.batch(step));
    EXPECT_EQ(x, a.batch(step));
    EXPECT_NE(x, a.batch(step + 1));
    EXPECT_NE(x, other_seed.batch(step));
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t off = a.offset(step, r);
      ASSERT_GE(off, 0);
      ASSERT_LE(off + seq + 1, static_cast<int64_t>(data.size()));
      for (int64_t j = 0; j < seq + 1; ++j) ASSERT_EQ(x[r * (seq + 1) + j], data[off + j]);
    }
    // A data-parallel share is the matching slice of the global batch.
    std::vector<int64_t> share = a.rows(step, 2, 3);
    EXPECT_TRUE(std::equal(share.begin(), share.end(), x.begin() + 2 * (seq + 1)));
  }
}

TEST(BatchSampler, OffsetsCoverTheRange) {
  std::vector<uint8_t> data(1 << 16);
  BatchSampler s(data, 128, 16, 7);
  const int64_t n = s.num_offsets();
  int64_t lo = n, hi = -1;
  std::vector<int> buckets(10, 0);
  for (int64_t step = 0; step < 500; ++step) {
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t o = s.offset(step, r);
      lo = std::min(lo, o), hi = std::max(hi, o);
      ++buckets[static_cast<size_t>(o * 10 / n)];
    }
  }
  EXPECT_LT(lo, n / 100);
  EXPECT_GT(hi, n - n / 100);
  // 8000 draws into 10 buckets: each near 800 (a uniform draw is within +-20% with
  // overwhelming probability).
  for (int c : buckets) {
    EXPECT_GT(c, 640);
    EXPECT_LT(c, 960);
  }
}

TEST(BatchSampler, Errors) {
  std::vector<uint8_t> data(16);
  std::string err = error_of([&] { BatchSampler(data, 16, 1, 0, "/data/tiny.txt (validation)"); });
  EXPECT_NE(err.find("/data/tiny.txt (validation)"), std::string::npos) << err;
  EXPECT_NE(err.find("16 bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("17"), std::string::npos) << err;
  EXPECT_NO_THROW(BatchSampler(data, 15, 1, 0));  // exactly one window
  EXPECT_EQ(BatchSampler(data, 15, 3, 0).batch(5).size(), 48u);
  EXPECT_THROW(BatchSampler(data, 0, 1, 0), InvalidArgument);
  EXPECT_THROW(BatchSampler(data, 4, 0, 0), InvalidArgument);
  BatchSampler s(data, 4, 2, 0);
  EXPECT_THROW(s.offset(-1, 0), InvalidArgument);
  EXPECT_THROW(s.offset(0, 2), InvalidArgument);
  EXPECT_THROW(s.rows(0, 1, 2), InvalidArgument);
}

}  // namespace
}  // namespace torus::train_test
