// MappedFile (src/core/mapped_file.h): the bytes of a file read back through
// the mapping, empty files, moves, and MapError naming the failed call and
// errno for a missing path and a directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "core/mapped_file.h"

namespace torus {
namespace {

namespace fs = std::filesystem;

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("torus-mapped-file-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  fs::path dir_;
};

TEST_F(MappedFileTest, ReadsTheFileAndMoves) {
  std::string bytes(70000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131) % 251);
  const std::string path = write("a.bin", bytes);
  MappedFile m(path);
  EXPECT_EQ(m.path(), path);
  ASSERT_EQ(m.size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), bytes);

  const uint8_t* data = m.data();
  MappedFile moved(std::move(m));
  EXPECT_EQ(moved.data(), data);  // the same mapping, not a copy
  EXPECT_EQ(moved.size(), bytes.size());
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(m.size(), 0u);

  MappedFile other(write("b.bin", "xyz"));
  other = std::move(moved);
  EXPECT_EQ(other.data(), data);
  EXPECT_EQ(other.path(), path);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(other.data()) + 1000, 3), bytes.substr(1000, 3));
}

TEST_F(MappedFileTest, EmptyFileMapsToNothing) {
  MappedFile m(write("empty", ""));
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.data(), nullptr);
}

TEST_F(MappedFileTest, FailuresNameTheCallAndErrno) {
  const std::string missing = (dir_ / "missing").string();
  try {
    MappedFile m(missing);
    FAIL() << "mapped a missing file";
  } catch (const MapError& e) {
    EXPECT_EQ(e.call(), "open");
    EXPECT_EQ(e.error(), ENOENT);
    EXPECT_EQ(e.path(), missing);
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("open " + missing + ": ", 0), 0u) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  try {
    MappedFile m(dir_.string());
    FAIL() << "mapped a directory";
  } catch (const MapError& e) {
    EXPECT_EQ(e.call(), "map");
    EXPECT_EQ(e.error(), 0);
    EXPECT_EQ(std::string(e.what()), "map " + dir_.string() + ": not a regular file");
  }
  // A MapError is a torus::Error.
  EXPECT_THROW(MappedFile m(missing), Error);
}

}  // namespace
}  // namespace torus
