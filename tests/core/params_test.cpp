// Unit tests of the environment layer (torus/core/params.h): every variable
// parsed into its EnvParams field, bad values rejected naming the variable,
// the unknown-name warning list, and the documentation kept in step.
#include "torus/core/params.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "torus/core/error.h"

extern char** environ;

namespace torus {
namespace {

namespace fs = std::filesystem;

// Clears every TORUS_* variable (and the fallbacks params reads) for one
// test and restores the environment afterwards, so that a developer's own
// settings cannot change the results.
class Params : public ::testing::Test {
 protected:
  void SetUp() override {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (eq == nullptr) continue;
      std::string name(*e, static_cast<size_t>(eq - *e));
      if (name.rfind("TORUS_", 0) == 0 || name == "FI_PROVIDER" || name == "XDG_RUNTIME_DIR" || name == "TMPDIR") {
        saved_[name] = eq + 1;
      }
    }
    for (const auto& [name, value] : saved_) ::unsetenv(name.c_str());
  }
  void TearDown() override {
    for (const std::string& name : set_) ::unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  void set(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
    set_.insert(name);
  }
  void unset(const std::string& name) { ::unsetenv(name.c_str()); }

 private:
  std::map<std::string, std::string> saved_;
  std::set<std::string> set_;
};

TEST_F(Params, DefaultsWhenNothingIsSet) {
  EnvParams p = EnvParams::from_env();
  EXPECT_EQ(p.log_level, LogLevel::kInfo);
  EXPECT_EQ(p.timeout, std::chrono::minutes(10));
  EXPECT_FALSE(p.debug_collectives);
  EXPECT_FALSE(p.rank || p.world_size || p.local_rank || p.local_size || p.master_port);
  EXPECT_EQ(p.store_timeout, std::chrono::minutes(5));
  EXPECT_EQ(p.runtime_dir, "/tmp");
  EXPECT_EQ(p.ofi.provider, "");
  EXPECT_FALSE(p.ofi.host_shm || p.ofi.shm_chunk_bytes || p.ofi.shm_stage_bytes || p.ofi.shm_depth ||
               p.ofi.shm_eager_bytes || p.ofi.shm_nt_bytes || p.ofi.shm_zero_copy_bytes || p.ofi.inline_spin_us ||
               p.ofi.inline_max_bytes || p.ofi.oversubscribed || p.ofi.rd_max_bytes || p.ofi.tree_max_bytes ||
               p.ofi.chunk_bytes || p.ofi.window || p.ofi.register_local)
      << "an unset ofi tunable keeps OfiOptions' default";
  EXPECT_EQ(p.shared_host.alloc, SharedHostAllocPolicy::kAuto);
  EXPECT_FALSE(p.shared_host.alloc_min_bytes || p.shared_host.slab_bytes || p.shared_host.cache_bytes);
  EXPECT_FALSE(p.shared_host.fork_copy);
  EXPECT_TRUE(p.unknown.empty());
}

TEST_F(Params, ParsesEveryVariable) {
  const std::map<std::string, std::string> values = {
      {"TORUS_LOG_LEVEL", "debug"},
      {"TORUS_TIMEOUT_MS", "1500"},
      {"TORUS_DEBUG_COLLECTIVES", "yes"},
      {"TORUS_BACKEND", "ofi"},
      {"TORUS_RANK", "2"},
      {"TORUS_WORLD_SIZE", "4"},
      {"TORUS_LOCAL_RANK", "0"},
      {"TORUS_LOCAL_SIZE", "2"},
      {"TORUS_MASTER_ADDR", "10.0.0.1"},
      {"TORUS_MASTER_PORT", "29500"},
      {"TORUS_SOCKET_IFNAME", "eth1"},
      {"TORUS_JOB_TOKEN", "secret-value"},
      {"TORUS_STORE_TIMEOUT_MS", "2000"},
      {"TORUS_RUNTIME_DIR", "/scratch/torus"},
      {"TORUS_OFI_PROVIDER", "tcp"},
      {"TORUS_OFI_HOST_SHM", "0"},
      {"TORUS_OFI_SHM_CHUNK_BYTES", "8192"},
      {"TORUS_OFI_SHM_STAGE_BYTES", "1048576"},
      {"TORUS_OFI_SHM_DEPTH", "3"},
      {"TORUS_OFI_SHM_EAGER_BYTES", "4096"},
      {"TORUS_OFI_SHM_NT_BYTES", "0"},
      {"TORUS_OFI_SHM_ZERO_COPY_BYTES", "32768"},
      {"TORUS_OFI_INLINE_SPIN_US", "0"},
      {"TORUS_OFI_INLINE_MAX_BYTES", "1024"},
      {"TORUS_OFI_OVERSUBSCRIBED", "1"},
      {"TORUS_OFI_RD_MAX_BYTES", "100"},
      {"TORUS_OFI_TREE_MAX_BYTES", "200"},
      {"TORUS_OFI_CHUNK_BYTES", "65536"},
      {"TORUS_OFI_WINDOW", "2"},
      {"TORUS_OFI_REGISTER_LOCAL", "true"},
      {"TORUS_SHARED_HOST_ALLOC", "off"},
      {"TORUS_SHARED_HOST_ALLOC_MIN_BYTES", "1"},
      {"TORUS_SHARED_HOST_SLAB_BYTES", "4194304"},
      {"TORUS_SHARED_HOST_CACHE_BYTES", "0"},
      {"TORUS_SHARED_HOST_FORK", "copy"},
  };
  for (const auto& [name, value] : values) set(name, value);
  EnvParams p = EnvParams::from_env();
  EXPECT_EQ(p.log_level, LogLevel::kDebug);
  EXPECT_EQ(p.timeout.count(), 1500);
  EXPECT_TRUE(p.debug_collectives);
  EXPECT_EQ(p.host_backend, "ofi");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.local_rank, 0);
  EXPECT_EQ(p.local_size, 2);
  EXPECT_EQ(p.master_addr, "10.0.0.1");
  EXPECT_EQ(p.master_port, 29500);
  EXPECT_EQ(p.socket_ifname, "eth1");
  EXPECT_EQ(p.job_token, "secret-value");
  EXPECT_EQ(p.store_timeout.count(), 2000);
  EXPECT_EQ(p.runtime_dir, "/scratch/torus");
  EXPECT_EQ(p.ofi.provider, "tcp");
  EXPECT_EQ(p.ofi.host_shm, false);
  EXPECT_EQ(p.ofi.shm_chunk_bytes, 8192u);
  EXPECT_EQ(p.ofi.shm_stage_bytes, 1048576u);
  EXPECT_EQ(p.ofi.shm_depth, 3);
  EXPECT_EQ(p.ofi.shm_eager_bytes, 4096u);
  EXPECT_EQ(p.ofi.shm_nt_bytes, 0u);
  EXPECT_EQ(p.ofi.shm_zero_copy_bytes, 32768u);
  EXPECT_EQ(p.ofi.inline_spin_us, 0u);
  EXPECT_EQ(p.ofi.inline_max_bytes, 1024u);
  EXPECT_EQ(p.ofi.oversubscribed, true);
  EXPECT_EQ(p.ofi.rd_max_bytes, 100u);
  EXPECT_EQ(p.ofi.tree_max_bytes, 200u);
  EXPECT_EQ(p.ofi.chunk_bytes, 65536u);
  EXPECT_EQ(p.ofi.window, 2);
  EXPECT_EQ(p.ofi.register_local, true);
  EXPECT_EQ(p.shared_host.alloc, SharedHostAllocPolicy::kOff);
  EXPECT_EQ(p.shared_host.alloc_min_bytes, 1u);
  EXPECT_EQ(p.shared_host.slab_bytes, size_t{4} << 20);
  EXPECT_EQ(p.shared_host.cache_bytes, 0u);
  EXPECT_TRUE(p.shared_host.fork_copy);
  EXPECT_TRUE(p.unknown.empty()) << "every variable parsed is known; unknown: " << ::testing::PrintToString(p.unknown);

