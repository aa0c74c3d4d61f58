// Checked file I/O for checkpoints (file_io.h): every system call's result is
// looked at, and a failure names the path, the call and errno.
#include "checkpoint/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <algorithm>
#include <future>
#include <vector>

#include "core/log.h"

namespace torus::ckpt {

namespace {

// The injected failure: bytes the writers may still write (-1: off), and the
// errno they fail with once a write would pass it.
std::atomic<int64_t> g_write_budget{-1};
std::atomic<int> g_write_errno{28};

[[noreturn]] void fail_sys(const char* call, const std::string& path, int err) {
  throw CheckpointError(fmt::format("checkpoint: {} {}: {}", call, path, detail::errno_string(err)));
}

// Takes `bytes` out of the injected budget; false when the write must fail.
bool take_budget(uint64_t bytes) {
  int64_t cur = g_write_budget.load();
  while (cur >= 0) {
    if (bytes > static_cast<uint64_t>(cur)) return false;
    if (g_write_budget.compare_exchange_weak(cur, cur - static_cast<int64_t>(bytes))) return true;
  }
  return true;
}

int open_retry(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

std::string to_hex(const unsigned char* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 0xF];
  }
  return out;
}

struct MdCtx {
  EVP_MD_CTX* ctx;
  explicit MdCtx(const std::string& what) : ctx(EVP_MD_CTX_new()) {
    if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
      EVP_MD_CTX_free(ctx);
      throw CheckpointError(fmt::format("checkpoint: {}: cannot start a SHA-256 digest (OpenSSL)", what));
    }
  }
  ~MdCtx() { EVP_MD_CTX_free(ctx); }
  MdCtx(const MdCtx&) = delete;
  MdCtx& operator=(const MdCtx&) = delete;
  void update(const void* p, size_t n, const std::string& what) {
    if (n != 0 && EVP_DigestUpdate(ctx, p, n) != 1) {
      throw CheckpointError(fmt::format("checkpoint: {}: SHA-256 update failed (OpenSSL)", what));
    }
  }
  std::string hex(const std::string& what) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx, md, &len) != 1) {
      throw CheckpointError(fmt::format("checkpoint: {}: SHA-256 final failed (OpenSSL)", what));
    }
    return to_hex(md, len);
  }
};

}  // namespace

void inject_write_failure(int64_t fail_after_bytes, int error) {
  g_write_errno.store(error);
  g_write_budget.store(fail_after_bytes < 0 ? -1 : fail_after_bytes);
}

struct FileWriter::Hash {
  explicit Hash(const std::string& what) : md(what) {}
  MdCtx md;
};

FileWriter::FileWriter(std::string path) : path_(std::move(path)), hash_(std::make_unique<Hash>(path_)) {
  fd_ = open_retry(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_sys("create", path_, errno);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

// Note [Overlapped writes]: a large write is hashed by a second thread while
// this one copies it into the page cache, and every kWritebackChunk bytes
// the kernel is asked to start writing back what is dirty
// (sync_file_range), so that close()'s fsync finds most of the file on disk
// already: a save costs about max(disk, hash, copy) instead of their sum.
namespace {
constexpr size_t kHashInline = 4u << 20;          // smaller writes are hashed inline
constexpr uint64_t kWritebackChunk = 64ull << 20;  // start writeback every 64 MiB
}  // namespace

void FileWriter::write(const void* data, size_t bytes) {
  TORUS_CHECK(fd_ >= 0, InvalidArgument, "checkpoint: write {}: the writer is already closed", path_);
  if (!take_budget(bytes)) fail_sys("write", path_, g_write_errno.load());
  const auto* p = static_cast<const uint8_t*>(data);
  std::future<void> hashing;
  if (bytes >= kHashInline) {
    hashing = std::async(std::launch::async, [this, p, bytes] { hash_->md.update(p, bytes, path_); });
  }
  // The hash must be done with `data` before this returns, also on error.
  struct Join {
    std::future<void>& f;
    ~Join() {
      if (f.valid()) f.wait();
    }
  } join{hashing};
  size_t done = 0;
  while (done < bytes) {
    ssize_t w = ::write(fd_, p + done, std::min<size_t>(bytes - done, kWritebackChunk));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_sys("write", path_, errno);
    }
    // write(2) of a regular file returns 0 only when nothing more fits.
    if (w == 0) fail_sys("write", path_, ENOSPC);
    if (!hashing.valid()) hash_->md.update(p + done, static_cast<size_t>(w), path_);
    done += static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
    if (written_ - writeback_ >= kWritebackChunk) {
      // Best effort: a failure here shows again, checked, in fsync.
      (void)::sync_file_range(fd_, static_cast<off_t>(writeback_), static_cast<off_t>(written_ - writeback_),
                              SYNC_FILE_RANGE_WRITE);
      writeback_ = written_;
    }
  }
  if (hashing.valid()) hashing.get();  // rethrows a hashing failure
}

std::string FileWriter::close() {
  TORUS_CHECK(fd_ >= 0, InvalidArgument, "checkpoint: close {}: the writer is already closed", path_);
  const int fd = fd_;
  fd_ = -1;  // close(2) is never retried: the descriptor is gone either way
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    fail_sys("fsync", path_, err);
  }
  if (::close(fd) != 0) fail_sys("close", path_, errno);
  return hash_->md.hex(path_);
}

