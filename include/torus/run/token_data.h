// torus/run/token_data.h — tokenized datasets read through a read-only
// memory map, and the deterministic, resumable, data-parallel sampler of
// fixed-length windows over them. LibTorch-free: rows are plain int64 token
// ids, turned into tensors by the trainer. docs/data.md has both file
// formats byte by byte and the sampler's rules with examples.
//
// Two formats, one interface (TokenDataset):
//
//  * Torus flat token file (`.tok`), all integers little-endian:
//      offset  size  field
//      0       8     magic "TORUSTOK"
//      8       4     u32 version = 1
//      12      4     u32 dtype code: 2 = uint16 tokens, 4 = uint32 tokens
//      16      8     u64 num_tokens
//      24      8     u64 vocab_size (0 = unknown)
//      32      8     u64 num_documents (0 = no document boundaries)
//      40      8*(num_documents+1), only when num_documents > 0:
//                    u64 document offsets, in tokens: 0 = o[0] <= o[1] <= ...
//                    <= o[num_documents] = num_tokens; document d is tokens
//                    [o[d], o[d+1])
//      then          num_tokens tokens of the dtype; the file ends there.
//
//  * Megatron-LM's indexed dataset ("MMIDIDX"): `prefix.bin` holds the tokens
//    of every sequence back to back; `prefix.idx` is
//      0   9   magic "MMIDIDX\0\0"
//      9   8   u64 version = 1
//      17  1   u8 dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//              6 float64, 7 float32, 8 uint16 (6 and 7 are refused here)
//      18  8   u64 sequence_count S
//      26  8   u64 document_count D (entries of the document index, i.e.
//              documents + 1)
//      34  4*S i32 sequence lengths, in tokens
//      ..  8*S i64 sequence pointers, byte offsets into .bin
//      ..  8*D i64 document index: sequence d_i starts document i; d_0 = 0,
//              non-decreasing, d_{D-1} = S
//      ..  S   i8 sequence modes (multimodal files only; ignored)
//    Torus requires the layout Megatron's writer produces: pointer 0 is 0 and
//    every sequence starts where the previous one ends, so the token stream
//    is the whole .bin, whose size must be exactly sum(lengths) * itemsize.
//
// Note [Untrusted token files]: nothing read from a file is trusted. open()
// checks the whole structure (header fields, sizes against the file sizes,
// every offset, length, pointer and document index) in time linear in the
// number of sequences/documents and never touches the token array, so
// opening a multi-GB file costs milliseconds. Token ids are checked where
// they are read: read() — and through it every sampler row — throws if an id
// is negative or >= vocab_size (when the file states one), at the cost of a
// compare per token that the int64 conversion makes anyway.
// validate_tokens() scans the whole array once (the preparation tool's files
// can be checked offline). Every message names the file and the problem.
// A file must not change while it is mapped: one truncated underneath a map
// faults with SIGBUS on the next read. The preparation tool replaces files
// by rename, which keeps existing maps on the old contents.
//
// Note [Token windows]: a sample is a window of seq_len + 1 consecutive
// tokens of a token range [begin, end) of the dataset (default: all of it);
// the model reads [0, seq_len) and predicts [1, seq_len]. The range is cut
// into num_samples = floor((end - begin - 1) / seq_len) windows with stride
// seq_len: window w is tokens [begin + w * seq_len, begin + (w + 1) * seq_len],
// so its last token is the first of window w + 1 (as in Megatron-LM and
// nanoGPT), and the trailing tokens that fill no window are never read.
// Windows cross document boundaries; the documents' end-of-text tokens (see
// the preparation tool's --append-eos) separate them.
//
// Note [Epoch order]: the sampler's global sample stream is the epochs'
// orders one after another: position p = step * batch + row is sample
// perm_e(p mod num_samples) of epoch e = p / num_samples. perm_e is a
// permutation of [0, num_samples) drawn from (seed, e) alone: a 6-round
// Feistel network keyed by splitmix64 over the next even power of two,
// cycle-walked into range — a bijection computed per position in O(1) time
// and memory, no std:: distribution, the same on every rank, run and
// compiler (cf. Note [Deterministic batches] in corpus.h). When batch does
// not divide num_samples, the batch at an epoch's end is completed from the
// start of the next epoch's order (it wraps): no sample is dropped or
// repeated within an epoch, so the positions [e * num_samples, (e + 1) *
// num_samples) — whichever steps and data-parallel ranks read them — read
// every window of the range exactly once. The sampler's only state is the
// step: a new sampler asked for step k returns the rows that step k of an
// uninterrupted run would.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace torus::run {

