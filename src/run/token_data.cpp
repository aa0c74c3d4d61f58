// Tokenized datasets over read-only memory maps (.tok, Megatron .bin/.idx),
// checked as Note [Untrusted token files] says; the TokenSampler of Notes
// [Token windows] and [Epoch order].
#include "torus/run/token_data.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/log.h"
#include "core/mapped_file.h"
#include "torus/core/error.h"
#include "torus/run/corpus.h"  // splitmix64

namespace torus::run {
namespace fs = std::filesystem;

// Both formats store little-endian integers, read here as native ones.
static_assert(std::endian::native == std::endian::little, "token files are read on little-endian hosts only");

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// A whole file mapped read-only (core/mapped_file.h); `what` names the
// file's role in messages ("token file", "Megatron index").
std::unique_ptr<MappedFile> map_file(const std::string& path, const char* what) {
  try {
    return std::make_unique<MappedFile>(path);
  } catch (const MapError& e) {
    const std::string_view call = e.call();
    TORUS_CHECK(!(call == "open" && e.error() == ENOENT), InvalidArgument, "{} '{}' does not exist", what, path);
    TORUS_CHECK(e.error() != 0, InvalidArgument, "{} '{}' is not a regular file", what, path);
    if (call == "mmap") {
      throw Error(fmt::format("{} '{}': cannot map {} bytes: {}", what, path, e.bytes(), std::strerror(e.error())));
    }
    throw Error(fmt::format("{} '{}': cannot {}: {}", what, path, call == "fstat" ? "stat" : call,
                            std::strerror(e.error())));
  }
}

// An unaligned little-endian load (the .idx arrays start at byte 34).
template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr char kTokMagic[8] = {'T', 'O', 'R', 'U', 'S', 'T', 'O', 'K'};
constexpr int64_t kTokHeaderBytes = 40;
constexpr char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kIdxHeaderBytes = 34;

}  // namespace

struct TokenDataset::State {
  TokenFormat format = TokenFormat::kTorus;
  std::string path;        // .tok path or Megatron prefix
  std::string token_file;  // the file holding the tokens (messages)
  TokenDtype dtype = TokenDtype::kUInt16;
  int itemsize = 2;
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t num_documents = 0;
  std::unique_ptr<MappedFile> data_map;
  std::unique_ptr<MappedFile> index_map;  // Megatron only
  const uint8_t* tokens = nullptr;
  // .tok: u64 offsets[num_documents + 1]. Megatron: i64 document index
  // [num_documents + 1] and i64 pointers[num_sequences].
  const uint8_t* doc_offsets = nullptr;
  const uint8_t* doc_index = nullptr;
  const uint8_t* seq_pointers = nullptr;
  int64_t num_sequences = 0;
};

const char* token_dtype_name(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUInt8: return "uint8";
    case TokenDtype::kInt8: return "int8";
    case TokenDtype::kInt16: return "int16";
    case TokenDtype::kUInt16: return "uint16";
    case TokenDtype::kInt32: return "int32";
    case TokenDtype::kUInt32: return "uint32";
    case TokenDtype::kInt64: return "int64";
  }
  return "?";
}

int token_dtype_size(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUInt8:
    case TokenDtype::kInt8: return 1;
    case TokenDtype::kInt16:
    case TokenDtype::kUInt16: return 2;
    case TokenDtype::kInt32:
    case TokenDtype::kUInt32: return 4;
    case TokenDtype::kInt64: return 8;
  }
  return 0;
}

