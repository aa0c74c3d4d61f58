// torus/device/hardware.h — the hardware facts Torus knows: accelerator
// models with their dense datasheet peaks, and the machines (nodes) the
// planner lays runs out on. LibTorch-free; read by the run layer (MFU's
// documented peaks) and the planner (its presets).
//
// The facts live in one table, python/torus/launch/hardware.json, which the
// build embeds into the library (src/device/hardware.cpp) and torus-launch
// reads as it is (python/torus/launch/instances.py); nothing else restates a
// peak, a memory size or a device count. docs/plan.md lists the machines.
//
//   machine     devices/node   memory   peak bf16     intra-node / device   network / node    instance
//   a100-40gb   8 A100         40 GB    312 TFLOP/s   300 GB/s (NVLink 3)   50 GB/s (4 EFA)   p4d.24xlarge
//   a100-80gb   8 A100         80 GB    312 TFLOP/s   300 GB/s              50 GB/s (4 EFA)   p4de.24xlarge
//   h100-80gb   8 H100         80 GB    989 TFLOP/s   450 GB/s (NVLink 4)   400 GB/s (32 EFA) p5.48xlarge
//   h200-141gb  8 H200         141 GB   989 TFLOP/s   450 GB/s (NVLink 4)   400 GB/s (32 EFA) p5e.48xlarge
//   trn1        32 NeuronCores 16 GB    95 TFLOP/s    96 GB/s (NeuronLink)  100 GB/s (8 EFA)  trn1.32xlarge
//   dgx-a100    8 A100         80 GB    312 TFLOP/s   300 GB/s              200 GB/s (8 HDR)  DGX A100 (Megatron SC21)
//   cpu         this host, measured by the planner (GEMM FLOP/s, MemAvailable), one device per rank
//
// Bandwidths are per direction. The datasheet peaks are dense (no
// sparsity); a machine's `efficiency` is the share of the peak a step's
// matmuls are assumed to reach (the planner's --efficiency overrides it).
//
// The table is parsed once, on first use (thread safe); a malformed table is
// a build defect and throws Error naming the field.
#pragma once

#include <string>
#include <vector>

namespace torus::device {

// An accelerator model: a row of the table's "devices".
struct DeviceSpec {
  std::string name;                // "h100-sxm"
  std::string kind;                // "gpu", "neuron" or "cpu"
  std::string description;
  std::vector<std::string> match;  // substrings of the runtime's device name
  double peak_flops_bf16 = 0;      // dense FLOP/s per device (0: none documented)
  double peak_flops_fp16 = 0;
  double peak_flops_32 = 0;        // f32 FMA units (no TF32)
  double peak_flops_fp8 = 0;
};

// A machine the planner lays runs out on: a row of the table's "machines".
struct Hardware {
  std::string name;
  std::string description;
  std::string instance;        // the EC2 instance type (empty: none)
  std::string device;          // the DeviceSpec's name
  int devices_per_node = 8;
  int efa = 0;                 // EFA devices per node
  double device_memory = 0;    // bytes per device
  double host_memory = 0;      // bytes per node (offload targets)
  double peak_flops_16 = 0;    // dense bf16/fp16 matmul FLOP/s per device
  double peak_flops_32 = 0;    // f32 (no TF32) FLOP/s per device
  double peak_flops_8 = 0;     // dense fp8 FLOP/s per device (0: none)
  double intra_node_bw = 0;    // bytes/s per device per direction inside a node
  double network_bw = 0;       // bytes/s per node per direction between nodes
  double host_link_bw = 0;     // bytes/s per device between device and host memory (offload)
  double intra_latency = 0;    // seconds per collective step inside a node
  double network_latency = 0;  // seconds per collective step between nodes
  double efficiency = 0.5;     // share of the peak a step's matmuls reach
};

// Every device model, in the table's order (more specific names first).
const std::vector<DeviceSpec>& device_specs();
// The first device model one of whose `match` substrings is in
// `device_name` (as the runtime reports it: "NVIDIA H100 80GB HBM3"), or
// nullptr.
const DeviceSpec* match_device(const std::string& device_name);

// Every machine, in the order above (`cpu` with zeros: the planner measures it).
const std::vector<Hardware>& hardware_presets();
// The machine `name`, or nullptr.
const Hardware* find_hardware(const std::string& name);
// "a100-40gb, a100-80gb, ..." (for messages and --help).
std::string hardware_names();

// The table itself (JSON text), as embedded at build time.
const char* hardware_table_json();

}  // namespace torus::device
