// TokenDataset: .tok (uint16, uint32) and Megatron .bin/.idx (uint8, uint16,
// int32, int64, multimodal) written here by plain writers that follow the
// formats of token_data.h byte by byte, read back exactly; every corruption
// refused with a message naming the file and the problem; ids checked on
// read. TokenSampler: window count, permutations per epoch, every window
// (and every token as an input) of an epoch read exactly once over dp = 1..4
// ranks with batches that do not divide the epoch, non-contiguous rows,
// resume from a fresh sampler, determinism, the validation split.
#include "torus/run/token_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
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
    char tmpl[] = "/tmp/torus_token_data_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// Little-endian bytes, appended field by field.
class Bytes {
 public:
  template <class T>
  Bytes& put(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) b_.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    return *this;
  }
  Bytes& raw(const std::string& s) {
    b_ += s;
    return *this;
  }
  std::string& str() { return b_; }

 private:
  std::string b_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A .tok file: header, document offsets (when given), tokens of `code` bytes.
std::string tok_bytes(uint32_t code, const std::vector<uint64_t>& tokens, uint64_t vocab,
                      const std::vector<uint64_t>& doc_offsets) {
  Bytes b;
  b.raw("TORUSTOK").put<uint32_t>(1).put<uint32_t>(code).put<uint64_t>(tokens.size()).put<uint64_t>(vocab);
  b.put<uint64_t>(doc_offsets.empty() ? 0 : doc_offsets.size() - 1);
  for (uint64_t o : doc_offsets) b.put<uint64_t>(o);
  for (uint64_t t : tokens) {
    if (code == 2) b.put<uint16_t>(static_cast<uint16_t>(t));
    else b.put<uint32_t>(static_cast<uint32_t>(t));
  }
  return b.str();
}

// A Megatron index per megatron/core/datasets/indexed_dataset.py's layout,
// with pointers from the lengths and optional int8 modes.
std::string idx_bytes(uint8_t code, int itemsize, const std::vector<int32_t>& lengths,
                      const std::vector<int64_t>& doc_index, bool modes = false) {
  Bytes b;
  b.raw(std::string("MMIDIDX\0\0", 9)).put<uint64_t>(1).put<uint8_t>(code);
  b.put<uint64_t>(lengths.size()).put<uint64_t>(doc_index.size());
  for (int32_t l : lengths) b.put<int32_t>(l);
  int64_t ptr = 0;
  for (int32_t l : lengths) {
    b.put<int64_t>(ptr);
    ptr += static_cast<int64_t>(l) * itemsize;
  }
  for (int64_t d : doc_index) b.put<int64_t>(d);
  if (modes) for (size_t i = 0; i < lengths.size(); ++i) b.put<int8_t>(static_cast<int8_t>(i % 3));
  return b.str();
}

std::string bin_bytes(int itemsize, const std::vector<int64_t>& tokens) {
  Bytes b;
  for (int64_t t : tokens) {
    switch (itemsize) {
      case 1: b.put<uint8_t>(static_cast<uint8_t>(t)); break;
      case 2: b.put<uint16_t>(static_cast<uint16_t>(t)); break;
      case 4: b.put<uint32_t>(static_cast<uint32_t>(t)); break;
      default: b.put<uint64_t>(static_cast<uint64_t>(t));
    }
  }
  return b.str();
}

