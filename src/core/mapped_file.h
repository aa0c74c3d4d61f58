// Private: a whole file mapped read-only (mmap), for every reader of large
// files: checkpoints and safetensors (checkpoint/file_io.h wraps it to fail
// with CheckpointError) and token datasets. No LibTorch.
//
// Contract: the file is opened, checked to be a regular file, mapped whole
// and its descriptor closed; the mapping lives until the object is destroyed
// (or moved from). An empty file maps to size() 0 and a null data(). The
// bytes are read-only; the object is movable, not copyable, and may be read
// from any thread.
//
// Errors: MapError, naming the path, the call that failed and errno, so that
// each caller words the failure in its own terms.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "torus/core/error.h"

namespace torus {

// A file could not be mapped. what(): "<call> <path>: <errno text>", or
// "map <path>: not a regular file".
class MapError : public Error {
 public:
  // `call` is a string literal (it is kept, not copied).
  MapError(std::string path, const char* call, int error, uint64_t bytes);
  const std::string& path() const { return path_; }
  // "open", "fstat", "map" (the path is not a regular file), "mmap" or "close".
  std::string_view call() const { return call_; }
  // errno of the failed call; 0 when the path is not a regular file.
  int error() const { return error_; }
  // The file's size when it was known at the failure (fstat had run), else 0.
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  const char* call_;
  int error_;
  uint64_t bytes_;
};

class MappedFile {
 public:
  explicit MappedFile(std::string path);  // throws MapError
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace torus