std::string write_file(const std::string& path, const std::string& text) {
  FileWriter w(path);
  w.write(text.data(), text.size());
  return w.close();
}

namespace {
thread_local std::string t_remove_failed;  // the entry nftw stopped at (no exception through C frames)
thread_local int t_remove_errno = 0;
int remove_entry(const char* path, const struct stat*, int flag, struct FTW*) {
  const int rc = (flag == FTW_DP) ? ::rmdir(path) : ::unlink(path);
  if (rc != 0 && errno != ENOENT) {
    t_remove_errno = errno;
    t_remove_failed = path;
    return 1;  // stops the walk
  }
  return 0;
}
}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    const int e = errno;
    throw CheckpointError(fmt::format("checkpoint: cannot remove {}: {}", path, detail::errno_string(e)));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      const int e = errno;
      throw CheckpointError(fmt::format("checkpoint: cannot remove {}: {}", path, detail::errno_string(e)));
    }
    return;
  }
  t_remove_failed.clear();
  const int rc = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) {
    const int e = t_remove_failed.empty() ? errno : t_remove_errno;
    if (t_remove_failed.empty() && e == ENOENT) return;
    throw CheckpointError(fmt::format("checkpoint: cannot remove {}: {}",
                                      t_remove_failed.empty() ? path : t_remove_failed, detail::errno_string(e)));
  }
}

std::vector<std::string> list_dir(const std::string& path, bool dirs_only) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (dirs_only) {
      struct stat st {};
      if (::stat((path + "/" + name).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    }
    out.push_back(name);
  }
  ::closedir(d);
  return out;
}

void fsync_dir(const std::string& path) {
  int fd = open_retry(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_sys("open directory", path, errno);
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    fail_sys("fsync directory", path, err);
  }
  if (::close(fd) != 0) fail_sys("close directory", path, errno);
}

void rename_durable(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int err = errno;
    throw CheckpointError(
        fmt::format("checkpoint: rename {} to {}: {}", from, to, detail::errno_string(err)));
  }
  std::filesystem::path parent = std::filesystem::path(to).parent_path();
  fsync_dir(parent.empty() ? std::string(".") : parent.string());
}

std::string sha256_file(const std::string& path) {
  int fd = open_retry(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_sys("open", path, errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  MdCtx md(path);
  std::vector<unsigned char> buf(4 << 20);
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_sys("read", path, errno);
    }
    if (r == 0) break;
    md.update(buf.data(), static_cast<size_t>(r), path);
  }
  return md.hex(path);
}

std::string sha256_hex(const void* data, size_t bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, bytes, md, &len, EVP_sha256(), nullptr) != 1) {
    throw CheckpointError("checkpoint: SHA-256 failed (OpenSSL)");
  }
  return to_hex(md, len);
}

namespace {

torus::MappedFile map_or_throw(const std::string& path) {
  try {
    return torus::MappedFile(path);
  } catch (const MapError& e) {
    throw CheckpointError(fmt::format("checkpoint: {}", e.what()));
  }
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : torus::MappedFile(map_or_throw(path)) {}

}  // namespace torus::ckpt
