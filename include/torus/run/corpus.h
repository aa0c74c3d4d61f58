// torus/run/corpus.h — the byte corpus of torus-train and its batch
// sampler. LibTorch-free: batches are plain int64 token ids (bytes 0..255),
// turned into tensors by the trainer.
//
// A corpus is a file, or a directory whose regular files (recursively) are
// concatenated in sorted path order with one '\n' between files. The default,
// /usr/share/common-licenses, is installed on every Debian machine (package
// base-files) and holds ~250 KiB of English licence text.
//
// Note [Deterministic batches]: BatchSampler draws window offsets from a
// splitmix64 hash of (seed, step, row) alone, with a fixed integer mapping to
// the range — no std:: distributions, whose output is implementation
// defined. The same (data, seq_len, batch, seed) gives the same batch for step
// k on every rank, every run, every compiler; data-parallel ranks take
// disjoint row ranges of one global batch (rows()).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace torus::run {

// "/usr/share/common-licenses".
std::string default_corpus_path();

// The two parts of a corpus: `val` is the last part, contiguous, so that no
// window of the training part overlaps it.
struct CorpusSplit {
  std::vector<uint8_t> train;
  std::vector<uint8_t> val;
};

class Corpus {
 public:
  // Reads `path`: a regular file, or a directory. In a directory every
  // regular file below it is read, in order of its path relative to `path`
  // (byte-wise sort), joined by '\n'. Symbolic links to files are followed,
  // but a file reached twice (two links, or a link and the file) is read
  // once, at the first of its paths in sorted order; links to directories are
  // not followed, so link loops cannot recur. Unreadable subdirectories and
  // dangling links are skipped.
  // Throws InvalidArgument if `path` does not exist, is neither a file nor a
  // directory, or yields no bytes; torus::Error if a file cannot be read.
  // Blocks on file I/O.
  static Corpus load(const std::string& path);

  // A corpus over given bytes (tests, generated data). `source` names it in
  // messages.
  static Corpus from_bytes(std::vector<uint8_t> bytes, std::string source = "<memory>");

  const std::vector<uint8_t>& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  // The path given to load() (or from_bytes' `source`).
  const std::string& source() const { return source_; }
  // The files read, in order (absolute or as given); empty for from_bytes.
  const std::vector<std::string>& files() const { return files_; }

  // Splits into train and validation: val = the last round(size *
  // val_fraction) bytes, train = the rest. Throws InvalidArgument unless
  // 0 <= val_fraction < 1.
  CorpusSplit split(double val_fraction) const;

 private:
  std::vector<uint8_t> bytes_;
  std::string source_;
  std::vector<std::string> files_;
};

// Draws deterministic batches of windows from a byte span (Note
// [Deterministic batches]). A window is seq_len + 1 consecutive bytes: the
// model reads tokens [0, seq_len) and predicts [1, seq_len]. The span must
// outlive the sampler. Thread safe (const after construction).
class BatchSampler {
 public:
  // Throws InvalidArgument, naming `name` and the sizes, if seq_len < 1,
  // batch < 1, or data holds fewer than seq_len + 1 bytes.
  BatchSampler(std::span<const uint8_t> data, int64_t seq_len, int64_t batch, uint64_t seed,
               std::string name = "corpus");

  int64_t seq_len() const { return seq_len_; }
  int64_t batch_size() const { return batch_; }
  int64_t window() const { return seq_len_ + 1; }
  // Number of distinct window offsets: data.size() - seq_len.
  int64_t num_offsets() const { return num_offsets_; }

  // Start of row `row` (0 <= row < batch) of step `step` (>= 0) in the span;
  // always in [0, num_offsets()).
  int64_t offset(int64_t step, int64_t row) const;

  // The whole batch of step `step`: batch * (seq_len + 1) token ids, row
  // major (row r is bytes [offset(step, r), offset(step, r) + seq_len]).
  std::vector<int64_t> batch(int64_t step) const;

  // Rows [first_row, first_row + count) of the batch of `step`, the same
  // bytes as the matching slice of batch(step): a data-parallel rank takes
  // its share of a global batch with rows(step, rank * b, b).
  std::vector<int64_t> rows(int64_t step, int64_t first_row, int64_t count) const;

 private:
  std::span<const uint8_t> data_;
  int64_t seq_len_;
  int64_t batch_;
  uint64_t seed_;
  int64_t num_offsets_;
  std::string name_;
};

// splitmix64's output function (a bijective 64-bit mix); exposed for tests.
uint64_t splitmix64(uint64_t x);

}  // namespace torus::run