  // describe() has a line for each, and never the token.
  std::set<std::string> described;
  for (const auto& [name, value] : p.describe()) {
    described.insert(name);
    EXPECT_EQ(value.find("secret"), std::string::npos) << name << " leaks the token";
  }
  for (const auto& [name, value] : values) EXPECT_TRUE(described.count(name)) << name << " is not in describe()";
}

TEST_F(Params, ProviderFallsBackToFiProvider) {
  set("FI_PROVIDER", "shm");
  EXPECT_EQ(EnvParams::from_env().ofi.provider, "shm");
  set("TORUS_OFI_PROVIDER", "tcp");
  EXPECT_EQ(EnvParams::from_env().ofi.provider, "tcp");
}

TEST_F(Params, SharedHostAllocAcceptsItsSpellings) {
  for (const auto& [value, policy] : std::vector<std::pair<std::string, SharedHostAllocPolicy>>{
           {"auto", SharedHostAllocPolicy::kAuto},
           {"on", SharedHostAllocPolicy::kOn},
           {"1", SharedHostAllocPolicy::kOn},
           {"off", SharedHostAllocPolicy::kOff},
           {"0", SharedHostAllocPolicy::kOff}}) {
    set("TORUS_SHARED_HOST_ALLOC", value);
    EXPECT_EQ(EnvParams::from_env().shared_host.alloc, policy) << value;
  }
}

TEST_F(Params, RejectsBadValuesNamingTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"TORUS_LOG_LEVEL", "loud"},
      {"TORUS_TIMEOUT_MS", "ten"},
      {"TORUS_TIMEOUT_MS", "-4"},
      {"TORUS_TIMEOUT_MS", "0"},
      {"TORUS_DEBUG_COLLECTIVES", "maybe"},
      {"TORUS_BACKEND", "carrier-pigeon"},
      {"TORUS_RANK", "-1"},
      {"TORUS_WORLD_SIZE", "0"},
      {"TORUS_LOCAL_RANK", "x"},
      {"TORUS_LOCAL_SIZE", "0"},
      {"TORUS_MASTER_PORT", "70000"},
      {"TORUS_MASTER_PORT", "http"},
      {"TORUS_STORE_TIMEOUT_MS", "0"},
      {"TORUS_RUNTIME_DIR", "relative/dir"},
      {"TORUS_OFI_HOST_SHM", "perhaps"},
      {"TORUS_OFI_SHM_CHUNK_BYTES", "32"},
      {"TORUS_OFI_SHM_STAGE_BYTES", "1000"},
      {"TORUS_OFI_SHM_DEPTH", "1"},
      {"TORUS_OFI_SHM_EAGER_BYTES", "-1"},
      {"TORUS_OFI_SHM_NT_BYTES", "lots"},
      {"TORUS_OFI_SHM_ZERO_COPY_BYTES", "-5"},
      {"TORUS_OFI_INLINE_SPIN_US", "-1"},
      {"TORUS_OFI_INLINE_MAX_BYTES", "1k"},
      {"TORUS_OFI_OVERSUBSCRIBED", "2"},
      {"TORUS_OFI_RD_MAX_BYTES", "-1"},
      {"TORUS_OFI_TREE_MAX_BYTES", "x"},
      {"TORUS_OFI_CHUNK_BYTES", "63"},
      {"TORUS_OFI_WINDOW", "0"},
      {"TORUS_OFI_WINDOW", "99999999999"},
      {"TORUS_OFI_REGISTER_LOCAL", "sometimes"},
      {"TORUS_SHARED_HOST_ALLOC", "yes please"},
      {"TORUS_SHARED_HOST_ALLOC_MIN_BYTES", "0"},
      {"TORUS_SHARED_HOST_SLAB_BYTES", "4096"},
      {"TORUS_SHARED_HOST_CACHE_BYTES", "-1"},
      {"TORUS_SHARED_HOST_FORK", "share"},
  };
  for (const auto& [name, value] : bad) {
    set(name, value);
    try {
      (void)EnvParams::from_env();
      ADD_FAILURE() << name << "='" << value << "' accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << name << "='" << value << "': " << e.what();
    }
    unset(name);
  }
  EXPECT_NO_THROW(EnvParams::from_env());
}

