// The token file of a loopback job without TORUS_JOB_TOKEN (Note [Local job
// token] in store_token.h). Every file operation goes through a descriptor of
// the checked directory (openat, renameat), never through its path again, so
// that swapping the directory for a symbolic link after the check changes
// nothing.
#include "comm/store_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "core/log.h"

namespace torus::comm {

namespace proto = store_proto;

namespace {

constexpr size_t kMaxTokenFileBytes = 4096;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

[[noreturn]] void refuse(const std::string& what, const std::string& why) {
  throw InvalidArgument(fmt::format(
      "refusing {} for the job token: {}. Without TORUS_JOB_TOKEN a loopback job shares its token through a "
      "directory only this user can use: remove or fix it (mode 0700, owned by this user), set TORUS_RUNTIME_DIR "
      "to such a directory, or set TORUS_JOB_TOKEN to the same secret on every rank",
      what, why));
}

// The owner and mode checks shared by the directory and the file.
void check_private(const struct stat& st, const std::string& what, mode_t want) {
  if (st.st_uid != ::geteuid()) {
    refuse(what, fmt::format("it is owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    refuse(what, fmt::format("its mode is {:04o}, so group or others can use it (it must be {:04o})",
                             st.st_mode & 07777, want));
  }
}

// Opens `dir` without following a symbolic link and checks that it is private
// to this user. Returns an invalid Fd when it does not exist and !create.
proto::Fd open_private_dir(const std::string& dir, bool create) {
  const std::string what = "the directory " + dir;
  if (create && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    int err = errno;
    throw InvalidArgument(fmt::format("cannot create {} for the job token: {} (set TORUS_RUNTIME_DIR to a directory "
                                      "of this user, or TORUS_JOB_TOKEN to the same secret on every rank)",
                                      dir, detail::errno_string(err)));
  }
  proto::Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    if (err == ENOENT && !create) return {};
    struct stat st{};
    if (::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) refuse(what, "it is a symbolic link");
    if (err == ENOTDIR) refuse(what, "it is not a directory");
    throw InvalidArgument(fmt::format("cannot open {} for the job token: {}", dir, detail::errno_string(err)));
  }
  struct stat st{};
  TORUS_CHECK_SYS(::fstat(fd.get(), &st), "fstat {}", dir);
  check_private(st, what, 0700);
  return fd;
}

bool write_all(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

// The token in `name` under the open directory `dir`; nullopt (with *why)
// when the file is absent or holds no usable token.
std::optional<std::string> read_token_at(int dir, const LocalTokenPath& path, std::string* why) {
  const std::string file = path.file();
  // O_NONBLOCK: a FIFO planted under the name must not block the open.
  proto::Fd fd(::openat(dir, path.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    if (err == ENOENT) {
      *why = file + " does not exist (yet)";
      return std::nullopt;
    }
    if (err == ELOOP) refuse("the file " + file, "it is a symbolic link");
    throw InvalidArgument(fmt::format("cannot open the job token file {}: {}", file, detail::errno_string(err)));
  }
  struct stat st{};
  TORUS_CHECK_SYS(::fstat(fd.get(), &st), "fstat {}", file);
  if (!S_ISREG(st.st_mode)) refuse("the file " + file, "it is not a regular file");
  check_private(st, "the file " + file, 0600);
  std::string text(kMaxTokenFileBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t r = ::read(fd.get(), text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int err = errno;
      throw InvalidArgument(fmt::format("cannot read the job token file {}: {}", file, detail::errno_string(err)));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty() || text.size() > kMaxTokenFileBytes ||
      text.find_first_of(" \t\r\n") != std::string::npos) {
    *why = file + " holds no token (empty, oversized or malformed)";
    return std::nullopt;
  }
  return text;
}

}  // namespace

LocalTokenPath local_token_path(const std::string& runtime_dir, const std::string& numeric_addr, int port) {
  TORUS_CHECK(!runtime_dir.empty(), InvalidArgument, "the runtime directory for the job token must not be empty");
  std::string addr = numeric_addr;
  for (char& c : addr) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.';
    if (!keep) c = '_';
  }
  std::string root = runtime_dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  LocalTokenPath p;
  p.dir = fmt::format("{}/torus-{}", root == "/" ? "" : root, ::geteuid());
  p.name = fmt::format("store-{}-{}.token", addr, port);
  return p;
}

LocalTokenFile::LocalTokenFile(LocalTokenPath path) : path_(std::move(path)), dir_(open_private_dir(path_.dir, true)) {}

void LocalTokenFile::publish(const std::string& token) {
  TORUS_CHECK(!token.empty() && token.size() <= kMaxTokenFileBytes &&
                  token.find_first_of(" \t\r\n") == std::string::npos,
              InvalidArgument, "LocalTokenFile: the token must be 1..{} bytes without white space", kMaxTokenFileBytes);
  // A unique temporary name in the same directory, so the rename is atomic
  // and a reader sees the old file or the whole new one, never a part.
  const std::string tmp = fmt::format(".{}.{}", path_.name, generate_job_token().substr(0, 16));
  const std::string file = path_.file();
  proto::Fd fd(::openat(dir_.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  TORUS_CHECK_SYS(fd.get(), "creating the job token file {}/{}", path_.dir, tmp);
  bool ok = ::fchmod(fd.get(), 0600) == 0 && write_all(fd.get(), token + "\n") && ::fsync(fd.get()) == 0;
  ok = ok && ::renameat(dir_.get(), tmp.c_str(), dir_.get(), path_.name.c_str()) == 0;
  int err = errno;
  if (!ok) {
    ::unlinkat(dir_.get(), tmp.c_str(), 0);
    throw CommError(fmt::format("cannot write the job token file {}: {}", file, detail::errno_string(err)));
  }
  // The rename is durable only once the directory is; a failure here leaves a
  // complete file in place, which is all the other ranks need.
  if (::fsync(dir_.get()) != 0) TORUS_LOG_DEBUG("fsync of {} failed: {}", path_.dir, detail::errno_string(errno));
  published_ = token;
}

LocalTokenFile::~LocalTokenFile() {
  if (published_.empty()) return;
  try {
    // Only our own token: never delete a file another job has written since.
    std::string why;
    if (read_token_at(dir_.get(), path_, &why) == published_) {
      if (::unlinkat(dir_.get(), path_.name.c_str(), 0) != 0) {
        TORUS_LOG_DEBUG("cannot remove the job token file {}: {}", path_.file(), detail::errno_string(errno));
      }
    }
  } catch (const std::exception& e) {
    TORUS_LOG_DEBUG("not removing the job token file {}: {}", path_.file(), e.what());
  }
}

std::optional<std::string> read_local_token(const LocalTokenPath& path) {
  proto::Fd dir = open_private_dir(path.dir, false);
  if (!dir.valid()) return std::nullopt;
  std::string why;
  return read_token_at(dir.get(), path, &why);
}

std::shared_ptr<TcpStore> connect_with_local_token(TcpStore::Options options, const LocalTokenPath& path) {
  using Clock = proto::Clock;
  const auto timeout = options.connect_timeout;
  const Clock::time_point deadline = proto::deadline_after(timeout);
  const std::string file = path.file();
  std::optional<std::string> refused;  // the last token the server turned down
  std::string why = file + " does not exist (yet)";
  for (;;) {
    std::optional<std::string> token;
    if (proto::Fd dir = open_private_dir(path.dir, false); dir.valid()) {
      token = read_token_at(dir.get(), path, &why);
    } else {
      why = path.dir + " does not exist (yet)";
    }
    if (token && token != refused) {
      options.token = *token;
      options.connect_timeout = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(deadline - Clock::now(), Clock::duration(std::chrono::milliseconds(1))));
      try {
        auto store = std::make_shared<TcpStore>(options);
        TORUS_LOG_DEBUG("store client: authenticated with the job token from {}", file);
        return store;
      } catch (const CommError& e) {
        // Most likely a stale file of an earlier job on this port; rank 0
        // replaces it once its server is up.
        refused = token;
        why = fmt::format("the store at {}:{} refused the token in {}: {}", options.host, options.port, file, e.what());
        TORUS_LOG_INFO("{}; waiting for rank 0 to write a fresh one", why);
      }
    }
    if (Clock::now() >= deadline) {
      throw TimeoutError(fmt::format(
          "no usable job token within {} ms: {}. Rank 0 writes {} once its store at {}:{} is up; without "
          "TORUS_JOB_TOKEN all ranks must see the same runtime directory (TORUS_RUNTIME_DIR, else XDG_RUNTIME_DIR, "
          "else TMPDIR, else /tmp), otherwise set TORUS_JOB_TOKEN to the same secret on every rank",
          timeout.count(), why, file, options.host, options.port));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(kPollInterval, deadline - Clock::now()));
  }
}

}  // namespace torus::comm
