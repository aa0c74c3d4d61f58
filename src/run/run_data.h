// torus-train's data behind one interface (private to the training loop).
//
// Note [Run data]: --data names a byte corpus (run/corpus.h: a text file or
// a directory, bytes as tokens 0..255, split at val_fraction, windows at
// hashed offsets) or a tokenized dataset (run/token_data.h: a .tok file or
// a Megatron .bin/.idx prefix, split in tokens at val_fraction, windows cut
// at stride seq and shuffled per epoch). The choice is made by the path
// alone (token_data_path() below). Both give, for a step, any rows of the
// global batch of windows (each rank reads the rows it trains on: Trainer::
// local_rows), a description for
// the log, and a JSON record for the checkpoint manifest whose "identity"
// resuming compares: the byte corpus's SHA-256, or the token dataset's
// fingerprint (its size, documents, dtype and vocabulary; not its tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace torus::run {

struct RunConfig;

class RunData {
 public:
  virtual ~RunData() = default;
  // Rows `rows` (indices into the global batch, Trainer::local_rows) of
  // training step `step`, row after row (rows.size() * (seq + 1) ids): a
  // data rank reads only its own rows.
  virtual std::vector<int64_t> train_rows(int64_t step, std::span<const int64_t> rows) const = 0;
  // The same rows of evaluation batch i (the same for every evaluation).
  virtual std::vector<int64_t> val_rows(int64_t i, std::span<const int64_t> rows) const = 0;
  // Where the training stream stands after `steps` steps (epoch, sample in
  // epoch; the byte corpus samples offsets with replacement: epoch 0,
  // sample = steps * batch), for the checkpoint manifest.
  virtual std::string position_json(int64_t steps) const = 0;
  // The largest token id + 1 the data may hold: 256 for bytes, the file's
  // vocabulary for a token file that states one, 0 when unknown.
  virtual int64_t vocab_size() const = 0;
  // "corpus" | "tokens".
  virtual std::string kind() const = 0;
  // The source as given (a path or prefix).
  virtual std::string source() const = 0;
  // For the log: "data: <this>; batch ...".
  virtual std::string describe() const = 0;
  // The manifest's data record (JSON object text): kind, source, identity,
  // sizes; seed, batch, seq and val_fraction are added by the loop.
  virtual std::string manifest_json() const = 0;
};

// Whether --data `path` names a tokenized dataset: x.tok, x.bin, x.idx, or a
// prefix p with p.idx present.
bool token_data_path(const std::string& path);

// Opens the run's data (the default corpus when c.data is empty). Throws
// InvalidArgument naming the file, the split and the sizes when the data
// cannot hold a window of c.seq + 1 tokens, or when its vocabulary exceeds
// `model_vocab` (then the model cannot embed every id). No communication.
std::unique_ptr<RunData> open_run_data(const RunConfig& c, int64_t model_vocab);

}  // namespace torus::run
