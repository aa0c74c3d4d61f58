// tests/train/engine_test_util.h — what the engine's multi-rank tests share:
// a small GPT and deterministic batches from the default corpus.
#pragma once

#include <ATen/Functions.h>

#include <cstdint>
#include <vector>

#include "torus/models/gpt.h"
#include "torus/run/corpus.h"

namespace torus::engine::testing_util {

// 4 blocks, width 64, 4 heads, sequence up to 32, vocabulary 256.
inline models::GPTConfig small_gpt(c10::ScalarType dtype = at::kFloat) {
  models::GPTConfig c = models::GPTConfig::tiny();
  c.vocab_size = 256;
  c.max_seq_len = 32;
  c.num_layers = 4;
  c.hidden = 64;
  c.dtype = dtype;
  return c;
}

// The batch of step k, the same on every rank: windows of the default
// corpus drawn by a sampler seeded with `seed`.
inline at::Tensor batch_of(int64_t step, int64_t rows, int64_t seq, uint64_t seed) {
  static const run::Corpus corpus = run::Corpus::load(run::default_corpus_path());
  static const run::CorpusSplit split = corpus.split(0.1);
  const run::BatchSampler s(split.train, seq, rows, seed, "train");
  const std::vector<int64_t> tokens = s.batch(step);
  return at::from_blob(const_cast<int64_t*>(tokens.data()), {rows, seq + 1}, at::TensorOptions().dtype(at::kLong))
      .clone();
}

}  // namespace torus::engine::testing_util
