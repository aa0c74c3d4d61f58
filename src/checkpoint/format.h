// Private: the on-disk vocabulary of a sharded checkpoint (checkpoint.h),
// shared by the files that write and read one: the names of its files, the
// JSON and text readers, a slice with its defaults filled in, and the writer
// of a safetensors file from tensors. Writing is in write.cpp, the manifest
// in manifest.cpp, reading in assemble.cpp, directories in listing.cpp,
// plain safetensors files in export.cpp, dtype codes in dtype_codes.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "torus/checkpoint/checkpoint.h"

namespace torus::ckpt {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kComplete = "COMPLETE";

std::string rank_file(int rank);     // "rank-00003.safetensors"
std::string done_file(int rank);     // "rank-00003.done.json"
std::string step_dir(int64_t step);  // "step-00000100"

int64_t numel_of(const std::vector<int64_t>& shape);

// CheckpointError naming `what` when `text` is not JSON.
Json parse_json(const std::string& text, const std::string& what);
// A whole file as text; CheckpointError when it cannot be read.
std::string read_text(const std::string& path);

// A slice with its defaults filled in and checked.
struct Normal {
  std::vector<int64_t> global, off, box;
  int64_t fb = -1, fe = -1;
};

Normal normalize(const std::string& name, const TensorSlice& s);

// A tensor as it goes into a safetensors file, with its slice record.
struct Item {
  std::string name;
  at::Tensor data;  // contiguous, CPU, what goes into the file
  Json slice;
};

// Safetensors entries and data for `items`, widest elements first so that
// every tensor starts aligned to its element size.
void write_safetensors_file(const std::string& path, std::vector<Item>& items,
                            const std::map<std::string, std::string>& metadata, uint64_t* bytes,
                            std::string* sha);

}  // namespace torus::ckpt
