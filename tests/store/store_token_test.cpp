// Note [Local job token] (src/comm/store_token.h) under test: the path every
// rank derives, the 0600 file in the 0700 directory and its removal, the
// refusal of unsafe directories and files, and the client that waits for the
// file and re-reads it when a stale one is refused.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "comm/store_token.h"
#include "store_test_util.h"
#include "torus/core/error.h"
#include "torus/core/params.h"

namespace torus::comm::test {
namespace {

// A scratch runtime directory, removed with everything in it.
class Scratch {
 public:
  Scratch() {
    char tmpl[] = "/tmp/torus-token-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = tmpl;
  }
  ~Scratch() { (void)std::system(("chmod -R u+rwx '" + root_ + "' 2>/dev/null; rm -rf '" + root_ + "'").c_str()); }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

mode_t mode_of(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::fchmod(fd, mode);
  ::close(fd);
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

// The refusal names what it refused and why.
void expect_refused(const std::function<void()>& fn, const std::string& what, const std::string& why) {
  try {
    fn();
    ADD_FAILURE() << "accepted " << what;
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("refusing " + what), std::string::npos) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
    EXPECT_NE(msg.find("TORUS_JOB_TOKEN"), std::string::npos) << msg;
  }
}

// Sets or unsets an environment variable for one scope.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvVar() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(StoreToken, RuntimeDirIsTorusRuntimeDirElseXdgElseTmpdirElseTmp) {
  EnvVar a("TORUS_RUNTIME_DIR", nullptr), b("XDG_RUNTIME_DIR", nullptr), c("TMPDIR", nullptr);
  EXPECT_EQ(EnvParams::from_env().runtime_dir, "/tmp");
  EnvVar t("TMPDIR", "/scratch/tmp");
  EXPECT_EQ(EnvParams::from_env().runtime_dir, "/scratch/tmp");
  {
    EnvVar x("XDG_RUNTIME_DIR", "relative/ignored");  // the XDG spec: ignore a relative value
    EXPECT_EQ(EnvParams::from_env().runtime_dir, "/scratch/tmp");
  }
  EnvVar x("XDG_RUNTIME_DIR", "/run/user/1000");
  EXPECT_EQ(EnvParams::from_env().runtime_dir, "/run/user/1000");
  EnvVar r("TORUS_RUNTIME_DIR", "/shared/torus");
  EXPECT_EQ(EnvParams::from_env().runtime_dir, "/shared/torus");
  auto unknown = EnvParams::from_env().unknown;
  EXPECT_EQ(std::count(unknown.begin(), unknown.end(), "TORUS_RUNTIME_DIR"), 0);
  EnvVar bad("TORUS_RUNTIME_DIR", "not/absolute");
  EXPECT_THROW(EnvParams::from_env(), InvalidArgument);
}

TEST(StoreToken, PathIsDerivedFromRuntimeDirUserAddressAndPort) {
  const std::string uid = std::to_string(::geteuid());
  auto p = local_token_path("/run/user/7/", "127.0.0.1", 29500);
  EXPECT_EQ(p.dir, "/run/user/7/torus-" + uid);
  EXPECT_EQ(p.name, "store-127.0.0.1-29500.token");
  EXPECT_EQ(p.file(), "/run/user/7/torus-" + uid + "/store-127.0.0.1-29500.token");
  EXPECT_EQ(local_token_path("/tmp", "::1", 80).name, "store-__1-80.token");
  EXPECT_EQ(local_token_path("/", "127.0.0.1", 1).dir, "/torus-" + uid);
  EXPECT_NE(local_token_path("/tmp", "127.0.0.1", 1).name, local_token_path("/tmp", "127.0.0.1", 2).name);
  EXPECT_THROW(local_token_path("", "127.0.0.1", 1), InvalidArgument);
}

TEST(StoreToken, PublishWritesAPrivateFileAtomicallyAndRemovesItAtTheEnd) {
  Scratch s;
  auto path = local_token_path(s.root(), "127.0.0.1", 4242);
  const std::string token = generate_job_token();
  {
    LocalTokenFile f(path);
    EXPECT_EQ(mode_of(path.dir) & 07777, 0700u);
    EXPECT_TRUE(S_ISDIR(mode_of(path.dir)));
    EXPECT_FALSE(read_local_token(path).has_value());  // not published yet
    f.publish("first-token");
    f.publish(token);  // replaces it whole
    EXPECT_TRUE(S_ISREG(mode_of(path.file())));
    EXPECT_EQ(mode_of(path.file()) & 07777, 0600u);
    EXPECT_EQ(slurp(path.file()), token + "\n");
    EXPECT_EQ(read_local_token(path), token);
    EXPECT_EQ(entries(path.dir), std::vector<std::string>{path.name});  // no temporary left behind
  }
  EXPECT_EQ(mode_of(path.file()), 0u) << "the token file outlived its publisher";
  EXPECT_FALSE(read_local_token(path).has_value());
}

TEST(StoreToken, PublisherRemovesOnlyItsOwnToken) {
  Scratch s;
  auto path = local_token_path(s.root(), "127.0.0.1", 4243);
  auto first = std::make_unique<LocalTokenFile>(path);
  first->publish("token-of-the-first-job");
  LocalTokenFile second(path);
  second.publish("token-of-the-second-job");
  first.reset();
  EXPECT_EQ(read_local_token(path), "token-of-the-second-job");
}

TEST(StoreToken, UmaskCannotWidenOrBreakTheModes) {
  Scratch s;
  mode_t old = ::umask(0);
  auto path = local_token_path(s.root(), "127.0.0.1", 4244);
  {
    LocalTokenFile f(path);
    f.publish("t");
    EXPECT_EQ(mode_of(path.dir) & 07777, 0700u);
    EXPECT_EQ(mode_of(path.file()) & 07777, 0600u);
  }
  ::umask(old);
}

TEST(StoreToken, UnsafeDirectoriesAreRefused) {
  Scratch s;
  auto path = local_token_path(s.root(), "127.0.0.1", 4245);
  auto publish = [&] { LocalTokenFile(path).publish("t"); };
  auto read = [&] { read_local_token(path); };

  ASSERT_EQ(::mkdir(path.dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(path.dir.c_str(), 0755), 0);
  expect_refused(publish, "the directory " + path.dir, "mode is 0755");
  expect_refused(read, "the directory " + path.dir, "group or others");
  ASSERT_EQ(::chmod(path.dir.c_str(), 0730), 0);
  expect_refused(publish, "the directory " + path.dir, "mode is 0730");

  ASSERT_EQ(::rmdir(path.dir.c_str()), 0);
  const std::string elsewhere = s.root() + "/elsewhere";
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), path.dir.c_str()), 0);  // private target, but a link
  expect_refused(publish, "the directory " + path.dir, "symbolic link");
  expect_refused(read, "the directory " + path.dir, "symbolic link");
  EXPECT_TRUE(entries(elsewhere).empty()) << "wrote through the link";

