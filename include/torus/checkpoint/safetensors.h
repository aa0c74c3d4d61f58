// torus/checkpoint/safetensors.h — the safetensors file format: a validating
// header reader and a header writer, free of LibTorch.
//
// A safetensors file is: an unsigned 64-bit little-endian header length N,
// N bytes of JSON, then the data section. The JSON is one object whose keys
// are tensor names, each mapping to {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]} (offsets relative to the data section), plus
// an optional "__metadata__" object of string values.
//
// Note [Nothing executed on load]: the reader trusts nothing it reads. It
// refuses, with CheckpointError naming the file (`what`) and the problem:
//  * a header length of 0, above kMaxHeaderBytes, or past the end of the file;
//  * JSON that is malformed, not an object, or with duplicate keys;
//  * a tensor entry that is not an object of exactly dtype/shape/data_offsets,
//    an unknown dtype, a shape that is not a list of non-negative integers, a
//    byte size that overflows 64 bits, offsets that are not two integers
//    begin <= end, end - begin that differs from numel x dtype size;
//  * tensors that overlap, leave a hole between them, do not start at 0, or
//    do not end exactly at the end of the file (sorted by begin);
//  * a "__metadata__" that is not an object of strings;
//  * an empty tensor name or one longer than kMaxNameBytes.
// Zero-sized tensors (begin == end) may share an offset with others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "torus/core/error.h"

namespace torus::ckpt {

// A checkpoint that is incomplete, corrupt, malformed or does not fit the run
// (Python: torus.CheckpointError).
class CheckpointError : public Error {
 public:
  using Error::Error;
};

inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB, as the reference implementation
inline constexpr size_t kMaxNameBytes = 4096;

struct TensorEntry {
  std::string name;
  std::string dtype;            // safetensors code: F64 F32 F16 BF16 I64 I32 I16 I8 U8 U16 U32 U64 BOOL F8_E4M3 F8_E5M2
  std::vector<int64_t> shape;
  uint64_t begin = 0;           // byte offsets into the data section
  uint64_t end = 0;
};

struct Header {
  std::vector<TensorEntry> tensors;           // in file order (sorted by begin)
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts in the file
  uint64_t data_bytes = 0;   // bytes of the data section

  // The entry named `name`, or nullptr.
  const TensorEntry* find(const std::string& name) const;
};

// Bytes per element of a safetensors dtype code; throws CheckpointError for
// an unknown code.
size_t dtype_bytes(const std::string& dtype);
// Whether `dtype` is a code this reader knows.
bool known_dtype(const std::string& dtype);

// Parses and validates the header of a file of `file_size` bytes whose first
// bytes are `prefix` (at least 8 bytes, and the whole header when the length
// field is valid: otherwise CheckpointError). `what` names the file in
// messages.
Header parse_header(std::span<const uint8_t> prefix, uint64_t file_size, const std::string& what);

// Reads and validates the header of the file at `path` (parse_header);
// CheckpointError naming the path when it cannot be opened or read.
Header read_header(const std::string& path);

// The bytes that start a file holding `tensors` (whose offsets must already
// be laid out back to back from 0 in the order given; checked, with names,
// dtypes, shapes and UTF-8, InvalidArgument otherwise): the
// length field and the JSON, padded with spaces to a multiple of 8 bytes so
// the data section is aligned. parse_header of the result plus the data
// accepts it. Entries are written in the order given, "__metadata__" first
// when `metadata` is not empty.
std::vector<uint8_t> encode_header(const std::vector<TensorEntry>& tensors,
                                   const std::map<std::string, std::string>& metadata = {});

}  // namespace torus::ckpt