// Expects InvalidArgument whose message holds every one of `parts`.
void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << parts.front() << "'";
  } catch (const InvalidArgument& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::vector<int64_t> iota_ids(int64_t n, int64_t first = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(TokenDataset, TokRoundTripUint16AndUint32) {
  TempDir dir;
  for (uint32_t code : {2u, 4u}) {
    const uint64_t top = code == 2 ? 65535 : 4000000000ull;
    std::vector<uint64_t> tokens = {0, 1, top, 7, top - 1, 300, 65536 % (top + 1), 42};
    const std::string path = dir.file("t" + std::to_string(code) + ".tok");
    write_file(path, tok_bytes(code, tokens, top + 1, {0, 3, 3, 8}));
    for (const TokenDataset& d : {TokenDataset::open(path), TokenDataset::open_tok(path)}) {
      EXPECT_EQ(d.format(), TokenFormat::kTorus);
      EXPECT_EQ(d.dtype(), code == 2 ? TokenDtype::kUInt16 : TokenDtype::kUInt32);
      EXPECT_EQ(d.num_tokens(), 8);
      EXPECT_EQ(d.vocab_size(), static_cast<int64_t>(top + 1));
      ASSERT_EQ(d.num_documents(), 3);
      EXPECT_EQ(d.document_offset(0), 0);
      EXPECT_EQ(d.document_offset(1), 3);
      EXPECT_EQ(d.document_offset(2), 3);  // an empty document
      EXPECT_EQ(d.document_offset(3), 8);
      const std::vector<int64_t> all = d.read(0, 8);
      for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(all[i], static_cast<int64_t>(tokens[i])) << i;
      EXPECT_EQ(d.read(2, 3), (std::vector<int64_t>{static_cast<int64_t>(top), 7, static_cast<int64_t>(top - 1)}));
      EXPECT_TRUE(d.read(8, 0).empty());
      EXPECT_EQ(d.validate_tokens(), static_cast<int64_t>(top));
      EXPECT_NE(d.describe().find(code == 2 ? "uint16" : "uint32"), std::string::npos);
    }
  }
}

TEST(TokenDataset, TokWithoutDocumentsAndEmpty) {
  TempDir dir;
  const std::string path = dir.file("plain.tok");
  write_file(path, tok_bytes(2, {5, 6, 7}, 0, {}));
  TokenDataset d = TokenDataset::open(path);
  EXPECT_EQ(d.num_documents(), 0);
  EXPECT_EQ(d.vocab_size(), 0);
  EXPECT_EQ(d.read(0, 3), (std::vector<int64_t>{5, 6, 7}));
  expect_invalid([&] { d.document_offset(1); }, {path, "document 1"});
  expect_invalid([&] { d.read(1, 3); }, {path, "outside [0, 3)"});
  expect_invalid([&] { d.read(-1, 1); }, {path});

  const std::string empty = dir.file("empty.tok");
  write_file(empty, tok_bytes(4, {}, 10, {}));
  EXPECT_EQ(TokenDataset::open(empty).num_tokens(), 0);
  EXPECT_EQ(TokenDataset::open(empty).validate_tokens(), -1);
}

TEST(TokenDataset, TokCorruptionIsRefused) {
  TempDir dir;
  const std::string good = tok_bytes(2, {1, 2, 3, 4, 5}, 10, {0, 2, 5});
  auto refuse = [&](const std::string& name, std::string bytes, const std::string& problem) {
    const std::string path = dir.file(name + ".tok");
    write_file(path, bytes);
    SCOPED_TRACE(name);
    expect_invalid([&] { TokenDataset::open(path); }, {path, problem});
  };
  std::string b = good;
  b[0] = 'X';
  refuse("magic", b, "bad magic");
  b = good;
  b[8] = 2;
  refuse("version", b, "unsupported version 2");
  b = good;
  b[12] = 3;
  refuse("dtype", b, "bad dtype code 3");
  refuse("truncated", good.substr(0, good.size() - 1), "truncated");
  refuse("extra", good + "x", "truncated");
  refuse("header", good.substr(0, 20), "shorter than the 40-byte header");
  b = good;
  b[16] = 100;  // num_tokens 100
  refuse("num_tokens", b, "the header says");
  b = good;
  b[32] = static_cast<char>(0xff);  // num_documents huge
  refuse("num_documents", b, "num_documents");
  refuse("not_monotone", tok_bytes(2, {1, 2, 3, 4, 5}, 10, {0, 4, 2, 5}), "not monotone");
  refuse("last_offset", tok_bytes(2, {1, 2, 3, 4, 5}, 10, {0, 2, 4}), "not num_tokens = 5");
  refuse("first_offset", tok_bytes(2, {1, 2, 3, 4, 5}, 10, {1, 2, 5}), "document offset 0 is 1");

  // Ids are checked where they are read (Note [Untrusted token files]).
  const std::string path = dir.file("vocab.tok");
  write_file(path, tok_bytes(2, {1, 2, 10, 4}, 10, {}));
  TokenDataset d = TokenDataset::open(path);
  EXPECT_EQ(d.read(0, 2), (std::vector<int64_t>{1, 2}));
  expect_invalid([&] { d.read(1, 3); }, {path, "token 10 at offset 2", "vocabulary of 10"});
  expect_invalid([&] { d.validate_tokens(); }, {path, "offset 2"});

  expect_invalid([&] { TokenDataset::open(dir.file("missing.tok")); }, {"missing.tok", "does not exist"});
  expect_invalid([&] { TokenDataset::open(dir.file("nothing")); }, {"nothing", "no such file"});
  write_file(dir.file("other"), "hello world, this is no token file at all....");
  expect_invalid([&] { TokenDataset::open(dir.file("other")); }, {"other", "bad magic"});
}

struct MegatronCase {
  uint8_t code;
  int itemsize;
  TokenDtype dtype;
  int64_t big;  // an id near the dtype's top
};

TEST(TokenDataset, MegatronRoundTrip) {
  TempDir dir;
  for (const MegatronCase& c : {MegatronCase{1, 1, TokenDtype::kUInt8, 255},
                                MegatronCase{8, 2, TokenDtype::kUInt16, 65535},
                                MegatronCase{4, 4, TokenDtype::kInt32, 2147483647},
                                MegatronCase{5, 8, TokenDtype::kInt64, int64_t{1} << 40}}) {
    for (bool modes : {false, true}) {
      SCOPED_TRACE(std::string(token_dtype_name(c.dtype)) + (modes ? " multimodal" : ""));
      // Three documents: {2 sequences}, {}, {1 sequence}; an empty sequence too.
      const std::vector<std::vector<int64_t>> seqs = {{1, 2, 3}, {}, {c.big, 0}, {9, 8, 7, 6}};
      std::vector<int32_t> lengths;
      std::vector<int64_t> flat;
      for (const auto& s : seqs) {
        lengths.push_back(static_cast<int32_t>(s.size()));
        flat.insert(flat.end(), s.begin(), s.end());
      }
      const std::vector<int64_t> doc_index = {0, 3, 3, 4};
      const std::string prefix = dir.file(std::string("m_") + token_dtype_name(c.dtype) + (modes ? "_mm" : ""));
      write_file(prefix + ".bin", bin_bytes(c.itemsize, flat));
      write_file(prefix + ".idx", idx_bytes(c.code, c.itemsize, lengths, doc_index, modes));
      for (const std::string& p : {prefix, prefix + ".bin", prefix + ".idx"}) {
        TokenDataset d = TokenDataset::open(p);
        EXPECT_EQ(d.format(), TokenFormat::kMegatron);
        EXPECT_EQ(d.path(), prefix);
        EXPECT_EQ(d.dtype(), c.dtype);
        EXPECT_EQ(d.vocab_size(), 0);
        EXPECT_EQ(d.num_tokens(), 9);
        EXPECT_EQ(d.read(0, 9), flat);
        EXPECT_EQ(d.read(4, 2), (std::vector<int64_t>{0, 9}));
        ASSERT_EQ(d.num_documents(), 3);
        EXPECT_EQ(d.document_offset(0), 0);
        EXPECT_EQ(d.document_offset(1), 5);  // sequences 0..2 hold 3 + 0 + 2 tokens
        EXPECT_EQ(d.document_offset(2), 5);
        EXPECT_EQ(d.document_offset(3), 9);
        EXPECT_EQ(d.validate_tokens(), c.big);
      }
    }
  }
}

TEST(TokenDataset, MegatronCorruptionIsRefused) {
  TempDir dir;
  const std::vector<int32_t> lengths = {3, 2, 4};
  const std::vector<int64_t> doc_index = {0, 2, 3};
  const std::string bin = bin_bytes(4, iota_ids(9, 100));
  const std::string good = idx_bytes(4, 4, lengths, doc_index);
  int n = 0;
  auto refuse = [&](const std::string& idx, const std::string& problem, const std::string& bin_data) {
    const std::string prefix = dir.file("bad" + std::to_string(n++));
    write_file(prefix + ".idx", idx);
    write_file(prefix + ".bin", bin_data);
    SCOPED_TRACE(problem);
    expect_invalid([&] { TokenDataset::open(prefix); }, {prefix, problem});
  };
  auto with = [&](size_t at, const std::string& bytes) {
    std::string b = good;
    b.replace(at, bytes.size(), bytes);
    return b;
  };
  auto i64 = [](int64_t v) { return Bytes().put<int64_t>(v).str(); };
  auto i32 = [](int32_t v) { return Bytes().put<int32_t>(v).str(); };
  const size_t len_at = 34, ptr_at = 34 + 4 * 3, doc_at = ptr_at + 8 * 3;
  refuse(with(0, "MMIDIDY"), "bad magic", bin);
  refuse(with(9, i64(2)), "unsupported version 2", bin);
  refuse(with(17, std::string(1, '\7')), "float32", bin);
  refuse(with(17, std::string(1, '\6')), "float64", bin);
  refuse(with(17, std::string(1, '\11')), "unknown dtype code 9", bin);
  refuse(good.substr(0, 30), "shorter than the 34-byte header", bin);
  refuse(good.substr(0, good.size() - 3), "need", bin);
  refuse(with(18, i64(int64_t{1} << 40)), "do not fit", bin);
  refuse(with(len_at + 4, i32(-2)), "negative length -2", bin);
  refuse(with(ptr_at + 8, i64(-12)), "negative pointer -12", bin);
  refuse(with(ptr_at + 16, i64(4000)), "past the end of", bin);
  refuse(with(ptr_at + 8, i64(16)), "lengths inconsistent with pointers", bin);
  refuse(with(len_at + 8, i32(40)), "runs past the end of", bin);
  refuse(good, "do not match", bin + "\1\2\3\4");
  refuse(with(doc_at, i64(1)), "document index 0 is 1", bin);
  refuse(with(doc_at + 8, i64(4)), "not monotone", bin);
  refuse(with(doc_at + 16, i64(2)), "not the sequence count 3", bin);
  refuse(idx_bytes(4, 4, lengths, {}), "document index is empty", bin);

  // A missing data file; a negative id in a signed dtype, found on read.
  const std::string lone = dir.file("lone");
  write_file(lone + ".idx", good);
  expect_invalid([&] { TokenDataset::open(lone); }, {lone + ".bin", "does not exist"});
  const std::string neg = dir.file("neg");
  write_file(neg + ".idx", good);
  std::vector<int64_t> ids = iota_ids(9);
  ids[6] = -5;
  write_file(neg + ".bin", bin_bytes(4, ids));
  TokenDataset d = TokenDataset::open(neg);
  EXPECT_EQ(d.read(0, 6), iota_ids(6));
  expect_invalid([&] { d.read(5, 2); }, {neg + ".bin", "token -5 at offset 6", "negative"});
}

// A uint32 .tok whose token at offset i is i + first: every row names its
// own window.
TokenDataset offsets_dataset(const TempDir& dir, int64_t n, const std::string& name = "ids.tok") {
  std::vector<uint64_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  write_file(dir.file(name), tok_bytes(4, t, 0, {}));
  return TokenDataset::open(dir.file(name));
}

TEST(TokenSampler, WindowCountAndPermutations) {
  TempDir dir;
  TokenDataset d = offsets_dataset(dir, 2000);
  for (int64_t seq : {1, 7, 64}) {
    TokenSampler s(d, {.seq_len = seq, .batch = 3, .seed = 5});
    EXPECT_EQ(s.num_samples(), (2000 - 1) / seq);
    EXPECT_EQ(s.window_offset(s.num_samples() - 1) + seq, s.num_samples() * seq);  // last window ends in range
  }
  for (int64_t tokens : {2, 3, 4, 6, 18, 101, 1001, 1024, 1026, 1999}) {
    TokenSampler s(d, {.seq_len = 1, .batch = 1, .seed = 99, .range = {.begin = 0, .end = tokens}});
    const int64_t n = s.num_samples();
    ASSERT_EQ(n, tokens - 1);
    std::vector<std::vector<int64_t>> perms;
    for (int64_t e = 0; e < 3; ++e) {
      std::vector<int64_t> p;
      for (int64_t i = 0; i < n; ++i) p.push_back(s.sample(e, i));
      std::vector<int64_t> sorted = p;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, iota_ids(n)) << "epoch " << e << " of " << n << " is not a permutation";
      perms.push_back(p);
    }
    if (n >= 5) {
      EXPECT_NE(perms[0], perms[1]) << n;
      EXPECT_NE(perms[1], perms[2]) << n;
    }
    // Not the identity (seed 99 happens to draw it for n = 5: 1 in 120).
    if (n >= 17) EXPECT_NE(perms[0], iota_ids(n)) << n;
    TokenSampler plain(d, {.seq_len = 1, .batch = 1, .range = {.end = tokens}, .shuffle = false});
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(plain.sample(4, i), i);
  }
  // Another seed, another order.
  TokenSampler a(d, {.seq_len = 1, .batch = 1, .seed = 1}), b(d, {.seq_len = 1, .batch = 1, .seed = 2});
  int same = 0;
  for (int64_t i = 0; i < 100; ++i) same += a.sample(0, i) == b.sample(0, i);
  EXPECT_LT(same, 10);
}

TEST(TokenSampler, EveryWindowOnceAcrossDataParallelRanks) {
  TempDir dir;
  constexpr int64_t kSeq = 5;
  // 23 windows (+3 trailing tokens that fill none): no batch below divides 23.
  const int64_t n_tokens = 23 * kSeq + 1 + 3;
  TokenDataset d = offsets_dataset(dir, n_tokens);
  for (int64_t dp : {1, 2, 3, 4}) {
    for (int64_t per_rank : {1, 2, 3}) {
      const int64_t batch = dp * per_rank;
      if (23 % batch == 0) continue;
      SCOPED_TRACE("dp " + std::to_string(dp) + " batch " + std::to_string(batch));
      TokenSampler s(d, {.seq_len = kSeq, .batch = batch, .seed = 7});
      ASSERT_EQ(s.num_samples(), 23);
      // Read epochs 0 and 1 (and the wrapped batch between them) as the dp
      // ranks would, each its own rows; position p = step * batch + row.
      std::map<int64_t, std::vector<int64_t>> windows_of_epoch;  // epoch -> windows read
      std::map<int64_t, std::vector<int64_t>> inputs_of_epoch;   // epoch -> token offsets read as inputs
      const int64_t steps = (2 * 23 + batch - 1) / batch;
      for (int64_t step = 0; step < steps; ++step) {
        for (int64_t rank = 0; rank < dp; ++rank) {
          const std::vector<int64_t> rows = s.rows(step, rank * per_rank, per_rank);
          ASSERT_EQ(rows.size(), static_cast<size_t>(per_rank * (kSeq + 1)));
          for (int64_t k = 0; k < per_rank; ++k) {
            const int64_t p = step * batch + rank * per_rank + k;
            const int64_t epoch = p / 23;
            if (epoch > 1) continue;
            const int64_t* row = rows.data() + k * (kSeq + 1);
            ASSERT_EQ(row[0] % kSeq, 0) << "a window starts at a multiple of seq_len";
            for (int64_t j = 0; j <= kSeq; ++j) ASSERT_EQ(row[j], row[0] + j) << "consecutive tokens";
            ASSERT_LE(row[kSeq], 23 * kSeq) << "the trailing tokens are never read";
            windows_of_epoch[epoch].push_back(row[0] / kSeq);
            for (int64_t j = 0; j < kSeq; ++j) inputs_of_epoch[epoch].push_back(row[j]);
            const EpochPosition pos = s.position(step, rank * per_rank + k);
            EXPECT_EQ(pos.epoch, epoch);
            EXPECT_EQ(pos.sample_in_epoch, p % 23);
          }
        }
      }
      for (int64_t e : {0, 1}) {
        std::sort(windows_of_epoch[e].begin(), windows_of_epoch[e].end());
        EXPECT_EQ(windows_of_epoch[e], iota_ids(23)) << "epoch " << e;
        std::sort(inputs_of_epoch[e].begin(), inputs_of_epoch[e].end());
        EXPECT_EQ(inputs_of_epoch[e], iota_ids(23 * kSeq)) << "epoch " << e;
      }
    }
  }
}

TEST(TokenSampler, RowsAtResumeAndDeterminism) {
  TempDir dir;
  TokenDataset d = offsets_dataset(dir, 1000);
  const TokenSamplerOptions opt{.seq_len = 8, .batch = 6, .seed = 123};
  TokenSampler s(d, opt);  // 124 windows: epochs end mid-batch
  const int64_t w = s.window();
  // Non-contiguous, reordered and repeated rows are slices of the batch.
  const std::vector<int64_t> full = s.batch(30);
  const std::vector<int64_t> pick = {5, 0, 3, 3};
  const std::vector<int64_t> got = s.rows_at(30, pick);
  for (size_t k = 0; k < pick.size(); ++k) {
    EXPECT_TRUE(std::equal(got.begin() + k * w, got.begin() + (k + 1) * w, full.begin() + pick[k] * w)) << k;
  }
  std::vector<int64_t> buf(2 * w);
  s.read_rows(30, std::vector<int64_t>{1, 2}, buf);
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), full.begin() + w));
  expect_invalid([&] { s.read_rows(30, std::vector<int64_t>{1}, buf); }, {"output holds"});
  expect_invalid([&] { s.rows_at(30, std::vector<int64_t>{6}); }, {"train", "row 6 outside the batch of 6"});
  expect_invalid([&] { s.rows(0, 4, 3); }, {"outside the batch"});
  expect_invalid([&] { s.batch(-1); }, {"step must be >= 0"});

  // An uninterrupted run, then a fresh dataset and sampler resumed at step k.
  std::vector<std::vector<int64_t>> run;
  for (int64_t step = 0; step < 60; ++step) run.push_back(s.batch(step));
  for (int64_t k : {1, 20, 21, 41}) {
    TokenSampler resumed(TokenDataset::open(dir.file("ids.tok")), opt);
    const EpochPosition at = s.position_after(k);
    EXPECT_EQ(at.samples_consumed, k * 6);
    EXPECT_EQ(at.epoch, k * 6 / 124);
    EXPECT_EQ(at.sample_in_epoch, k * 6 % 124);
    EXPECT_NO_THROW(resumed.check_resume(k, at));
    EXPECT_EQ(resumed.fingerprint(), s.fingerprint());
    for (int64_t step = k; step < 60; ++step) EXPECT_EQ(resumed.batch(step), run[step]) << k << " " << step;
  }
  // Same rows on every call.
  for (int64_t step = 0; step < 60; ++step) EXPECT_EQ(s.batch(step), run[step]);
  // A changed batch size is caught on resume, and changes the fingerprint.
  TokenSamplerOptions other = opt;
  other.batch = 4;
  TokenSampler changed(d, other);
  expect_invalid([&] { changed.check_resume(30, s.position_after(30)); }, {"resuming after step 30", "batch 4"});
  EXPECT_NE(changed.fingerprint(), s.fingerprint());
}