TokenDataset TokenDataset::open_tok(const std::string& path) {
  auto s = std::make_shared<State>();
  s->format = TokenFormat::kTorus;
  s->path = path;
  s->token_file = path;
  s->data_map = map_file(path, "token file");
  const uint8_t* b = s->data_map->data();
  const int64_t size = static_cast<int64_t>(s->data_map->size());
  TORUS_CHECK(size >= kTokHeaderBytes, InvalidArgument,
              "token file '{}': {} bytes is shorter than the {}-byte header", path, size, kTokHeaderBytes);
  TORUS_CHECK(std::memcmp(b, kTokMagic, sizeof kTokMagic) == 0, InvalidArgument,
              "token file '{}': bad magic (not a Torus token file; expected \"TORUSTOK\")", path);
  const uint32_t version = load<uint32_t>(b + 8);
  TORUS_CHECK(version == 1, InvalidArgument, "token file '{}': unsupported version {} (this build reads 1)", path,
              version);
  const uint32_t code = load<uint32_t>(b + 12);
  TORUS_CHECK(code == 2 || code == 4, InvalidArgument,
              "token file '{}': bad dtype code {} (2 = uint16, 4 = uint32)", path, code);
  s->dtype = code == 2 ? TokenDtype::kUInt16 : TokenDtype::kUInt32;
  s->itemsize = static_cast<int>(code);
  const uint64_t num_tokens = load<uint64_t>(b + 16);
  const uint64_t vocab = load<uint64_t>(b + 24);
  const uint64_t num_docs = load<uint64_t>(b + 32);
  const uint64_t body = static_cast<uint64_t>(size - kTokHeaderBytes);
  // Each count is bounded by the file size before it is multiplied.
  TORUS_CHECK(num_docs == 0 || num_docs < body / 8, InvalidArgument,
              "token file '{}': num_documents {} does not fit the file's {} bytes", path, num_docs, size);
  const uint64_t offsets_bytes = num_docs > 0 ? 8 * (num_docs + 1) : 0;
  TORUS_CHECK(num_tokens <= body / s->itemsize && offsets_bytes + num_tokens * s->itemsize == body, InvalidArgument,
              "token file '{}': {} bytes, but the header says {} + {} bytes of document offsets + {} tokens x {} "
              "bytes (truncated, or not written by a complete write)",
              path, size, kTokHeaderBytes, offsets_bytes, num_tokens, s->itemsize);
  TORUS_CHECK(vocab <= static_cast<uint64_t>(kInt64Max), InvalidArgument, "token file '{}': vocab_size {} too large",
              path, vocab);
  s->num_tokens = static_cast<int64_t>(num_tokens);
  s->vocab_size = static_cast<int64_t>(vocab);
  s->num_documents = static_cast<int64_t>(num_docs);
  if (num_docs > 0) {
    s->doc_offsets = b + kTokHeaderBytes;
    uint64_t prev = load<uint64_t>(s->doc_offsets);
    TORUS_CHECK(prev == 0, InvalidArgument, "token file '{}': document offset 0 is {}, not 0", path, prev);
    for (uint64_t d = 1; d <= num_docs; ++d) {
      const uint64_t o = load<uint64_t>(s->doc_offsets + 8 * d);
      TORUS_CHECK(o >= prev, InvalidArgument,
                  "token file '{}': document offsets not monotone: offset {} is {} < offset {} = {}", path, d, o,
                  d - 1, prev);
      prev = o;
    }
    TORUS_CHECK(prev == num_tokens, InvalidArgument,
                "token file '{}': the last document offset is {}, not num_tokens = {}", path, prev, num_tokens);
  }
  s->tokens = b + kTokHeaderBytes + offsets_bytes;
  TORUS_LOG_DEBUG("token file {}: {} {} tokens, {} documents, vocab {}", path, num_tokens,
                  token_dtype_name(s->dtype), num_docs, vocab);
  return TokenDataset(std::move(s));
}

