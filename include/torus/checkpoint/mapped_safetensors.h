// torus/checkpoint/mapped_safetensors.h — safetensors files read through a
// read-only memory map: tensors are views over the mapped bytes, copied by
// nobody until a caller copies the part it needs. Plus the reader of a
// Hugging Face model directory's weights (one file, or shards behind an
// index), built on it.
//
//   auto file = ckpt::MappedSafetensors::open("model.safetensors");
//   at::Tensor w = file->tensor("wte.weight");        // a view: no copy
//   auto dir = ckpt::MappedWeightDir::open("gpt2/");   // model.safetensors or the index
//   at::Tensor b = dir.tensor("h.0.attn.c_attn.bias");
//
// Note [Mapped views]: a tensor handed out is at::from_blob over the map,
// and its deleter holds a shared_ptr to the mapping, so the mapping lives as
// long as any tensor (or view of one) does, whatever happens to the reader.
// The pages are mapped PROT_READ: the views are read-only — writing into
// one (an in-place op) faults; copy first. Only the pages a caller reads are
// brought in, so each rank of a job that copies its TP/ZeRO slice of a
// large file touches about its share of it. A tensor whose bytes are not
// aligned to its element size (legal in safetensors, never written by the
// reference writer) is returned as a copy instead of a view. The header is
// validated by parse_header (safetensors.h, Note [Nothing executed on
// load]) before any tensor is handed out.
//
// Thread safety: both readers are immutable after open() and may be used
// from any thread. Nothing here blocks beyond the file system calls of
// open() and the page faults of reading a view. Errors: CheckpointError
// naming the file and the problem.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "torus/checkpoint/safetensors.h"

namespace torus::ckpt {

class MappedSafetensors {
 public:
  // Maps `path` and validates its header. CheckpointError when it cannot be
  // opened or mapped, or its header is malformed.
  static std::shared_ptr<const MappedSafetensors> open(const std::string& path);
  ~MappedSafetensors();
  MappedSafetensors(const MappedSafetensors&) = delete;
  MappedSafetensors& operator=(const MappedSafetensors&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  // The entry named `name`, or nullptr.
  const TensorEntry* find(const std::string& name) const { return header_.find(name); }
  std::vector<std::string> names() const;
  // A view over the map (Note [Mapped views]) on the CPU, of the file's
  // dtype and shape. CheckpointError when the file has no such tensor.
  at::Tensor tensor(const std::string& name) const;

 private:
  struct Map;
  MappedSafetensors(std::string path, std::shared_ptr<const Map> map, Header header);
  std::string path_;
  std::shared_ptr<const Map> map_;
  Header header_;
};

// A Hugging Face model directory's weights: `model.safetensors`, or the
// shards named by `model.safetensors.index.json` ({"weight_map": {tensor:
// file}}; the index wins when both exist). open() refuses, naming the
// directory or the index: neither file present; an index that is not a JSON
// object with a "weight_map" object of strings; a shard name that is not a
// plain file name inside the directory (empty, ".", "..", a '/' or '\',
// a NUL); a shard that is missing or malformed; a mapped name that its shard
// does not hold. Tensors a shard holds beyond its weight_map entries are not
// visible (the index is what the directory says it holds).
class MappedWeightDir {
 public:
  static MappedWeightDir open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The entry of `name` (shape, dtype) or nullptr.
  const TensorEntry* find(const std::string& name) const;
  // A view over the map of its shard (Note [Mapped views]); CheckpointError
  // naming the directory when absent.
  at::Tensor tensor(const std::string& name) const;
  // The files read: "model.safetensors" or the shards, sorted.
  std::vector<std::string> files() const;

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<const MappedSafetensors>> files_;  // by file name
  std::map<std::string, const MappedSafetensors*> where_;                  // tensor -> its file
};

}  // namespace torus::ckpt