enum class TokenFormat { kTorus, kMegatron };

// The stored integer type of the token ids.
enum class TokenDtype { kUInt8, kInt8, kInt16, kUInt16, kInt32, kUInt32, kInt64 };

const char* token_dtype_name(TokenDtype dtype);
int token_dtype_size(TokenDtype dtype);

// A tokenized dataset mapped read-only (Note [Untrusted token files]).
// Copies are cheap and share the mapping, which lives until the last copy is
// destroyed. All methods are const and thread safe; reads block on page
// faults of the map.
class TokenDataset {
 public:
  // Opens `path` by its name: `x.tok` is a Torus token file; `x.bin` or
  // `x.idx` is the Megatron dataset with prefix `x`; any other path is a
  // Megatron prefix if `path.idx` exists, else a Torus token file if its
  // first 8 bytes are the magic "TORUSTOK". Throws InvalidArgument, naming
  // the file and the problem, if a file is missing or malformed; Error if
  // it cannot be read or mapped. Blocks on file I/O (O(documents)).
  static TokenDataset open(const std::string& path);
  static TokenDataset open_tok(const std::string& path);
  // `prefix` without .bin/.idx.
  static TokenDataset open_megatron(const std::string& prefix);

  TokenFormat format() const;
  // The .tok path, or the Megatron prefix.
  const std::string& path() const;
  TokenDtype dtype() const;
  int64_t num_tokens() const;
  // The vocabulary size the file states; 0 when unknown (always for
  // Megatron files).
  int64_t vocab_size() const;

  // Number of documents; 0 for a .tok file written without boundaries.
  int64_t num_documents() const;
  // Start of document d (0 <= d <= num_documents(); d = num_documents()
  // gives num_tokens()), in tokens: document d is [document_offset(d),
  // document_offset(d + 1)). Throws InvalidArgument for d out of range.
  int64_t document_offset(int64_t d) const;

  // Tokens [offset, offset + count) into out[0, count), as int64. Throws
  // InvalidArgument if the range is outside [0, num_tokens()), or if a
  // token read is negative or >= vocab_size() (Note [Untrusted token files]),
  // naming the file and the token's offset.
  void read(int64_t offset, int64_t count, int64_t* out) const;
  std::vector<int64_t> read(int64_t offset, int64_t count) const;

  // Scans every token once (O(num_tokens), blocks on the whole file) and
  // returns the largest id (-1 if there are no tokens). Throws
  // InvalidArgument like read() for the first bad id.
  int64_t validate_tokens() const;

  // One line: format, path, dtype, tokens, documents, vocabulary.
  std::string describe() const;

  struct State;  // the maps and the checked header (token_data.cpp)

 private:
  explicit TokenDataset(std::shared_ptr<const State> s) : s_(std::move(s)) {}
  std::shared_ptr<const State> s_;
};

// A token range [begin, end) of a dataset; end = -1 means num_tokens().
struct TokenRange {
  int64_t begin = 0;
  int64_t end = -1;
};

// Train and validation ranges of one dataset, disjoint in tokens: val is the
// last round(num_tokens * val_fraction) tokens, train the rest (the idea of
// Corpus::split). A separate validation file is a second dataset with its
// own sampler. Throws InvalidArgument unless num_tokens >= 0 and
// 0 <= val_fraction < 1.
struct TokenSplit {
  TokenRange train;
  TokenRange val;
};
TokenSplit split_tokens(int64_t num_tokens, double val_fraction);

struct TokenSamplerOptions {
  int64_t seq_len = 0;  // tokens the model reads per row; a row holds seq_len + 1
  int64_t batch = 0;    // rows of the global batch (all data-parallel ranks)
  uint64_t seed = 0;
  TokenRange range{};   // the tokens the windows are cut from
  bool shuffle = true;  // false: every epoch in window order (evaluation)
  std::string name = "train";  // names the sampler in messages
};