TokenDataset TokenDataset::open_megatron(const std::string& prefix) {
  auto s = std::make_shared<State>();
  s->format = TokenFormat::kMegatron;
  s->path = prefix;
  const std::string idx = prefix + ".idx";
  const std::string bin = prefix + ".bin";
  s->token_file = bin;
  s->index_map = map_file(idx, "Megatron index");
  s->data_map = map_file(bin, "Megatron data file");
  const uint8_t* b = s->index_map->data();
  const int64_t size = static_cast<int64_t>(s->index_map->size());
  TORUS_CHECK(size >= kIdxHeaderBytes, InvalidArgument,
              "Megatron index '{}': {} bytes is shorter than the {}-byte header (truncated)", idx, size,
              kIdxHeaderBytes);
  TORUS_CHECK(std::memcmp(b, kIdxMagic, sizeof kIdxMagic) == 0, InvalidArgument,
              "Megatron index '{}': bad magic (expected \"MMIDIDX\\0\\0\")", idx);
  const uint64_t version = load<uint64_t>(b + 9);
  TORUS_CHECK(version == 1, InvalidArgument, "Megatron index '{}': unsupported version {} (this build reads 1)", idx,
              version);
  const uint8_t code = b[17];
  switch (code) {
    case 1: s->dtype = TokenDtype::kUInt8; break;
    case 2: s->dtype = TokenDtype::kInt8; break;
    case 3: s->dtype = TokenDtype::kInt16; break;
    case 4: s->dtype = TokenDtype::kInt32; break;
    case 5: s->dtype = TokenDtype::kInt64; break;
    case 8: s->dtype = TokenDtype::kUInt16; break;
    case 6:
    case 7:
      throw InvalidArgument(fmt::format("Megatron index '{}': dtype code {} ({}) does not hold token ids", idx, code,
                                        code == 6 ? "float64" : "float32"));
    default:
      throw InvalidArgument(fmt::format("Megatron index '{}': unknown dtype code {}", idx, code));
  }
  s->itemsize = token_dtype_size(s->dtype);
  const uint64_t seqs = load<uint64_t>(b + 18);
  const uint64_t docs = load<uint64_t>(b + 26);
  const uint64_t body = static_cast<uint64_t>(size - kIdxHeaderBytes);
  TORUS_CHECK(seqs <= body / 12 && docs <= body / 8, InvalidArgument,
              "Megatron index '{}': {} sequences and {} document entries do not fit its {} bytes (truncated?)", idx,
              seqs, docs, size);
  const uint64_t arrays = 12 * seqs + 8 * docs;
  // Multimodal files add one int8 mode per sequence; the modes are ignored.
  TORUS_CHECK(body == arrays || body == arrays + seqs, InvalidArgument,
              "Megatron index '{}': {} bytes, but {} sequences and {} document entries need {} (or {} with modes)",
              idx, size, seqs, docs, kIdxHeaderBytes + arrays, kIdxHeaderBytes + arrays + seqs);
  TORUS_CHECK(docs >= 1, InvalidArgument,
              "Megatron index '{}': the document index is empty (it holds documents + 1 entries)", idx);
  const uint8_t* lengths = b + kIdxHeaderBytes;
  s->seq_pointers = lengths + 4 * seqs;
  s->doc_index = s->seq_pointers + 8 * seqs;
  s->num_sequences = static_cast<int64_t>(seqs);
  s->num_documents = static_cast<int64_t>(docs) - 1;

  // Pointers: sequence i starts where sequence i - 1 ends (Megatron's writer).
  const int64_t bin_size = static_cast<int64_t>(s->data_map->size());
  int64_t end = 0;  // bytes
  for (int64_t i = 0; i < s->num_sequences; ++i) {
    const int32_t len = load<int32_t>(lengths + 4 * i);
    const int64_t ptr = load<int64_t>(s->seq_pointers + 8 * i);
    TORUS_CHECK(len >= 0, InvalidArgument, "Megatron index '{}': sequence {} has negative length {}", idx, i, len);
    TORUS_CHECK(ptr >= 0, InvalidArgument, "Megatron index '{}': sequence {} has negative pointer {}", idx, i, ptr);
    TORUS_CHECK(ptr <= bin_size, InvalidArgument,
                "Megatron index '{}': pointer {} of sequence {} is past the end of '{}' ({} bytes)", idx, ptr, i, bin,
                bin_size);
    TORUS_CHECK(ptr == end, InvalidArgument,
                "Megatron index '{}': sequence {} starts at byte {}, but the lengths before it end at byte {} "
                "(lengths inconsistent with pointers)",
                idx, i, ptr, end);
    end += static_cast<int64_t>(len) * s->itemsize;
    TORUS_CHECK(end <= bin_size, InvalidArgument,
                "Megatron index '{}': sequence {} ({} tokens at byte {}) runs past the end of '{}' ({} bytes)", idx,
                i, len, ptr, bin, bin_size);
  }
  TORUS_CHECK(end == bin_size, InvalidArgument,
              "Megatron index '{}': the sequences hold {} bytes but '{}' has {} (index and data file do not match)",
              idx, end, bin, bin_size);
  s->num_tokens = end / s->itemsize;

  int64_t prev = load<int64_t>(s->doc_index);
  TORUS_CHECK(prev == 0, InvalidArgument, "Megatron index '{}': document index 0 is {}, not 0", idx, prev);
  for (int64_t d = 1; d <= s->num_documents; ++d) {
    const int64_t v = load<int64_t>(s->doc_index + 8 * d);
    TORUS_CHECK(v >= prev, InvalidArgument,
                "Megatron index '{}': document indices not monotone: entry {} is {} < entry {} = {}", idx, d, v, d - 1,
                prev);
    prev = v;
  }
  TORUS_CHECK(prev == s->num_sequences, InvalidArgument,
              "Megatron index '{}': the last document index is {}, not the sequence count {}", idx, prev,
              s->num_sequences);
  s->tokens = s->data_map->data();
  TORUS_LOG_DEBUG("Megatron dataset {}: {} {} tokens, {} sequences, {} documents", prefix, s->num_tokens,
                  token_dtype_name(s->dtype), seqs, s->num_documents);
  return TokenDataset(std::move(s));
}

