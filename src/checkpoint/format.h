// Private: the on-disk vocabulary of a sharded checkpoint (checkpoint.h,
// buffers.h), shared by the files that write and read one, free of
// LibTorch: the names of its files, the JSON and text readers, a slice with
// its defaults filled in, and the writer of a safetensors file from host
// buffers. Writing a rank's part is in write_buffers.cpp (tensors:
// write.cpp), publishing and removing in publish.cpp, the manifest and
// verified reads in stored.cpp (tensors: manifest.cpp, assemble.cpp),
// directories in listing.cpp, plain safetensors files in export.cpp, dtype
// codes in dtype_codes.cpp. The LibTorch side of this vocabulary is
// tensors.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "torus/checkpoint/buffers.h"

namespace torus::ckpt {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kComplete = "COMPLETE";

std::string rank_file(int rank);     // "rank-00003.safetensors"
std::string done_file(int rank);     // "rank-00003.done.json"
std::string failed_file(int rank);   // "rank-00003.failed"
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

// The slice `name` (global shape, box, flat range: Note [Slices]) of data of
// shape `data_shape`, defaults filled in; InvalidArgument when the data does
// not fit the box or flat range.
Normal normalize(const std::string& name, const std::vector<int64_t>& global_shape,
                 const std::vector<int64_t>& box_offset, const std::vector<int64_t>& box_shape, int64_t flat_begin,
                 int64_t flat_end, const std::vector<int64_t>& data_shape);

// A tensor as it goes into a safetensors file: contiguous host bytes.
struct Blob {
  std::string name;
  std::string dtype;  // safetensors code
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `blobs` as a new safetensors file (FileWriter: checked, fsynced),
// widest elements first so that every tensor starts aligned to its element
// size (the sort is stable and done in place).
void write_safetensors_file(const std::string& path, std::vector<Blob>& blobs,
                            const std::map<std::string, std::string>& metadata, uint64_t* bytes,
                            std::string* sha);

}  // namespace torus::ckpt
