// torus/run/peak_flops.h — the FLOP/s an MFU figure divides by
// (Note [Honest MFU] in train_loop.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

#include "torus/comm/process_group.h"

namespace torus::run {

// The documented dense peak of a CUDA device in FLOP/s for matmuls in
// `dtype` (bf16/f16: tensor cores; f32: the FMA units, TF32 not assumed),
// found by device name in the hardware table (torus/device/hardware.h;
// datasheet figures, no sparsity): H200 and H100 SXM 989.4e12 / 66.9e12,
// H100 PCIe 756e12 / 51.2e12, A100 312e12 / 19.5e12, V100 125e12 (f16
// only) / 15.7e12. 0 for a device or dtype not in the table (MFU is then
// left out unless --peak-tflops is given).
double cuda_dense_peak_flops(const std::string& device_name, c10::ScalarType dtype);

// FLOP/s of this host's CPU for an n x n GEMM in `dtype` on `threads`
// threads: after a 0.3 s warm-up, the best of nine trials of 0.1 s (at
// least two GEMMs each). Pure measurement, no communication, no cache.
//
// Note [Stable CPU peak]: the figure an MFU divides by must not move
// between runs of the same job on the same host (it did: 124.6 and then
// 75.4 GFLOP/s, minutes apart). What can move it: other processes taking
// cores during a short probe, and the host's other ranks polling in the
// collective that waits for the measurement (the backends poll before they
// back off). So the probe warms up and keeps the best of many short
// trials, the other ranks sleep on the store (a blocking read) meanwhile,
// and the figure is kept per host (device/peak_cache.h) and reused by later
// runs — the part that makes it stable: under sustained contention no probe
// is. docs/train.md has the numbers.
double measure_cpu_gemm_flops(c10::ScalarType dtype, int threads, int64_t n = 1024);

// The job's peak and how it was obtained: "measured", "cached from
// <date>" (the metrics' config record says it; also "--peak-tflops" and
// "datasheet <device>", set by the training loop).
struct JobPeak {
  double flops = 0;
  std::string source;
};

// The job's peak for `dtype` on CPU: local rank 0 of every host takes its
// host's figure from the peak cache (device/peak_cache.h) or measures it
// with all the host's cores (and stores it) while the host's other ranks
// sleep, the hosts' figures are summed. For a 16-bit dtype a host's
// figure is the faster of its GEMMs in that dtype and in f32: CPUs without
// fast 16-bit arithmetic run LibTorch's f16/bf16 GEMM far below their f32
// speed, and a 16-bit model's step, which runs other kernels too (some in
// f32), then does more FLOP/s than that GEMM — it is no upper bound (an
// fp16 gpt2-tiny run reported MFU 169% against it).
// Collective over `world`; the same value everywhere.
JobPeak measure_job_cpu_peak_flops(const comm::ProcessGroupPtr& world, c10::ScalarType dtype);

}  // namespace torus::run