// Where the sample stream stands after some steps (Note [Epoch order]).
struct EpochPosition {
  int64_t epoch = 0;            // epochs completed
  int64_t sample_in_epoch = 0;  // samples of the current epoch consumed, [0, num_samples)
  int64_t samples_consumed = 0;  // steps * batch

  bool operator==(const EpochPosition&) const = default;
};

// Deterministic global batches of windows over a TokenDataset (Notes [Token
// windows], [Epoch order]). A data-parallel rank asks for its own rows and
// reads only those windows' tokens from the map. Holds a copy of the
// dataset (sharing its map). Const after construction and thread safe.
class TokenSampler {
 public:
  // Throws InvalidArgument, naming `name` and the sizes, if seq_len < 1,
  // batch < 1, the range is not inside [0, num_tokens()] or holds fewer than
  // seq_len + 1 tokens.
  TokenSampler(TokenDataset data, TokenSamplerOptions options);

  const TokenDataset& dataset() const { return data_; }
  const TokenSamplerOptions& options() const { return opt_; }
  int64_t seq_len() const { return opt_.seq_len; }
  int64_t batch_size() const { return opt_.batch; }
  int64_t window() const { return opt_.seq_len + 1; }
  int64_t range_begin() const { return begin_; }
  int64_t range_end() const { return end_; }
  // Windows per epoch: floor((end - begin - 1) / seq_len).
  int64_t num_samples() const { return num_samples_; }

  // The window (in [0, num_samples())) at position `index` of epoch
  // `epoch`'s order: perm_epoch(index). Throws InvalidArgument if epoch < 0
  // or index is outside [0, num_samples()).
  int64_t sample(int64_t epoch, int64_t index) const;
  // First token (dataset offset) of window `w`: begin + w * seq_len.
  int64_t window_offset(int64_t w) const;

  // Where row `row` of step `step` falls: epoch = p / num_samples,
  // sample_in_epoch = p mod num_samples, samples_consumed = p, for
  // p = step * batch + row. Throws InvalidArgument for step < 0, a row
  // outside [0, batch) or a position past int64.
  EpochPosition position(int64_t step, int64_t row) const;
  // The position after `steps` complete steps (steps 0 .. steps - 1): what a
  // checkpoint taken then records, and where step `steps` begins.
  EpochPosition position_after(int64_t steps) const;
  // Checks that a recorded position matches position_after(steps) for this
  // sampler; throws InvalidArgument naming both when the batch size, the
  // range or the dataset changed since the checkpoint.
  void check_resume(int64_t steps, const EpochPosition& recorded) const;
  // A 64-bit hash of what decides the rows (tokens, documents, dtype and
  // vocabulary of the dataset; range, seq_len, batch, seed, shuffle) for a
  // checkpoint manifest to compare on resume. It does not hash the tokens.
  uint64_t fingerprint() const;

  // Rows [first_row, first_row + count) of the global batch of `step`, row
  // major: count * window() ids, row r being the window of position(step,
  // r). Throws InvalidArgument for a step or rows outside the batch.
  std::vector<int64_t> rows(int64_t step, int64_t first_row, int64_t count) const;
  // The rows of `step` with the given global indices, in that order (a
  // rank's share of micro-batches need not be contiguous); indices may
  // repeat. Throws InvalidArgument for an index outside [0, batch).
  std::vector<int64_t> rows_at(int64_t step, std::span<const int64_t> row_indices) const;
  // As rows_at(), into `out`, which must hold row_indices.size() * window()
  // ids (throws InvalidArgument otherwise): no allocation.
  void read_rows(int64_t step, std::span<const int64_t> row_indices, std::span<int64_t> out) const;
  // The whole global batch of `step` (batch * window() ids).
  std::vector<int64_t> batch(int64_t step) const;

 private:
  TokenDataset data_;
  TokenSamplerOptions opt_;
  int64_t begin_ = 0;
  int64_t end_ = 0;
  int64_t num_samples_ = 0;
  int half_bits_ = 1;  // the Feistel network's domain is 2^(2 * half_bits_)
};

}  // namespace torus::run
