// The hardware table (torus/device/hardware.h) and the per-host peak cache
// (torus/device/peak_cache.h). The expected figures are the datasheets'
// (written here, not read from the table).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "torus/device/hardware.h"
#include "torus/device/peak_cache.h"

namespace torus::device {
namespace {

constexpr double kGB = 1e9;
constexpr double kT = 1e12;

TEST(HardwareTable, MachinesCarryTheirDatasheetFigures) {
  EXPECT_EQ(hardware_names(), "a100-40gb, a100-80gb, h100-80gb, h200-141gb, trn1, dgx-a100, cpu");
  const Hardware* a = find_hardware("a100-40gb");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->instance, "p4d.24xlarge");
  EXPECT_EQ(a->devices_per_node, 8);
  EXPECT_EQ(a->efa, 4);
  EXPECT_EQ(a->device_memory, 40 * kGB);
  EXPECT_EQ(a->host_memory, 1152 * kGB);
  EXPECT_EQ(a->peak_flops_16, 312 * kT);
  EXPECT_EQ(a->peak_flops_32, 19.5 * kT);
  EXPECT_EQ(a->peak_flops_8, 0.0);
  EXPECT_EQ(a->intra_node_bw, 300 * kGB);
  EXPECT_EQ(a->network_bw, 50 * kGB);
  EXPECT_EQ(a->host_link_bw, 25 * kGB);
  EXPECT_EQ(a->intra_latency, 10e-6);
  EXPECT_EQ(a->network_latency, 30e-6);
  EXPECT_EQ(a->efficiency, 0.5);
  EXPECT_EQ(find_hardware("a100-80gb")->device_memory, 80 * kGB);
  EXPECT_EQ(find_hardware("a100-80gb")->instance, "p4de.24xlarge");

  const Hardware* h = find_hardware("h100-80gb");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->instance, "p5.48xlarge");
  EXPECT_EQ(h->peak_flops_16, 989.4 * kT);
  EXPECT_EQ(h->peak_flops_32, 66.9 * kT);
  EXPECT_EQ(h->peak_flops_8, 1979 * kT);
  EXPECT_EQ(h->host_memory, 2048 * kGB);
  EXPECT_EQ(h->intra_node_bw, 450 * kGB);
  EXPECT_EQ(h->network_bw, 400 * kGB);
  EXPECT_EQ(h->host_link_bw, 50 * kGB);
  EXPECT_EQ(h->efa, 32);
  const Hardware* h200 = find_hardware("h200-141gb");
  ASSERT_NE(h200, nullptr);
  EXPECT_EQ(h200->instance, "p5e.48xlarge");
  EXPECT_EQ(h200->device_memory, 141 * kGB);
  EXPECT_EQ(h200->peak_flops_8, 1979 * kT);

  const Hardware* t = find_hardware("trn1");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->devices_per_node, 32);
  EXPECT_EQ(t->device_memory, 16 * kGB);
  EXPECT_EQ(t->peak_flops_16, 95 * kT);  // 190 TFLOP/s per chip of two cores
  EXPECT_EQ(t->peak_flops_32, 23.75 * kT);
  EXPECT_EQ(t->intra_latency, 15e-6);
  EXPECT_EQ(t->efficiency, 0.4);

  const Hardware* d = find_hardware("dgx-a100");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->instance, "");
  EXPECT_EQ(d->network_bw, 200 * kGB);
  EXPECT_EQ(d->network_latency, 10e-6);
  EXPECT_EQ(d->host_memory, 2048 * kGB);

  const Hardware* c = find_hardware("cpu");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->devices_per_node, 0);
  EXPECT_EQ(c->peak_flops_16, 0.0);
  EXPECT_EQ(c->network_bw, 1.25 * kGB);
  EXPECT_EQ(find_hardware("tpu"), nullptr);
}

