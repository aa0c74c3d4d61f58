// Private: the state of an opened checkpoint (Checkpoint::Impl,
// checkpoint.h): the manifest's files and tensors, read by open()
// (manifest.cpp), and the files mapped so far, from which the pieces of a
// tensor are assembled (assemble.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "torus/checkpoint/checkpoint.h"
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
  c10::ScalarType dtype = at::kFloat;
  std::vector<Piece> pieces;
};

// A rank file as the manifest records it.
struct FileRec {
  std::string name;
  int rank = -1;
  uint64_t bytes = 0;
  std::string sha256;
};

// A rank file once mapped (Checkpoint::Impl::file).
struct OpenFile {
  std::unique_ptr<MappedFile> map;
  Header header;
  std::shared_future<std::string> sha;  // computed beside the reads (Note [Verified reads])
  bool checked = false;
};

struct Checkpoint::Impl {
  std::string path;
  RunInfo info;
  std::vector<FileRec> files;
  std::map<std::string, GlobalTensor> tensors;
  std::map<std::string, std::string> aliases;
  std::map<std::string, TensorInfo> listing;
  mutable std::mutex mu;
  mutable std::map<int, OpenFile> open;

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

  bool hash_reads = true;  // off: the caller verifies files itself (verify_files)

  // The data of a piece as a tensor of its stored shape (read-only memory).
  at::Tensor piece_tensor(const std::string& name, const Piece& pc, c10::ScalarType dtype) const;

  // A target that is a flat range of a box, from flat pieces of the same
  // box (ZeRO to ZeRO over the same TP layout): only the overlapping ranges
  // are read. False when those pieces do not cover the range (the caller
  // then assembles the box).
  bool copy_flat(const std::string& name, const GlobalTensor& g, const std::vector<const Piece*>& pieces,
                 const Normal& n, at::Tensor& dst) const;

  // Copies into `dst` (the box [off, off + box) of `name`) every element
  // of the pieces that intersect it; returns the elements covered inside
  // the global shape.
  int64_t fill_box(const std::string& name, const GlobalTensor& g, const std::vector<const Piece*>& pieces,
                   const std::vector<int64_t>& off, const std::vector<int64_t>& box, at::Tensor& dst) const;
};

}  // namespace torus::ckpt