TokenDataset TokenDataset::open(const std::string& path) {
  if (ends_with(path, ".tok")) return open_tok(path);
  if (ends_with(path, ".bin") || ends_with(path, ".idx")) return open_megatron(path.substr(0, path.size() - 4));
  std::error_code ec;
  if (fs::exists(path + ".idx", ec)) return open_megatron(path);
  TORUS_CHECK(fs::is_regular_file(path, ec), InvalidArgument,
              "token data '{}': no such file, and no Megatron dataset '{}.idx' / '{}.bin'", path, path, path);
  return open_tok(path);  // checks the magic
}

TokenFormat TokenDataset::format() const {
  return s_->format;
}
const std::string& TokenDataset::path() const {
  return s_->path;
}
TokenDtype TokenDataset::dtype() const {
  return s_->dtype;
}
int64_t TokenDataset::num_tokens() const {
  return s_->num_tokens;
}
int64_t TokenDataset::vocab_size() const {
  return s_->vocab_size;
}
int64_t TokenDataset::num_documents() const {
  return s_->num_documents;
}

int64_t TokenDataset::document_offset(int64_t d) const {
  TORUS_CHECK(d >= 0 && d <= s_->num_documents, InvalidArgument, "token data '{}': document {} outside [0, {}]",
              s_->path, d, s_->num_documents);
  if (s_->format == TokenFormat::kTorus) return static_cast<int64_t>(load<uint64_t>(s_->doc_offsets + 8 * d));
  const int64_t seq = load<int64_t>(s_->doc_index + 8 * d);
  if (seq == s_->num_sequences) return s_->num_tokens;
  return load<int64_t>(s_->seq_pointers + 8 * seq) / s_->itemsize;
}

