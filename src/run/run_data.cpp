// torus-train's data: byte corpus or token dataset (run_data.h).
#include "run/run_data.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "core/log.h"
#include "torus/run/corpus.h"
#include "torus/run/run_config.h"
#include "torus/run/token_data.h"

namespace torus::run {
namespace {

using Json = nlohmann::ordered_json;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Rows of one batch of `s`, read a contiguous run of rows at a time.
std::vector<int64_t> gather(const BatchSampler& s, int64_t step, std::span<const int64_t> rows) {
  std::vector<int64_t> out;
  out.reserve(rows.size() * static_cast<size_t>(s.window()));
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    const std::vector<int64_t> run = s.rows(step, rows[i], static_cast<int64_t>(j - i));
    out.insert(out.end(), run.begin(), run.end());
    i = j;
  }
  return out;
}

class CorpusData final : public RunData {
 public:
  explicit CorpusData(const RunConfig& c)
      : corpus_(Corpus::load(c.data.empty() ? default_corpus_path() : c.data)), split_(corpus_.split(c.val_fraction)) {
    train_ =
        std::make_unique<BatchSampler>(split_.train, c.seq, c.batch, static_cast<uint64_t>(c.seed), "training split");
    val_ = std::make_unique<BatchSampler>(split_.val, c.seq, c.batch, static_cast<uint64_t>(c.seed) ^ 0x5eedull,
                                          "validation split");
  }
  std::vector<int64_t> train_rows(int64_t step, std::span<const int64_t> rows) const override {
    return gather(*train_, step, rows);
  }
  std::vector<int64_t> val_rows(int64_t i, std::span<const int64_t> rows) const override {
    return gather(*val_, i, rows);
  }
  std::string position_json(int64_t steps) const override {
    return Json{{"epoch", 0},
                {"sample_in_epoch", steps * train_->batch_size()},
                {"samples_consumed", steps * train_->batch_size()},
                {"samples_per_epoch", nullptr}}
        .dump();
  }
  int64_t vocab_size() const override { return 256; }
  std::string kind() const override { return "corpus"; }
  std::string source() const override { return corpus_.source(); }
  std::string describe() const override {
    return fmt::format("{} ({} bytes: {} train, {} validation)", corpus_.source(), corpus_.size(), split_.train.size(),
                       split_.val.size());
  }
  std::string manifest_json() const override {
    const std::string sha = ckpt::sha256_hex(corpus_.bytes().data(), corpus_.bytes().size());
    return Json{
        {"kind", kind()}, {"source", corpus_.source()}, {"bytes", corpus_.size()}, {"sha256", sha}, {"identity", sha}}
        .dump();
  }

 private:
  Corpus corpus_;
  CorpusSplit split_;
  std::unique_ptr<BatchSampler> train_, val_;
};

class TokenData final : public RunData {
 public:
  explicit TokenData(const RunConfig& c) : data_(TokenDataset::open(c.data)) {
    const TokenSplit split = split_tokens(data_.num_tokens(), c.val_fraction);
    auto options = [&](TokenRange range, bool shuffle, uint64_t seed, const char* name) {
      TORUS_CHECK(range.end - range.begin >= c.seq + 1, InvalidArgument,
                  "--data {}: the {} split holds {} tokens (of {}, --val-fraction {}), fewer than one window of "
                  "--seq {} + 1",
                  c.data, name, range.end - range.begin, data_.num_tokens(), c.val_fraction, c.seq);
      TokenSamplerOptions o;
      o.seq_len = c.seq;
      o.batch = c.batch;
      o.seed = seed;
      o.range = range;
      o.shuffle = shuffle;
      o.name = name;
      return o;
    };
    train_ = std::make_unique<TokenSampler>(
        data_, options(split.train, true, static_cast<uint64_t>(c.seed), "training split"));
    // Evaluation reads the validation windows in order: every evaluation of
    // the run sees the same batches.
    val_ = std::make_unique<TokenSampler>(data_, options(split.val, false, 0, "validation split"));
    TokenSamplerOptions whole;
    whole.seq_len = 1;
    whole.batch = 1;
    identity_ = fmt::format("{:016x}", TokenSampler(data_, whole).fingerprint());
  }
  std::vector<int64_t> train_rows(int64_t step, std::span<const int64_t> rows) const override {
    return train_->rows_at(step, rows);
  }
  std::vector<int64_t> val_rows(int64_t i, std::span<const int64_t> rows) const override {
    return val_->rows_at(i, rows);
  }
  std::string position_json(int64_t steps) const override {
    const EpochPosition p = train_->position_after(steps);
    return Json{{"epoch", p.epoch},
                {"sample_in_epoch", p.sample_in_epoch},
                {"samples_consumed", p.samples_consumed},
                {"samples_per_epoch", train_->num_samples()}}
        .dump();
  }
  int64_t vocab_size() const override { return data_.vocab_size(); }
  std::string kind() const override { return "tokens"; }
  std::string source() const override { return data_.path(); }
  std::string describe() const override {
    return fmt::format("{} ({} {}, {} tokens{}{}: {} train windows per epoch, {} validation)", data_.path(),
                       data_.format() == TokenFormat::kTorus ? "token file" : "Megatron dataset",
                       token_dtype_name(data_.dtype()), data_.num_tokens(),
                       data_.num_documents() > 0 ? fmt::format(" in {} documents", data_.num_documents()) : "",
                       data_.vocab_size() > 0 ? fmt::format(", vocabulary {}", data_.vocab_size()) : "",
                       train_->num_samples(), val_->num_samples());
  }
  std::string manifest_json() const override {
    return Json{{"kind", kind()},
                {"source", data_.path()},
                {"format", data_.format() == TokenFormat::kTorus ? "tok" : "megatron"},
                {"tokens", data_.num_tokens()},
                {"documents", data_.num_documents()},
                {"vocab_size", data_.vocab_size()},
                {"train_windows", train_->num_samples()},
                {"identity", identity_}}
        .dump();
  }

 private:
  TokenDataset data_;
  std::unique_ptr<TokenSampler> train_, val_;
  std::string identity_;
};

}  // namespace

bool token_data_path(const std::string& path) {
  if (path.empty()) return false;
  if (ends_with(path, ".tok") || ends_with(path, ".bin") || ends_with(path, ".idx")) return true;
  std::error_code ec;
  return std::filesystem::is_regular_file(path + ".idx", ec);
}

std::unique_ptr<RunData> open_run_data(const RunConfig& c, int64_t model_vocab) {
  std::unique_ptr<RunData> d;
  if (token_data_path(c.data)) {
    d = std::make_unique<TokenData>(c);
  } else {
    d = std::make_unique<CorpusData>(c);
  }
  TORUS_CHECK(model_vocab <= 0 || d->vocab_size() <= model_vocab, InvalidArgument,
              "--data {}: its vocabulary has {} tokens, the model's embedding {}: pass --vocab {} (or a model "
              "preset with that vocabulary)",
              d->source(), d->vocab_size(), model_vocab, d->vocab_size());
  return d;
}

}  // namespace torus::run