TEST(TokenSampler, ValidationSplitAndMegatronData) {
  TempDir dir;
  const TokenSplit split = split_tokens(1000, 0.1);
  EXPECT_EQ(split.train.begin, 0);
  EXPECT_EQ(split.train.end, 900);
  EXPECT_EQ(split.val.begin, 900);
  EXPECT_EQ(split.val.end, 1000);
  EXPECT_EQ(split_tokens(1000, 0).val.begin, 1000);
  expect_invalid([] { split_tokens(10, 1.0); }, {"[0, 1)"});

  TokenDataset d = offsets_dataset(dir, 1000);
  TokenSampler train(d, {.seq_len = 16, .batch = 4, .seed = 3, .range = split.train});
  TokenSampler val(d, {.seq_len = 16, .batch = 2, .seed = 3, .range = split.val, .shuffle = false, .name = "val"});
  EXPECT_EQ(train.num_samples(), (900 - 1) / 16);
  EXPECT_EQ(val.num_samples(), (100 - 1) / 16);
  for (int64_t step = 0; step * 4 < train.num_samples(); ++step) {
    for (int64_t t : train.batch(step)) EXPECT_LT(t, 900);
  }
  std::vector<int64_t> first = val.batch(0);
  EXPECT_EQ(first[0], 900);  // unshuffled: window 0 of the range
  EXPECT_EQ(first[17], 916);
  for (int64_t step = 0; step < 10; ++step) {
    for (int64_t t : val.batch(step)) EXPECT_GE(t, 900);
  }
  expect_invalid([&] { TokenSampler(d, {.seq_len = 200, .batch = 1, .range = split.val, .name = "val"}); },
                 {"val", "fewer than one window"});
  expect_invalid([&] { TokenSampler(d, {.seq_len = 0, .batch = 1}); }, {"seq_len must be >= 1"});
  expect_invalid([&] { TokenSampler(d, {.seq_len = 4, .batch = 1, .range = {.begin = 5, .end = 2000}}); },
                 {"not inside", "ids.tok"});

  // The sampler reads Megatron data the same way: tokens are the .bin stream.
  const std::string prefix = dir.file("meg");
  write_file(prefix + ".bin", bin_bytes(2, iota_ids(101)));
  write_file(prefix + ".idx", idx_bytes(8, 2, {40, 61}, {0, 1, 2}));
  TokenSampler m(TokenDataset::open(prefix), {.seq_len = 10, .batch = 3, .seed = 11});
  ASSERT_EQ(m.num_samples(), 10);
  for (int64_t step = 0; step < 4; ++step) {
    const std::vector<int64_t> rows = m.batch(step);
    for (int64_t r = 0; r < 3; ++r) {
      const EpochPosition p = m.position(step, r);
      const int64_t start = 10 * m.sample(p.epoch, p.sample_in_epoch);
      for (int64_t j = 0; j <= 10; ++j) EXPECT_EQ(rows[r * 11 + j], start + j);
    }
  }
}

}  // namespace
}  // namespace torus::train_test
