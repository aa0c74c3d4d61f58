// TensorBoard event files (tensorboard.h).
#include "torus/run/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "torus/core/error.h"

namespace torus::run {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_le(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // x86-64 and aarch64 are little endian
  out.append(buf, sizeof(T));
}

// Protobuf keys: (field << 3) | wire type.
void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<uint64_t>(field) << 3 | wire); }

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// tensorflow.Event {1: double wall_time, 2: int64 step, 3: string file_version, 5: Summary summary}
std::string event(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, 1);
  put_le<double>(e, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrcTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TORUS_CHECK(!ec, Error, "TensorBoard: cannot create '{}': {}", dir, ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const auto secs = static_cast<int64_t>(now_seconds());
  path_ = fmt::format("{}/events.out.tfevents.{}.{}", dir, secs, host);
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    const int err = errno;
    throw Error(fmt::format("TensorBoard: cannot open '{}': {}", path_, ::torus::detail::errno_string(err)));
  }
  std::string first = event(now_seconds(), 0);
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& bytes) {
  std::string rec;
  std::string len;
  put_le<uint64_t>(len, bytes.size());
  rec += len;
  put_le<uint32_t>(rec, masked_crc32c(len));
  rec += bytes;
  put_le<uint32_t>(rec, masked_crc32c(bytes));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size()) {
    const int err = errno;
    throw Error(fmt::format("TensorBoard: cannot write '{}': {}", path_, ::torus::detail::errno_string(err)));
  }
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  // Summary {1: repeated Value}; Value {1: string tag, 2: float simple_value}
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, 5);
  put_le<float>(v, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event(now_seconds(), step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) {
    const int err = errno;
    throw Error(fmt::format("TensorBoard: cannot write '{}': {}", path_, ::torus::detail::errno_string(err)));
  }
}

}  // namespace torus::run