namespace {

// Converts n tokens of type T to int64 and checks them against [0, limit):
// the check is folded into the conversion loop and only a failure rescans.
template <class T>
void convert(const uint8_t* base, int64_t offset, int64_t n, int64_t limit, int64_t* out,
             const TokenDataset::State& s) {
  // Token arrays start 8-byte aligned in both formats (after the 40-byte
  // header and u64 offsets, or at the start of the .bin).
  const T* p = reinterpret_cast<const T*>(base) + offset;
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(p[i]);
    out[i] = v;
    bad |= (v < 0) | (v >= limit);
  }
  if (!bad) [[likely]] return;
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] < 0 || out[i] >= limit) {
      throw InvalidArgument(fmt::format("token data '{}': token {} at offset {} is {}", s.token_file, out[i],
                                        offset + i,
                                        out[i] < 0 ? std::string("negative")
                                                   : fmt::format("outside the vocabulary of {}", limit)));
    }
  }
}

}  // namespace

void TokenDataset::read(int64_t offset, int64_t count, int64_t* out) const {
  TORUS_CHECK(offset >= 0 && count >= 0 && offset <= s_->num_tokens - count, InvalidArgument,
              "token data '{}': read of tokens [{}, {} + {}) outside [0, {})", s_->path, offset, offset, count,
              s_->num_tokens);
  const int64_t limit = s_->vocab_size > 0 ? s_->vocab_size : kInt64Max;
  switch (s_->dtype) {
    case TokenDtype::kUInt8: return convert<uint8_t>(s_->tokens, offset, count, limit, out, *s_);
    case TokenDtype::kInt8: return convert<int8_t>(s_->tokens, offset, count, limit, out, *s_);
    case TokenDtype::kInt16: return convert<int16_t>(s_->tokens, offset, count, limit, out, *s_);
    case TokenDtype::kUInt16: return convert<uint16_t>(s_->tokens, offset, count, limit, out, *s_);
    case TokenDtype::kInt32: return convert<int32_t>(s_->tokens, offset, count, limit, out, *s_);
    case TokenDtype::kUInt32: return convert<uint32_t>(s_->tokens, offset, count, limit, out, *s_);
    case TokenDtype::kInt64: return convert<int64_t>(s_->tokens, offset, count, limit, out, *s_);
  }
}

std::vector<int64_t> TokenDataset::read(int64_t offset, int64_t count) const {
  TORUS_CHECK(count >= 0, InvalidArgument, "token data '{}': negative read count {}", s_->path, count);
  std::vector<int64_t> out(static_cast<size_t>(count));
  read(offset, count, out.data());
  return out;
}

int64_t TokenDataset::validate_tokens() const {
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::vector<int64_t> buf(static_cast<size_t>(std::min(kChunk, s_->num_tokens)));
  int64_t max_id = -1;
  for (int64_t off = 0; off < s_->num_tokens; off += kChunk) {
    const int64_t n = std::min(kChunk, s_->num_tokens - off);
    read(off, n, buf.data());
    max_id = std::max(max_id, *std::max_element(buf.begin(), buf.begin() + n));
  }
  return max_id;
}

std::string TokenDataset::describe() const {
  return fmt::format("{} '{}' ({}, {} tokens, {} documents, vocab {})",
                     s_->format == TokenFormat::kTorus ? "token file" : "Megatron dataset", s_->path,
                     token_dtype_name(s_->dtype), s_->num_tokens, s_->num_documents,
                     s_->vocab_size > 0 ? std::to_string(s_->vocab_size) : std::string("unknown"));
}

TokenSplit split_tokens(int64_t num_tokens, double val_fraction) {
  TORUS_CHECK(num_tokens >= 0, InvalidArgument, "split_tokens: num_tokens must be >= 0, got {}", num_tokens);
  TORUS_CHECK(val_fraction >= 0 && val_fraction < 1, InvalidArgument,
              "split_tokens: validation fraction must be in [0, 1), got {}", val_fraction);
  const int64_t n_val =
      std::min(num_tokens, static_cast<int64_t>(std::llround(static_cast<double>(num_tokens) * val_fraction)));
  const int64_t cut = num_tokens - n_val;
  return TokenSplit{.train = {.begin = 0, .end = cut}, .val = {.begin = cut, .end = num_tokens}};
}

// ---------------------------------------------------------------- sampler