TEST_F(Params, LoggerLevelNeverThrows) {
  EXPECT_EQ(initial_log_level_from_env(), LogLevel::kInfo);
  set("TORUS_LOG_LEVEL", "warn");
  EXPECT_EQ(initial_log_level_from_env(), LogLevel::kWarn);
  set("TORUS_LOG_LEVEL", "loud");
  EXPECT_EQ(initial_log_level_from_env(), LogLevel::kInfo);
}

TEST_F(Params, UnknownListsTyposButNotKnownNames) {
  set("TORUS_TIMEOUTMS", "5");                    // typo of TORUS_TIMEOUT_MS
  set("TORUS_OFI_WINDOWS", "4");                  // typo of TORUS_OFI_WINDOW
  set("TORUS_SHARED_HOST_SLAB", "1");             // truncated
  set("TORUS_OFI_INLINE_SPIN_US", "5");           // documented in docs/ofi.md
  set("TORUS_OFI_INLINE_MAX_BYTES", "4096");      // documented in docs/ofi.md
  set("TORUS_OFI_OVERSUBSCRIBED", "0");           // documented in docs/ofi.md
  set("TORUS_REQUIRE_GPU", "1");                  // read by the tests
  set("TORUS_TEST_LAYOUT", "tp2");                // the tests' reserved prefix
  EnvParams p = EnvParams::from_env();
  std::set<std::string> unknown(p.unknown.begin(), p.unknown.end());
  EXPECT_EQ(unknown, (std::set<std::string>{"TORUS_TIMEOUTMS", "TORUS_OFI_WINDOWS", "TORUS_SHARED_HOST_SLAB"}));
  EXPECT_FALSE(is_known_env_variable("TORUS_TEST_")) << "the bare prefix is no name";
}