TEST(HardwareTable, DeviceNamesMatchTheMostSpecificModel) {
  auto name_of = [](const std::string& runtime_name) {
    const DeviceSpec* d = match_device(runtime_name);
    return d ? d->name : std::string("none");
  };
  EXPECT_EQ(name_of("NVIDIA H100 80GB HBM3"), "h100-sxm");
  EXPECT_EQ(name_of("NVIDIA H100 PCIe"), "h100-pcie");
  EXPECT_EQ(name_of("NVIDIA H200"), "h200");
  EXPECT_EQ(name_of("NVIDIA A100-SXM4-40GB"), "a100");
  EXPECT_EQ(name_of("Tesla V100-SXM2-16GB"), "v100");
  EXPECT_EQ(name_of("Some GPU"), "none");
  EXPECT_EQ(name_of(""), "none");
  const DeviceSpec* v100 = match_device("Tesla V100-SXM2-16GB");
  EXPECT_EQ(v100->peak_flops_bf16, 0.0);  // no bf16 tensor cores
  EXPECT_EQ(v100->peak_flops_fp16, 125 * kT);
  EXPECT_EQ(v100->peak_flops_32, 15.7 * kT);
  EXPECT_EQ(match_device("NVIDIA H100 PCIe")->peak_flops_bf16, 756 * kT);
}

TEST(HardwareTable, TheEmbeddedTextIsTheTable) {
  const auto j = nlohmann::json::parse(hardware_table_json());
  EXPECT_EQ(j["format"], "torus-hardware-1");
  EXPECT_EQ(j["machines"].size(), hardware_presets().size());
  EXPECT_EQ(j["devices"].size(), device_specs().size());
}

class PeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("torus_peak_cache_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    path_ = (dir_ / "sub" / "peak_flops.json").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(PeakCache, KeepsOneFigurePerKey) {
  const PeakKey f32 = host_peak_key("Float", 2);
  EXPECT_EQ(f32.threads, 2);
  EXPECT_FALSE(f32.host.empty());
  EXPECT_FALSE(read_cached_peak(path_, f32).has_value());  // no file yet
  write_cached_peak(path_, f32, 1.5e11);
  PeakKey bf16 = host_peak_key("BFloat16", 2);
  write_cached_peak(path_, bf16, 0.5e11);
  write_cached_peak(path_, f32, 1.25e11);  // replaces its entry
  auto hit = read_cached_peak(path_, f32);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->flops, 1.25e11);
  EXPECT_GT(hit->measured_unix, 1700000000);
  EXPECT_EQ(read_cached_peak(path_, bf16)->flops, 0.5e11);
  PeakKey other = f32;
  other.threads = 3;
  EXPECT_FALSE(read_cached_peak(path_, other).has_value());
  other = f32;
  other.version = "0.0.0";
  EXPECT_FALSE(read_cached_peak(path_, other).has_value());
  other = f32;
  other.cpu_model += " (another)";
  EXPECT_FALSE(read_cached_peak(path_, other).has_value());
  const auto j = nlohmann::json::parse(std::ifstream(path_));
  EXPECT_EQ(j["entries"].size(), 2u);
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "sub")) {
    EXPECT_EQ(e.path().filename(), "peak_flops.json") << "a temporary file was left behind";
  }
}

TEST_F(PeakCache, AMalformedFileIsNotCachedAndIsRewritten) {
  std::filesystem::create_directories(dir_ / "sub");
  std::ofstream(path_) << "{ not json";
  const PeakKey k = host_peak_key("Float", 1);
  EXPECT_FALSE(read_cached_peak(path_, k).has_value());
  write_cached_peak(path_, k, 7e10);
  EXPECT_EQ(read_cached_peak(path_, k)->flops, 7e10);
}

TEST_F(PeakCache, OffMeansNoFile) {
  const PeakKey k = host_peak_key("Float", 1);
  write_cached_peak("", k, 7e10);
  EXPECT_FALSE(read_cached_peak("", k).has_value());
  EXPECT_EQ(format_utc_date(0), "1970-01-01");
  EXPECT_EQ(format_utc_date(1796601600), "2026-12-07");
}

}  // namespace
}  // namespace torus::device
