// libFuzzer target for the safetensors header reader
// (torus/checkpoint/safetensors.h): every byte string must either parse into
// a header whose invariants hold or throw CheckpointError; nothing else
// (crash, other exception, sanitizer report) is allowed. An accepted header
// must also re-encode (encode_header) into a file that parses to the same
// header.
//
// The first byte picks the form of the rest: odd, the rest is a whole file;
// even, the rest is the header's JSON, framed here with its length field and
// followed by (byte >> 1) * 4 data bytes, so that the fuzzer reaches the
// validation behind the JSON without guessing the length field.
//
// Built only with Clang (-fsanitize=fuzzer); see tests/fuzz/tests.cmake.
//   ./torus_safetensors_fuzz -max_total_time=60 -max_len=4096 corpus/
#include <cstdint>
#include <cstdlib>
#include <set>
#include <span>
#include <vector>

#include "torus/checkpoint/safetensors.h"

namespace ckpt = torus::ckpt;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void check_invariants(const ckpt::Header& h, uint64_t file_size, uint64_t header_len) {
  check(h.data_offset == 8 + header_len);
  check(h.data_offset + h.data_bytes == file_size);
  uint64_t expected = 0;
  std::set<std::string> names;
  for (const auto& t : h.tensors) {
    check(!t.name.empty() && t.name.size() <= ckpt::kMaxNameBytes && t.name != "__metadata__");
    check(names.insert(t.name).second);
    check(ckpt::known_dtype(t.dtype));
    check(t.begin == expected && t.begin <= t.end);  // sorted by begin, contiguous from 0
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      check(d >= 0);
      if (numel != 0 && d != 0) check(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel));
      else numel = 0;
    }
    uint64_t bytes = 0;
    check(!__builtin_mul_overflow(numel, uint64_t{ckpt::dtype_bytes(t.dtype)}, &bytes));
    check(t.end - t.begin == bytes);
    expected = t.end;
  }
  check(expected == h.data_bytes);  // no trailing bytes, nothing missing
}

void check_reencodes(const ckpt::Header& h) {
  std::vector<uint8_t> again = ckpt::encode_header(h.tensors, h.metadata);
  check(again.size() % 8 == 0);
  const uint64_t header_len = again.size() - 8;
  again.resize(again.size() + h.data_bytes);
  ckpt::Header h2 = ckpt::parse_header(again, again.size(), "re-encoded");
  check_invariants(h2, again.size(), header_len);
  check(h2.metadata == h.metadata && h2.tensors.size() == h.tensors.size());
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const auto& a = h.tensors[i];
    const auto& b = h2.tensors[i];
    check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin && a.end == b.end);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<uint8_t> file;
  if (data[0] & 1) {
    file.assign(data + 1, data + size);
  } else {
    const uint64_t n = size - 1;
    for (int i = 0; i < 8; ++i) file.push_back(static_cast<uint8_t>(n >> (8 * i)));
    file.insert(file.end(), data + 1, data + size);
    file.resize(file.size() + (data[0] >> 1) * 4, 0);
  }
  try {
    ckpt::Header h = ckpt::parse_header(file, file.size(), "fuzz");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t{file[i]} << (8 * i);
    check_invariants(h, file.size(), n);
    check_reencodes(h);
  } catch (const ckpt::CheckpointError&) {
  }
  return 0;
}
