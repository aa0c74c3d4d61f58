// The EFA start-up check (src/comm/nccl/efa_check.h) on a fake sysfs tree,
// fake lists of loaded libraries and a fake environment.
#include "comm/nccl/efa_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

namespace torus::comm::nccl {
namespace {

namespace fs = std::filesystem;

class EfaCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("torus_efa_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "class/infiniband");
    fs::create_directories(root_ / "drivers/efa");
    fs::create_directories(root_ / "drivers/mlx5_core");
  }
  void TearDown() override { fs::remove_all(root_); }

  void add_device(const std::string& name, const std::string& driver) {
    // As in sysfs: class/infiniband/<name> -> the device, whose device/driver
    // links to the driver directory.
    fs::path dev = root_ / "devices" / name;
    fs::create_directories(dev / "device");
    fs::create_directory_symlink(root_ / "drivers" / driver, dev / "device" / "driver");
    fs::create_directory_symlink(dev, root_ / "class/infiniband" / name);
  }

  EfaProbeInputs inputs(std::vector<std::string> libs, std::map<std::string, std::string> env = {}) {
    EfaProbeInputs in;
    in.sysfs_root = (root_ / "class/infiniband").string();
    in.loaded_libraries = std::move(libs);
    in.lookup_env = [env](const char* name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    return in;
  }

  fs::path root_;
};

TEST_F(EfaCheck, NoEfaHardware) {
  add_device("mlx5_0", "mlx5_core");
  EfaReport r = probe_efa(inputs({"/usr/lib/libc.so.6"}));
  EXPECT_TRUE(r.efa_devices.empty());
  EfaVerdict v = judge_efa(r);
  EXPECT_EQ(v.level, LogLevel::kInfo);
  EXPECT_NE(v.message.find("no EFA device"), std::string::npos) << v.message;
}

TEST_F(EfaCheck, EfaWithoutPluginWarns) {
  add_device("rdmap16s27", "efa");
  add_device("rdmap32s27", "efa");
  EfaReport r = probe_efa(inputs({"/usr/local/cuda/lib/libnccl.so.2"}));
  ASSERT_EQ(r.efa_devices, (std::vector<std::string>{"rdmap16s27", "rdmap32s27"}));
  EfaVerdict v = judge_efa(r);
  EXPECT_EQ(v.level, LogLevel::kWarn);
  EXPECT_NE(v.message.find("TCP sockets"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("libnccl-net-ofi.so"), std::string::npos) << v.message;
}

TEST_F(EfaCheck, EfaInUse) {
  add_device("rdmap16s27", "efa");
  EfaReport r = probe_efa(inputs({"/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", "/opt/amazon/efa/lib/libfabric.so.1"},
                                 {{"NCCL_NET_PLUGIN", "ofi"}}));
  EXPECT_EQ(r.net_plugin, "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so");
  EXPECT_EQ(r.libfabric, "/opt/amazon/efa/lib/libfabric.so.1");
  EfaVerdict v = judge_efa(r);
  EXPECT_EQ(v.level, LogLevel::kInfo);
  EXPECT_NE(v.message.find("in use"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("NCCL_NET_PLUGIN=ofi"), std::string::npos) << v.message;
  EXPECT_EQ(v.message.find("obsolete"), std::string::npos) << v.message;
}

TEST_F(EfaCheck, FlagsObsoleteAndHarmfulSettings) {
  add_device("rdmap16s27", "efa");
  EfaReport r = probe_efa(inputs({"/x/libnccl-net.so", "/x/libfabric.so.1"},
                                 {{"FI_EFA_USE_DEVICE_RDMA", "1"}, {"RDMAV_FORK_SAFE", "1"}, {"NCCL_PROTO", "simple"},
                                  {"FI_EFA_USE_HUGE_PAGE", "0"}}));
  EXPECT_EQ(r.settings.size(), 4u);
  EXPECT_EQ(r.advice.size(), 3u) << "FI_EFA_USE_HUGE_PAGE=0 is a valid workaround, not obsolete";
  EfaVerdict v = judge_efa(r);
  EXPECT_NE(v.message.find("FI_EFA_USE_DEVICE_RDMA: not needed"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("RDMAV_FORK_SAFE: do not set"), std::string::npos) << v.message;
}

TEST(EfaCheckProcess, ListsLoadedLibraries) {
  std::vector<std::string> libs = loaded_libraries();
  bool libc = false;
  for (const auto& l : libs) libc = libc || l.find("libc.so") != std::string::npos;
  EXPECT_TRUE(libc) << "dl_iterate_phdr should list libc";
}

}  // namespace
}  // namespace torus::comm::nccl
