// The model presets (model_presets.h).
#include "torus/run/model_presets.h"

#include <filesystem>
#include <system_error>

namespace torus::run {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"gpt", "gpt", 4, 128, 4, 0, 0, 0, 256, 0, 10000, "none", "the default: a small byte-level GPT"},
      {"gpt2-tiny", "gpt", 2, 64, 4, 0, 0, 0, 256, 0, 10000, "none", "a byte-level GPT-2 for tests"},
      {"gpt2", "gpt", 12, 768, 12, 0, 0, 0, 50257, 1024, 10000, "none", "GPT-2 124M"},
      {"gpt2-medium", "gpt", 24, 1024, 16, 0, 0, 0, 50257, 1024, 10000, "none", "GPT-2 355M"},
      {"llama-tiny", "llama", 2, 64, 4, 2, 0, 128, 256, 0, 10000, "none", "a byte-level Llama for tests (GQA)"},
      {"llama-125m", "llama", 12, 768, 12, 4, 0, 2048, 32000, 2048, 10000, "none", "a Llama-style 125M"},
      {"llama-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 2048, 500000, "llama3", "Llama 3.2 1B's shape"},
  };
  return presets;
}

const ModelPreset* find_model_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string model_preset_names() {
  std::string out;
  for (const ModelPreset& p : model_presets()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && std::filesystem::is_regular_file(std::filesystem::path(dir) / "config.json", ec);
}

}  // namespace torus::run
