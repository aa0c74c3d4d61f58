// torus/run/model_presets.h — models by name: the shapes `torus-train
// --model NAME` and torus.train.RunConfig(model=NAME) start from.
// LibTorch-free (the option table's --help lists them); the model registry
// (model.h: make_model) builds a model from a preset and the run's shape
// options, each of which, when given (non-zero), overrides the preset's.
//
//   name          family  layers  width  heads (kv)  ffn    vocab   context  parameters
//   gpt           gpt     4       128    4           512    256     --seq    the default of torus-train
//   gpt2-tiny     gpt     2       64     4           256    256     --seq    tests: trains in seconds
//   gpt2          gpt     12      768    12          3072   50257   1024     GPT-2 124M
//   gpt2-medium   gpt     24      1024   16          4096   50257   1024     GPT-2 355M
//   llama-tiny    llama   2       64     4 (2)       128    256     --seq    tests: trains in seconds
//   llama-125m    llama   12      768    12 (4)      2048   32000   2048     a Llama-style 125M
//   llama-1b      llama   16      2048   32 (8)      8192   128256  2048     Llama 3.2 1B's shape (rope 500k, llama3 scaling)
//
// Byte-level presets (vocab 256) train on the byte corpus; the others
// expect tokenized data (docs/data.md) or Hugging Face weights (docs/hf.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torus::run {

struct ModelPreset {
  std::string name;
  std::string family;  // gpt | llama
  int64_t layers = 0, hidden = 0, heads = 0;
  int64_t kv_heads = 0;  // 0: heads
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t ffn = 0;       // 0: the family's rule (4h; Llama 8h/3 rounded to 256)
  int64_t vocab = 0;
  int64_t context = 0;   // the position table / longest sequence (0: the run's --seq)
  double rope_theta = 10000;
  std::string rope_scaling = "none";  // none | llama3 (factor 32, 1, 4, 8192: Llama 3.1's)
  std::string description;
};

// Every preset, in the order above.
const std::vector<ModelPreset>& model_presets();
// The preset `name`, or nullptr.
const ModelPreset* find_model_preset(const std::string& name);
// "gpt, gpt2-tiny, ..." (for messages and --help).
std::string model_preset_names();

// Whether `dir` is a directory holding a config.json: what --model DIR (the
// shape from a Hugging Face config, docs/hf.md) and --init-from DIR take.
bool is_hf_model_dir(const std::string& dir);

}  // namespace torus::run
