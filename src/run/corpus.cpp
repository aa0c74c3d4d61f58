// Corpus loading and splitting; the deterministic BatchSampler.
#include "torus/run/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "core/log.h"
#include "torus/core/error.h"

namespace torus::run {
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TORUS_CHECK(in.good(), Error, "corpus: cannot open '{}'", p.string());
  std::vector<uint8_t> out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TORUS_CHECK(!in.bad(), Error, "corpus: error reading '{}'", p.string());
  return out;
}

}  // namespace

std::string default_corpus_path() {
  return "/usr/share/common-licenses";
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Corpus Corpus::load(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  TORUS_CHECK(!ec && fs::exists(st), InvalidArgument, "corpus '{}' does not exist", path);
  Corpus c;
  c.source_ = path;
  if (fs::is_regular_file(st)) {
    c.bytes_ = read_file(path);
    c.files_.push_back(path);
  } else {
    TORUS_CHECK(fs::is_directory(st), InvalidArgument, "corpus '{}' is neither a file nor a directory", path);
    // (relative path, full path, file identity) of every regular file below
    // `path`, links to files included.
    struct Found {
      std::string rel;
      fs::path full;
      std::pair<dev_t, ino_t> id;
    };
    std::vector<Found> found;
    // Default options: directory links are not followed (no loops).
    fs::recursive_directory_iterator it(path, fs::directory_options::skip_permission_denied, ec), end;
    TORUS_CHECK(!ec, InvalidArgument, "corpus: cannot list '{}': {}", path, ec.message());
    for (; it != end; it.increment(ec)) {
      TORUS_CHECK(!ec, Error, "corpus: error listing '{}': {}", path, ec.message());
      struct stat sb {};
      if (::stat(it->path().c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) continue;  // dangling link, dir, fifo ...
      found.push_back({it->path().lexically_relative(path).generic_string(), it->path(), {sb.st_dev, sb.st_ino}});
    }
    // Sorted by relative path; a file reached again later in that order is
    // skipped, so the result does not depend on the directory's listing order.
    std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.rel < b.rel; });
    std::set<std::pair<dev_t, ino_t>> seen;
    for (const Found& f : found) {
      if (!seen.insert(f.id).second) continue;
      if (!c.files_.empty()) c.bytes_.push_back('\n');
      std::vector<uint8_t> b = read_file(f.full);
      c.bytes_.insert(c.bytes_.end(), b.begin(), b.end());
      c.files_.push_back(f.full.string());
    }
  }
  TORUS_CHECK(!c.bytes_.empty(), InvalidArgument, "corpus '{}' is empty ({} files, 0 bytes)", path, c.files_.size());
  TORUS_LOG_DEBUG("corpus {}: {} files, {} bytes", path, c.files_.size(), c.bytes_.size());
  return c;
}

Corpus Corpus::from_bytes(std::vector<uint8_t> bytes, std::string source) {
  Corpus c;
  c.bytes_ = std::move(bytes);
  c.source_ = std::move(source);
  return c;
}

CorpusSplit Corpus::split(double val_fraction) const {
  TORUS_CHECK(val_fraction >= 0 && val_fraction < 1, InvalidArgument,
              "corpus '{}': validation fraction must be in [0, 1), got {}", source_, val_fraction);
  const size_t n_val = static_cast<size_t>(std::llround(static_cast<double>(bytes_.size()) * val_fraction));
  const size_t n_train = bytes_.size() - std::min(n_val, bytes_.size());
  CorpusSplit s;
  s.train.assign(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(n_train));
  s.val.assign(bytes_.begin() + static_cast<std::ptrdiff_t>(n_train), bytes_.end());
  return s;
}

BatchSampler::BatchSampler(std::span<const uint8_t> data, int64_t seq_len, int64_t batch, uint64_t seed,
                           std::string name)
    : data_(data), seq_len_(seq_len), batch_(batch), seed_(seed), num_offsets_(0), name_(std::move(name)) {
  TORUS_CHECK(seq_len >= 1, InvalidArgument, "batch sampler ({}): seq_len must be >= 1, got {}", name_, seq_len);
  TORUS_CHECK(batch >= 1, InvalidArgument, "batch sampler ({}): batch must be >= 1, got {}", name_, batch);
  TORUS_CHECK(static_cast<int64_t>(data.size()) >= seq_len + 1, InvalidArgument,
              "batch sampler ({}): {} bytes is shorter than one window of seq_len + 1 = {} bytes", name_, data.size(),
              seq_len + 1);
  num_offsets_ = static_cast<int64_t>(data.size()) - seq_len;
}

int64_t BatchSampler::offset(int64_t step, int64_t row) const {
  TORUS_CHECK(step >= 0, InvalidArgument, "batch sampler ({}): step must be >= 0, got {}", name_, step);
  TORUS_CHECK(row >= 0 && row < batch_, InvalidArgument, "batch sampler ({}): row {} outside [0, {})", name_, row,
              batch_);
  const uint64_t key = splitmix64(splitmix64(seed_) ^ static_cast<uint64_t>(step));
  const uint64_t v = splitmix64(key ^ static_cast<uint64_t>(row));
  // Multiply-shift onto [0, num_offsets): fixed arithmetic, no std:: distribution.
  return static_cast<int64_t>((static_cast<unsigned __int128>(v) * static_cast<uint64_t>(num_offsets_)) >> 64);
}

std::vector<int64_t> BatchSampler::rows(int64_t step, int64_t first_row, int64_t count) const {
  TORUS_CHECK(first_row >= 0 && count >= 0 && first_row + count <= batch_, InvalidArgument,
              "batch sampler ({}): rows [{}, {}) outside the batch of {}", name_, first_row, first_row + count, batch_);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count * window()));
  for (int64_t r = first_row; r < first_row + count; ++r) {
    const uint8_t* p = data_.data() + offset(step, r);
    for (int64_t j = 0; j < window(); ++j) out.push_back(p[j]);
  }
  return out;
}

std::vector<int64_t> BatchSampler::batch(int64_t step) const {
  return rows(step, 0, batch_);
}

}  // namespace torus::run