// --- the documentation ------------------------------------------------------------

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Files under `dir` (recursively) whose extension is one of `exts`.
std::vector<fs::path> files_under(const fs::path& dir, const std::set<std::string>& exts) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && exts.count(e.path().extension().string())) out.push_back(e.path());
  }
  return out;
}

void collect(const std::string& text, const std::regex& re, std::set<std::string>& out) {
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1].str());
  }
}

// Every TORUS_* name the docs mention is a variable params knows, unless it
// is a C++ macro or a CMake option of the project; `TORUS_OFI_SHM_*` stands
// for the names it prefixes.
TEST(ParamsDocs, EveryTorusNameInTheDocsIsKnown) {
  const fs::path root = TORUS_SOURCE_DIR;
  ASSERT_TRUE(fs::is_directory(root / "docs")) << root;

  std::set<std::string> macros, cmake;
  const std::regex define_re(R"(#\s*define\s+(TORUS_[A-Z0-9_]+))");
  for (const char* dir : {"include", "src", "tests", "bench", "python"}) {
    for (const auto& f : files_under(root / dir, {".h", ".hpp", ".cpp", ".cu", ".cuh", ".in"})) {
      collect(read_text(f), define_re, macros);
    }
  }
  const std::regex option_re(R"(option\(\s*(TORUS_[A-Z0-9_]+))");
  const std::regex cache_re(R"(set\(\s*(TORUS_[A-Z0-9_]+)[^)]*CACHE)");
  std::vector<fs::path> cmake_files = files_under(root / "cmake", {".cmake"});
  cmake_files.push_back(root / "CMakeLists.txt");
  for (const auto& f : cmake_files) {
    const std::string text = read_text(f);
    collect(text, option_re, cmake);
    collect(text, cache_re, cmake);
  }
  ASSERT_TRUE(macros.count("TORUS_CHECK")) << "macro scan found nothing";
  ASSERT_TRUE(cmake.count("TORUS_WITH_CUDA")) << "CMake option scan found nothing";

  const std::regex name_re(R"(TORUS_[A-Z0-9_]*(\*?))");
  std::map<std::string, std::string> names, prefixes;  // name -> a doc that mentions it
  for (const auto& doc : files_under(root / "docs", {".md"})) {
    const std::string text = read_text(doc);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), name_re); it != std::sregex_iterator(); ++it) {
      std::string name = (*it)[0].str();
      const bool wildcard = name.back() == '*';
      if (wildcard) name.pop_back();
      if (wildcard || name.back() == '_') {
        prefixes.emplace(name, doc.filename().string());
      } else {
        names.emplace(name, doc.filename().string());
      }
    }
  }
  ASSERT_TRUE(names.count("TORUS_OFI_INLINE_SPIN_US")) << "docs/ofi.md not read";

  for (const auto& [name, doc] : names) {
    if (macros.count(name) || cmake.count(name)) continue;
    EXPECT_TRUE(is_known_env_variable(name)) << name << " (docs/" << doc << ") is not known to params.cpp";
  }
  for (const auto& [prefix, doc] : prefixes) {
    bool used = false;
    for (const auto& [name, where] : names) used = used || name.rfind(prefix, 0) == 0;
    for (const auto& m : macros) used = used || m.rfind(prefix, 0) == 0;
    EXPECT_TRUE(used) << prefix << "* (docs/" << doc << ") matches no variable, macro or option";
  }
}

}  // namespace
}  // namespace torus