  ASSERT_EQ(::unlink(path.dir.c_str()), 0);
  write_file(path.dir, "x", 0600);
  expect_refused(publish, "the directory " + path.dir, "not a directory");
  ASSERT_EQ(::unlink(path.dir.c_str()), 0);

  if (::geteuid() == 0) {  // only root can make a directory another user's
    ASSERT_EQ(::mkdir(path.dir.c_str(), 0700), 0);
    ASSERT_EQ(::chown(path.dir.c_str(), 65534, 65534), 0);
    expect_refused(publish, "the directory " + path.dir, "owned by uid 65534");
    expect_refused(read, "the directory " + path.dir, "owned by uid 65534");
  }
}

TEST(StoreToken, UnsafeFilesAreRefused) {
  Scratch s;
  auto path = local_token_path(s.root(), "127.0.0.1", 4246);
  ASSERT_EQ(::mkdir(path.dir.c_str(), 0700), 0);
  write_file(path.file(), "readable-by-all\n", 0644);
  expect_refused([&] { read_local_token(path); }, "the file " + path.file(), "mode is 0644");
  ASSERT_EQ(::unlink(path.file().c_str()), 0);
  const std::string target = s.root() + "/target";
  write_file(target, "planted\n", 0600);
  ASSERT_EQ(::symlink(target.c_str(), path.file().c_str()), 0);
  expect_refused([&] { read_local_token(path); }, "the file " + path.file(), "symbolic link");
  ASSERT_EQ(::unlink(path.file().c_str()), 0);
  ASSERT_EQ(::mkfifo(path.file().c_str(), 0600), 0);  // must not block the reader
  expect_refused([&] { read_local_token(path); }, "the file " + path.file(), "not a regular file");
}

TcpStore::Options options_for(int port, std::chrono::milliseconds timeout) {
  TcpStore::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = timeout;
  o.request_timeout = 10s;
  return o;
}

TEST(StoreToken, ClientWaitsForTheFile) {
  Scratch s;
  const std::string token = generate_job_token();
  TcpStoreServer server(server_options(token));
  auto path = local_token_path(s.root(), "127.0.0.1", server.port());
  LocalTokenFile file(path);
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    file.publish(token);
  });
  auto t0 = std::chrono::steady_clock::now();
  auto store = connect_with_local_token(options_for(server.port(), 10s), path);
  late.join();
  EXPECT_GE(seconds_since(t0), 0.25);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(store->add("n", 2), 2);
  EXPECT_EQ(server.stats().auth_failures, 0u);
}

TEST(StoreToken, StaleFileIsReReadUntilRankZeroReplacesIt) {
  Scratch s;
  const std::string token = generate_job_token();
  TcpStoreServer server(server_options(token));
  auto path = local_token_path(s.root(), "127.0.0.1", server.port());
  ASSERT_EQ(::mkdir(path.dir.c_str(), 0700), 0);
  write_file(path.file(), "stale-token-of-an-earlier-job\n", 0600);
  LocalTokenFile rank0_file(path);
  std::thread rank0([&] {
    std::this_thread::sleep_for(500ms);  // the client has been refused by then
    rank0_file.publish(token);
  });
  auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<TcpStore> store;
  try {
    store = connect_with_local_token(options_for(server.port(), 10s), path);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  rank0.join();
  ASSERT_NE(store, nullptr);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(store->add("n", 1), 1);
  EXPECT_GE(server.stats().auth_failures, 1u);  // the stale token was tried and refused
}

TEST(StoreToken, ClientTimesOutNamingTheFile) {
  Scratch s;
  TcpStoreServer server(server_options());
  auto path = local_token_path(s.root(), "127.0.0.1", server.port());
  auto t0 = std::chrono::steady_clock::now();
  try {
    connect_with_local_token(options_for(server.port(), 300ms), path);
    FAIL() << "connected without a token";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path.file()), std::string::npos) << msg;
    EXPECT_NE(msg.find("TORUS_JOB_TOKEN"), std::string::npos) << msg;
  }
  EXPECT_LT(seconds_since(t0), 3.0);
  // A stale token that is never replaced ends the same way, saying so.
  ASSERT_EQ(::mkdir(path.dir.c_str(), 0700), 0);
  write_file(path.file(), "stale\n", 0600);
  try {
    connect_with_local_token(options_for(server.port(), 500ms), path);
    FAIL() << "connected with a stale token";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("refused the token in " + path.file()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torus::comm::test
