// Checked file I/O for checkpoints (src/checkpoint/file_io.h): SHA-256 on
// the way out against known vectors and a re-read, O_EXCL, an injected full
// disk, mmap, durable rename.
#include "checkpoint/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace torus::ckpt {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The message of the CheckpointError that `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "torus-fileio-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    inject_write_failure(-1);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

constexpr const char* kShaAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr const char* kShaEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST_F(FileIo, Sha256KnownVectors) {
  EXPECT_EQ(sha256_hex("abc", 3), kShaAbc);
  EXPECT_EQ(sha256_hex("", 0), kShaEmpty);
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(two.data(), two.size()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(write_file(file("abc"), "abc"), kShaAbc);
  EXPECT_EQ(sha256_file(file("abc")), kShaAbc);
  EXPECT_EQ(write_file(file("empty"), ""), kShaEmpty);
  EXPECT_EQ(sha256_file(file("empty")), kShaEmpty);
}

TEST_F(FileIo, WriterDigestMatchesTheBytes) {
  std::string all;
  FileWriter w(file("data.bin"));
  EXPECT_EQ(w.path(), file("data.bin"));
  for (int i = 0; i < 5; ++i) {
    std::string piece(static_cast<size_t>(1) << (4 * i + 2), static_cast<char>('a' + i));
    piece[0] = static_cast<char>(i);
    w.write(piece.data(), piece.size());
    all += piece;
  }
  std::vector<char> big(9 << 20);  // more than sha256_file's block
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  w.write(big.data(), big.size());
  all.append(big.data(), big.size());
  w.write(nullptr, 0);
  EXPECT_EQ(w.bytes_written(), all.size());
  const std::string digest = w.close();
  EXPECT_EQ(digest, sha256_hex(all.data(), all.size()));
  EXPECT_EQ(digest.size(), 64u);
  EXPECT_EQ(sha256_file(file("data.bin")), digest);
  EXPECT_EQ(slurp(file("data.bin")), all);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(fs::status(file("data.bin")).permissions() & fs::perms::all, static_cast<fs::perms>(0644 & ~mask))
      << "mode 0644 less the umask";
}

TEST_F(FileIo, RefusesAnExistingFile) {
  write_file(file("x"), "first");
  const std::string msg = error_of([&] { FileWriter w(file("x")); });
  EXPECT_NE(msg.find(file("x")), std::string::npos) << msg;
  EXPECT_NE(msg.find("File exists"), std::string::npos) << msg;
  EXPECT_NE(msg.find("errno 17"), std::string::npos) << msg;
  EXPECT_EQ(slurp(file("x")), "first") << "the existing file is left as it was";
  EXPECT_NE(error_of([&] { write_file(file("no-dir/x"), "y"); }).find(file("no-dir/x")), std::string::npos);
}

TEST_F(FileIo, InjectedFullDisk) {
  inject_write_failure(100);
  const std::string path = file("rank-00001.safetensors");
  FileWriter w(path);
  const std::string bytes(200, 'z');
  const std::string msg = error_of([&] { w.write(bytes.data(), bytes.size()); });
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("errno 28"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("checkpoint: write " + path + ": ", 0), 0u) << msg;
  EXPECT_EQ(w.bytes_written(), 0u) << "the failed write wrote nothing of it";
  // The budget is shared and counts down: 60 fit, the next 60 do not.
  w.write(bytes.data(), 60);
  FileWriter other(file("other"));
  EXPECT_NE(error_of([&] { other.write(bytes.data(), 60); }).find("errno 28"), std::string::npos);
  other.write(bytes.data(), 40);
  EXPECT_NE(error_of([&] { w.write(bytes.data(), 1); }).find("No space left"), std::string::npos)
      << "the disk stays full";
  w.write(bytes.data(), 0);
  EXPECT_EQ(w.bytes_written(), 60u);
  w.close();
  other.close();
  EXPECT_EQ(fs::file_size(path), 60u);

  inject_write_failure(0, EIO);
  FileWriter third(file("third"));
  const std::string eio = error_of([&] { third.write("a", 1); });
  EXPECT_NE(eio.find("Input/output error"), std::string::npos) << eio;
  EXPECT_NE(eio.find("errno 5"), std::string::npos) << eio;

  inject_write_failure(-1);
  third.write(bytes.data(), bytes.size());
  EXPECT_EQ(third.close(), sha256_hex(bytes.data(), bytes.size()));
}

TEST_F(FileIo, ClosedWriterAndUnclosedWriter) {
  FileWriter w(file("a"));
  w.write("abc", 3);
  EXPECT_EQ(w.close(), kShaAbc);
  EXPECT_THROW(w.write("d", 1), InvalidArgument);
  EXPECT_THROW(w.close(), InvalidArgument);
  {
    FileWriter partial(file("partial"));
    partial.write("abc", 3);
  }  // destroyed without close(): the partial file stays, nothing throws
  EXPECT_EQ(slurp(file("partial")), "abc");
}

TEST_F(FileIo, MappedFileReadsBack) {
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  write_file(file("m"), bytes);
  MappedFile m(file("m"));
  EXPECT_EQ(m.path(), file("m"));
  ASSERT_EQ(m.size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), bytes);

  write_file(file("empty"), "");
  MappedFile e(file("empty"));
  EXPECT_EQ(e.size(), 0u);

  const std::string missing = error_of([&] { MappedFile f(file("missing")); });
  EXPECT_NE(missing.find(file("missing")), std::string::npos) << missing;
  EXPECT_NE(missing.find("No such file or directory"), std::string::npos) << missing;
  const std::string dir = error_of([&] { MappedFile f(dir_.string()); });
  EXPECT_NE(dir.find("not a regular file"), std::string::npos) << dir;
  const std::string sha = error_of([&] { sha256_file(file("missing")); });
  EXPECT_NE(sha.find(file("missing")), std::string::npos) << sha;
}

TEST_F(FileIo, RenameDurableMovesADirectory) {
  fs::create_directory(file("step-10.tmp"));
  write_file(file("step-10.tmp/rank-00000.safetensors"), "payload");
  rename_durable(file("step-10.tmp"), file("step-10"));
  EXPECT_FALSE(fs::exists(file("step-10.tmp")));
  EXPECT_EQ(slurp(file("step-10/rank-00000.safetensors")), "payload");
  fsync_dir(file("step-10"));

  const std::string msg = error_of([&] { rename_durable(file("absent"), file("step-11")); });
  EXPECT_NE(msg.find(file("absent")), std::string::npos) << msg;
  EXPECT_NE(msg.find(file("step-11")), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  const std::string sync = error_of([&] { fsync_dir(file("absent")); });
  EXPECT_NE(sync.find(file("absent")), std::string::npos) << sync;
  EXPECT_NE(error_of([&] { fsync_dir(file("step-10/rank-00000.safetensors")); }).find("Not a directory"),
            std::string::npos);
}

}  // namespace
}  // namespace torus::ckpt