TokenSampler::TokenSampler(TokenDataset data, TokenSamplerOptions options)
    : data_(std::move(data)), opt_(std::move(options)) {
  const std::string& n = opt_.name;
  TORUS_CHECK(opt_.seq_len >= 1, InvalidArgument, "token sampler ({}): seq_len must be >= 1, got {}", n,
              opt_.seq_len);
  TORUS_CHECK(opt_.batch >= 1, InvalidArgument, "token sampler ({}): batch must be >= 1, got {}", n, opt_.batch);
  const int64_t total = data_.num_tokens();
  begin_ = opt_.range.begin;
  end_ = opt_.range.end == -1 ? total : opt_.range.end;
  TORUS_CHECK(begin_ >= 0 && begin_ <= end_ && end_ <= total, InvalidArgument,
              "token sampler ({}): token range [{}, {}) is not inside [0, {}) of {}", n, begin_, end_, total,
              data_.path());
  TORUS_CHECK(end_ - begin_ >= opt_.seq_len + 1, InvalidArgument,
              "token sampler ({}): {} tokens of {} are fewer than one window of seq_len + 1 = {}", n, end_ - begin_,
              data_.path(), opt_.seq_len + 1);
  num_samples_ = (end_ - begin_ - 1) / opt_.seq_len;
  // Smallest h with 4^h >= num_samples: the Feistel domain is under 4x the
  // range, so cycle-walking takes fewer than 4 rounds on average.
  half_bits_ = 1;
  while (half_bits_ < 31 && (uint64_t{1} << (2 * half_bits_)) < static_cast<uint64_t>(num_samples_)) ++half_bits_;
}

int64_t TokenSampler::sample(int64_t epoch, int64_t index) const {
  TORUS_CHECK(epoch >= 0 && index >= 0 && index < num_samples_, InvalidArgument,
              "token sampler ({}): epoch {} index {} outside [0, {})", opt_.name, epoch, index, num_samples_);
  if (!opt_.shuffle) return index;
  constexpr int kRounds = 6;
  uint64_t keys[kRounds];
  const uint64_t base = splitmix64(splitmix64(opt_.seed) ^ static_cast<uint64_t>(epoch));
  for (int r = 0; r < kRounds; ++r) keys[r] = splitmix64(base + static_cast<uint64_t>(r));
  const int h = half_bits_;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  uint64_t x = static_cast<uint64_t>(index);
  // A bijection of [0, 4^h) applied until the value lands in [0, n): the
  // walk stays on x's cycle, which holds x itself, so it ends, and the
  // result is a bijection of [0, n).
  do {
    uint64_t l = x >> h, r = x & mask;
    for (uint64_t k : keys) {
      const uint64_t f = splitmix64(k ^ r) & mask;
      const uint64_t next_r = l ^ f;
      l = r;
      r = next_r;
    }
    x = (l << h) | r;
  } while (x >= static_cast<uint64_t>(num_samples_));
  return static_cast<int64_t>(x);
}

int64_t TokenSampler::window_offset(int64_t w) const {
  TORUS_CHECK(w >= 0 && w < num_samples_, InvalidArgument, "token sampler ({}): window {} outside [0, {})",
              opt_.name, w, num_samples_);
  return begin_ + w * opt_.seq_len;
}

EpochPosition TokenSampler::position(int64_t step, int64_t row) const {
  TORUS_CHECK(step >= 0, InvalidArgument, "token sampler ({}): step must be >= 0, got {}", opt_.name, step);
  TORUS_CHECK(row >= 0 && row < opt_.batch, InvalidArgument, "token sampler ({}): row {} outside the batch of {}",
              opt_.name, row, opt_.batch);
  TORUS_CHECK(step <= (kInt64Max - row) / opt_.batch, InvalidArgument,
              "token sampler ({}): step {} x batch {} overflows int64", opt_.name, step, opt_.batch);
  const int64_t p = step * opt_.batch + row;
  return EpochPosition{.epoch = p / num_samples_, .sample_in_epoch = p % num_samples_, .samples_consumed = p};
}

