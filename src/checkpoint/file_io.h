// Private: checked file writing for checkpoints (no LibTorch).
//
// Every write(2), fsync(2), close(2) and rename(2) is checked; a failure
// throws ckpt::CheckpointError naming the path, the call and errno's text
// (ENOSPC: "No space left on device"). A writer that is destroyed without
// close() removes nothing and leaves a partial file, which is never part of
// a complete checkpoint (the directory it lies in is renamed only after
// every file is closed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "torus/checkpoint/safetensors.h"

namespace torus::ckpt {

// Testing: makes the writers of this process fail as a full disk would.
// After `fail_after_bytes` bytes have been written in total by all writers
// (counted from the call), the next write fails with errno `error`
// (default ENOSPC). -1 switches it off. Thread safe.
void inject_write_failure(int64_t fail_after_bytes, int error = 28 /* ENOSPC */);

// Streams bytes into a new file (O_CREAT | O_EXCL: an existing file is an
// error) and computes their SHA-256 on the way.
class FileWriter {
 public:
  explicit FileWriter(std::string path);
  ~FileWriter();  // closes the descriptor if close() was not called; never throws
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);  // all of it, retrying short writes and EINTR
  // fsync, then close; returns the lowercase hex SHA-256 of everything written.
  std::string close();
  uint64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  uint64_t writeback_ = 0;  // bytes whose writeback was started (Note [Overlapped writes])
  struct Hash;
  std::unique_ptr<Hash> hash_;
};

// Writes `text` to a new file at `path` (FileWriter) and returns its SHA-256.
std::string write_file(const std::string& path, const std::string& text);
// fsync of a directory (makes entries created or renamed in it durable).
void fsync_dir(const std::string& path);
// rename(2), then fsync of the parent directory of `to`.
void rename_durable(const std::string& from, const std::string& to);

// Note [No std::filesystem for trees]: LibTorch's shared libraries export
// std::filesystem functions of an older libstdc++ build, and the dynamic
// linker may bind ours to them; their remove_all crashes on a non-empty
// directory. Trees are listed and removed with POSIX calls here.
//
// Removes `path` and everything under it (no symlinks followed). A missing
// path is not an error; any other failure throws CheckpointError naming the
// entry.
void remove_tree(const std::string& path);
// Names of the entries of a directory (not "." and ".."), unsorted; empty
// when it does not exist. `dirs_only`: directories only.
std::vector<std::string> list_dir(const std::string& path, bool dirs_only = false);

// Lowercase hex SHA-256 of a file's bytes, read in large blocks.
std::string sha256_file(const std::string& path);
std::string sha256_hex(const void* data, size_t bytes);

// A whole file mapped read-only (core/mapped_file.h), failing with
// CheckpointError naming the path, the call and errno's text.
class MappedFile : public torus::MappedFile {
 public:
  explicit MappedFile(const std::string& path);
};

}  // namespace torus::ckpt
