// torus/plan/hardware.h — the machines the planner (torus/plan/planner.h)
// lays a run out on: per-device memory and peak, devices per node, the
// bandwidth inside a node and between nodes. LibTorch-free.
//
//   name        devices/node  memory   peak bf16     intra-node / device   network / node   instance
//   a100-40gb   8 GPUs        40 GB    312 TFLOP/s   300 GB/s (NVLink 3)   50 GB/s (4 EFA)   p4d.24xlarge
//   a100-80gb   8 GPUs        80 GB    312 TFLOP/s   300 GB/s              50 GB/s (4 EFA)   p4de.24xlarge
//   h100-80gb   8 GPUs        80 GB    989 TFLOP/s   450 GB/s (NVLink 4)   400 GB/s (32 EFA) p5.48xlarge
//   trn1        32 NeuronCores 16 GB   95 TFLOP/s    96 GB/s (NeuronLink)  100 GB/s (8 EFA)  trn1.32xlarge
//   dgx-a100    8 GPUs        80 GB    312 TFLOP/s   300 GB/s              200 GB/s (8 HDR)  DGX A100 (the Megatron SC21 cluster)
//   cpu         this host, measured by torus-plan (GEMM FLOP/s, MemAvailable), one device per rank
//
// Bandwidths are per direction. The datasheet peaks are dense (no
// sparsity); a preset's `efficiency` is the share of the peak a step's
// matmuls are assumed to reach (the planner's --efficiency overrides it).
#pragma once

#include <string>
#include <vector>

namespace torus::plan {

struct Hardware {
  std::string name;
  std::string description;
  std::string instance;        // the EC2 instance type (empty: none)
  int devices_per_node = 8;
  double device_memory = 0;    // bytes per device
  double host_memory = 0;      // bytes per node (offload targets)
  double peak_flops_16 = 0;    // dense bf16/fp16 matmul FLOP/s per device
  double peak_flops_32 = 0;    // f32 (no TF32) FLOP/s per device
  double intra_node_bw = 0;    // bytes/s per device per direction inside a node
  double network_bw = 0;       // bytes/s per node per direction between nodes
  double host_link_bw = 0;     // bytes/s per device between device and host memory (offload)
  double intra_latency = 0;    // seconds per collective step inside a node
  double network_latency = 0;  // seconds per collective step between nodes
  double efficiency = 0.5;     // share of the peak a step's matmuls reach
};

// Every preset, in the order above (`cpu` with zeros: torus-plan measures it).
const std::vector<Hardware>& hardware_presets();
// The preset `name`, or nullptr.
const Hardware* find_hardware(const std::string& name);
// "a100-40gb, a100-80gb, ..." (for messages and --help).
std::string hardware_names();

}  // namespace torus::plan
