// Private: an opened checkpoint, free of LibTorch — the manifest's files and
// tensors as read and checked by read_manifest(), the files mapped so far
// and verified beside the reads (Note [Verified reads]), and the pieces of a
// tensor as stored bytes. Checkpoint::Impl (checkpoint_impl.h) builds its
// tensors on it; the flat states of buffer-level optimizers
// (flat_state.cpp) read their element ranges with read_range().
#pragma once

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "torus/checkpoint/buffers.h"
#include "torus/checkpoint/safetensors.h"

namespace torus::ckpt {

// One piece of a tensor as the manifest lists it: a box (or a flat range of
// one) stored in one rank file.
struct Piece {
  int file = -1;  // index into files
  int rank = -1;
  std::vector<int64_t> off, box;
  int64_t fb = -1, fe = -1;
  bool per_rank = false;
};

// A tensor of the checkpoint: its global shape, dtype and pieces.
struct GlobalTensor {
  std::vector<int64_t> shape;
  std::string dtype;  // safetensors code
  std::vector<Piece> pieces;
};

// A rank file as the manifest records it.
struct FileRec {
  std::string name;
  int rank = -1;
  uint64_t bytes = 0;
  std::string sha256;
};

// A rank file once mapped (Stored::file).
struct OpenFile {
  std::unique_ptr<MappedFile> map;
  Header header;
  std::shared_future<std::string> sha;  // computed beside the reads (Note [Verified reads])
  bool checked = false;
};

struct Stored {
  std::string path;
  RunInfo info;
  std::vector<FileRec> files;
  std::map<std::string, GlobalTensor> tensors;
  std::map<std::string, std::string> aliases;
  mutable std::mutex mu;
  mutable std::map<int, OpenFile> open;
  bool hash_reads = true;  // off: the caller verifies files itself (verify_files)

  Stored() = default;
  Stored(const Stored&) = delete;
  Stored& operator=(const Stored&) = delete;
  ~Stored() { drain(); }

  // Reads the checkpoint at `path` (Checkpoint::open's checks): COMPLETE,
  // the manifest against its SHA-256, the format version, every file with
  // its recorded size, every piece inside its tensor, known dtype codes.
  // Throws CheckpointError.
  void read_manifest(const std::string& path);

  // Note [Verified reads]: a file is mapped and its header validated when a
  // piece of it is first needed; its SHA-256 is computed by a second thread
  // meanwhile, and check() compares every file read so far with the
  // manifest before a load returns — nothing read is handed back unverified.
  const OpenFile& file(int index, bool hash = true) const;

  static void start_hash(OpenFile& of);

  // Every file opened (and hashed) so far against the manifest's SHA-256.
  void check() const;

  // Waits for every hash in flight (on the way out of a failed load).
  void drain() const noexcept;

  // The files i with i % parts == part: sizes, headers, run ids and steps,
  // and SHA-256s (check()). Throws CheckpointError naming the first bad one.
  void verify_files(int part, int parts) const;

  // The stored bytes of piece `pc` of tensor `name` (dtype `dtype`): its
  // entry in the file's header checked against the manifest (the piece's
  // shape, the dtype). Hashed as hash_reads says.
  const uint8_t* piece_data(const std::string& name, const Piece& pc, const std::string& dtype) const;

  // Elements [begin, end) of the 1-D tensor `name` into `dst` (dtype
  // `dtype`), from every piece that is not per rank. CheckpointError when
  // the tensor is missing, is not 1-D, has another dtype, or its pieces do
  // not cover the range. Files are verified as by piece_data; call check()
  // before using what was read.
  void read_range(const std::string& name, const std::string& dtype, int64_t begin, int64_t end, void* dst) const;
};

}  // namespace torus::ckpt
