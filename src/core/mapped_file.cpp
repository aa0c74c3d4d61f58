// Read-only whole-file mappings (mapped_file.h).
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "core/log.h"

namespace torus {
namespace {

std::string map_error_text(const std::string& path, std::string_view call, int error) {
  if (error == 0) return fmt::format("{} {}: not a regular file", call, path);
  return fmt::format("{} {}: {}", call, path, detail::errno_string(error));
}

}  // namespace

MapError::MapError(std::string path, const char* call, int error, uint64_t bytes)
    : Error(map_error_text(path, call, error)), path_(std::move(path)), call_(call), error_(error), bytes_(bytes) {}

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  int fd;
  do {
    fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw MapError(path_, "open", errno, 0);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw MapError(path_, "fstat", err, 0);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw MapError(path_, "map", 0, 0);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {  // mmap refuses length 0: an empty file maps to nothing
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw MapError(path_, "mmap", err, size_);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  // The mapping outlives the descriptor.
  if (::close(fd) != 0) {
    int err = errno;
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    throw MapError(path_, "close", err, size_);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace torus