EpochPosition TokenSampler::position_after(int64_t steps) const {
  TORUS_CHECK(steps >= 0, InvalidArgument, "token sampler ({}): steps must be >= 0, got {}", opt_.name, steps);
  TORUS_CHECK(steps <= kInt64Max / opt_.batch, InvalidArgument,
              "token sampler ({}): {} steps x batch {} overflows int64", opt_.name, steps, opt_.batch);
  const int64_t p = steps * opt_.batch;
  return EpochPosition{.epoch = p / num_samples_, .sample_in_epoch = p % num_samples_, .samples_consumed = p};
}

void TokenSampler::check_resume(int64_t steps, const EpochPosition& recorded) const {
  const EpochPosition now = position_after(steps);
  TORUS_CHECK(now == recorded, InvalidArgument,
              "token sampler ({}): resuming after step {}: the checkpoint recorded epoch {}, sample {} of the epoch, "
              "{} samples consumed; this sampler ({} samples per epoch, batch {}) is at epoch {}, sample {}, {} "
              "consumed: the dataset, its range, seq_len or the batch size changed",
              opt_.name, steps, recorded.epoch, recorded.sample_in_epoch, recorded.samples_consumed, num_samples_,
              opt_.batch, now.epoch, now.sample_in_epoch, now.samples_consumed);
}

uint64_t TokenSampler::fingerprint() const {
  uint64_t h = splitmix64(0x544f525553544f4bull);  // "TORUSTOK"
  auto mix = [&h](uint64_t v) { h = splitmix64(h ^ v); };
  mix(static_cast<uint64_t>(data_.format()));
  mix(static_cast<uint64_t>(data_.dtype()));
  mix(static_cast<uint64_t>(data_.num_tokens()));
  mix(static_cast<uint64_t>(data_.num_documents()));
  mix(static_cast<uint64_t>(data_.vocab_size()));
  mix(static_cast<uint64_t>(begin_));
  mix(static_cast<uint64_t>(end_));
  mix(static_cast<uint64_t>(opt_.seq_len));
  mix(static_cast<uint64_t>(opt_.batch));
  mix(opt_.seed);
  mix(opt_.shuffle ? 1 : 0);
  return h;
}

void TokenSampler::read_rows(int64_t step, std::span<const int64_t> row_indices, std::span<int64_t> out) const {
  const int64_t w = window();
  TORUS_CHECK(out.size() == row_indices.size() * static_cast<size_t>(w), InvalidArgument,
              "token sampler ({}): {} rows need {} ids, the output holds {}", opt_.name, row_indices.size(),
              row_indices.size() * static_cast<size_t>(w), out.size());
  for (size_t k = 0; k < row_indices.size(); ++k) {
    const EpochPosition p = position(step, row_indices[k]);
    const int64_t offset = window_offset(sample(p.epoch, p.sample_in_epoch));
    data_.read(offset, w, out.data() + k * static_cast<size_t>(w));
  }
}

std::vector<int64_t> TokenSampler::rows_at(int64_t step, std::span<const int64_t> row_indices) const {
  std::vector<int64_t> out(row_indices.size() * static_cast<size_t>(window()));
  read_rows(step, row_indices, out);
  return out;
}

std::vector<int64_t> TokenSampler::rows(int64_t step, int64_t first_row, int64_t count) const {
  TORUS_CHECK(first_row >= 0 && count >= 0 && first_row <= opt_.batch - count, InvalidArgument,
              "token sampler ({}): rows [{}, {} + {}) outside the batch of {}", opt_.name, first_row, first_row,
              count, opt_.batch);
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) idx[static_cast<size_t>(i)] = first_row + i;
  return rows_at(step, idx);
}

std::vector<int64_t> TokenSampler::batch(int64_t step) const {
  return rows(step, 0, opt_.batch);
}

}  // namespace torus::run
