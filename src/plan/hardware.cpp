// The hardware presets of the planner (hardware.h). Figures are the
// vendors' datasheets: NVIDIA A100 (312 TFLOP/s bf16 dense, 19.5 f32, NVLink
// 3 600 GB/s both directions) and H100 SXM (989.4 / 66.9, NVLink 4 900 GB/s);
// AWS p4d (4 x 100 Gb/s EFA), p5 (32 x 100 Gb/s EFA), trn1.32xlarge (16
// Trainium chips of 2 NeuronCores-v2 and 32 GB each, 190 TFLOP/s bf16 per
// chip, 8 x 100 Gb/s EFA); DGX A100 (8 x 200 Gb/s HDR InfiniBand).
#include "torus/plan/hardware.h"

namespace torus::plan {

namespace {
constexpr double kGB = 1e9;
constexpr double kT = 1e12;
}  // namespace

const std::vector<Hardware>& hardware_presets() {
  static const std::vector<Hardware> presets = [] {
    std::vector<Hardware> v;
    Hardware a100;
    a100.name = "a100-40gb";
    a100.description = "p4d.24xlarge: 8 x A100 40 GB, NVLink 3, 4 EFA (400 Gb/s)";
    a100.instance = "p4d.24xlarge";
    a100.devices_per_node = 8;
    a100.device_memory = 40 * kGB;
    a100.host_memory = 1152 * kGB;
    a100.peak_flops_16 = 312 * kT;
    a100.peak_flops_32 = 19.5 * kT;
    a100.intra_node_bw = 300 * kGB;
    a100.network_bw = 50 * kGB;
    a100.host_link_bw = 25 * kGB;
    a100.intra_latency = 10e-6;
    a100.network_latency = 30e-6;
    v.push_back(a100);
    Hardware a100_80 = a100;
    a100_80.name = "a100-80gb";
    a100_80.description = "p4de.24xlarge: 8 x A100 80 GB, NVLink 3, 4 EFA (400 Gb/s)";
    a100_80.instance = "p4de.24xlarge";
    a100_80.device_memory = 80 * kGB;
    v.push_back(a100_80);
    Hardware h100 = a100;
    h100.name = "h100-80gb";
    h100.description = "p5.48xlarge: 8 x H100 80 GB, NVLink 4, 32 EFA (3200 Gb/s)";
    h100.instance = "p5.48xlarge";
    h100.device_memory = 80 * kGB;
    h100.host_memory = 2048 * kGB;
    h100.peak_flops_16 = 989.4 * kT;
    h100.peak_flops_32 = 66.9 * kT;
    h100.intra_node_bw = 450 * kGB;
    h100.network_bw = 400 * kGB;
    h100.host_link_bw = 50 * kGB;
    v.push_back(h100);
    Hardware trn1;
    trn1.name = "trn1";
    trn1.description = "trn1.32xlarge: 16 Trainium chips = 32 NeuronCores-v2 of 16 GB, 8 EFA (800 Gb/s)";
    trn1.instance = "trn1.32xlarge";
    trn1.devices_per_node = 32;
    trn1.device_memory = 16 * kGB;
    trn1.host_memory = 512 * kGB;
    trn1.peak_flops_16 = 95 * kT;
    trn1.peak_flops_32 = 23.75 * kT;
    trn1.intra_node_bw = 96 * kGB;
    trn1.network_bw = 100 * kGB;
    trn1.host_link_bw = 12 * kGB;
    trn1.intra_latency = 15e-6;
    trn1.network_latency = 30e-6;
    trn1.efficiency = 0.4;
    v.push_back(trn1);
    Hardware dgx = a100_80;
    dgx.name = "dgx-a100";
    dgx.description = "DGX A100: 8 x A100 80 GB, NVLink 3, 8 x HDR InfiniBand (1600 Gb/s) — the Megatron-LM SC21 cluster";
    dgx.instance = "";
    dgx.host_memory = 2048 * kGB;
    dgx.network_bw = 200 * kGB;
    dgx.network_latency = 10e-6;
    v.push_back(dgx);
    Hardware cpu;
    cpu.name = "cpu";
    cpu.description = "this host, measured: GEMM FLOP/s and MemAvailable, one device per rank";
    cpu.devices_per_node = 0;  // filled in when measured
    cpu.intra_node_bw = 4 * kGB;
    cpu.network_bw = 1.25 * kGB;
    cpu.host_link_bw = 0;
    cpu.intra_latency = 20e-6;
    cpu.network_latency = 50e-6;
    cpu.efficiency = 0.5;
    v.push_back(cpu);
    return v;
  }();
  return presets;
}

const Hardware* find_hardware(const std::string& name) {
  for (const Hardware& h : hardware_presets()) {
    if (h.name == name) return &h;
  }
  return nullptr;
}

std::string hardware_names() {
  std::string out;
  for (const Hardware& h : hardware_presets()) out += (out.empty() ? "" : ", ") + h.name;
  return out;
}

}  // namespace torus::plan
