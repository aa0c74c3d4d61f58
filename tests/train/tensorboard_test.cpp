// TensorBoard event files (tensorboard.h): CRC-32C against its published
// check values, and the file read back record by record with a protobuf
// decoder written here (independent of the writer's encoder).
#include "torus/run/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace torus::engine {}  // the engine's names, where a test uses them
namespace torus::run {}  // the run layer's names, where a test uses them
namespace torus::train_test {
using namespace torus::engine;  // NOLINT
using namespace torus::run;     // NOLINT
namespace {

TEST(Crc32c, CheckValues) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

struct Reader {
  std::string s;
  size_t at = 0;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(s.at(at++));
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  template <typename T>
  T fixed() {
    T v;
    std::memcpy(&v, s.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string bytes(size_t n) {
    std::string out = s.substr(at, n);
    at += n;
    return out;
  }
  bool done() const { return at >= s.size(); }
};

struct Scalar {
  int64_t step = -1;
  double wall = 0;
  std::string tag, version;
  float value = 0;
};

Scalar decode_event(const std::string& bytes) {
  Scalar out;
  Reader r{bytes};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == 1) {
      out.wall = r.fixed<double>();
    } else if (field == 2 && wire == 0) {
      out.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && wire == 2) {
      out.version = r.bytes(r.varint());
    } else if (field == 5 && wire == 2) {
      Reader summary{r.bytes(r.varint())};
      EXPECT_EQ(summary.varint(), (1u << 3) | 2);
      Reader value{summary.bytes(summary.varint())};
      while (!value.done()) {
        const uint64_t k = value.varint();
        if (k == ((1u << 3) | 2)) {
          out.tag = value.bytes(value.varint());
        } else if (k == ((2u << 3) | 5)) {
          out.value = value.fixed<float>();
        } else {
          ADD_FAILURE() << "unexpected Value field " << k;
          return out;
        }
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << field << " wire " << wire;
      return out;
    }
  }
  return out;
}

TEST(TensorBoardWriter, RecordsReadBack) {
  char tmpl[] = "/tmp/torus_tb_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/tb";
  std::string path;
  {
    TensorBoardWriter tb(dir);
    path = tb.path();
    tb.add_scalar("train/loss", 2.5, 1);
    tb.add_scalar("train/lr", 3e-4, 2);
    tb.add_scalar("perf/mfu", 0.125, 300000);
    tb.flush();
  }
  EXPECT_EQ(std::filesystem::path(path).parent_path(), std::filesystem::path(dir));
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  Reader file{ss.str()};
  std::vector<Scalar> events;
  while (!file.done()) {
    const std::string len = file.bytes(8);
    uint64_t n;
    std::memcpy(&n, len.data(), 8);
    EXPECT_EQ(file.fixed<uint32_t>(), masked_crc32c(len));
    const std::string data = file.bytes(n);
    EXPECT_EQ(file.fixed<uint32_t>(), masked_crc32c(data));
    events.push_back(decode_event(data));
  }
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].version, "brain.Event:2");
  EXPECT_EQ(events[1].tag, "train/loss");
  EXPECT_EQ(events[1].step, 1);
  EXPECT_FLOAT_EQ(events[1].value, 2.5f);
  EXPECT_EQ(events[2].tag, "train/lr");
  EXPECT_FLOAT_EQ(events[2].value, 3e-4f);
  EXPECT_EQ(events[3].step, 300000);
  EXPECT_FLOAT_EQ(events[3].value, 0.125f);
  EXPECT_GT(events[3].wall, 1.6e9);  // seconds since 1970, after 2020
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace torus::train_test
