// torus/run/peak_flops.h — the FLOP/s an MFU figure divides by
// (Note [Honest MFU] in train_loop.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

#include "torus/comm/process_group.h"

namespace torus::run {

// The documented dense peak of a CUDA device in FLOP/s for matmuls in
// `dtype` (bf16/f16: tensor cores; f32: the FMA units, TF32 not assumed),
// found by device name (datasheet figures, no sparsity): H200 and H100 SXM
// 989.4e12 / 66.9e12, H100 PCIe 756e12 / 51.2e12, A100 312e12 / 19.5e12,
// V100 125e12 (f16 only) / 15.7e12. 0 for a device or dtype not in the
// table (MFU is then left out unless --peak-tflops is given).
double cuda_dense_peak_flops(const std::string& device_name, c10::ScalarType dtype);

// FLOP/s of this host's CPU for an n x n GEMM in `dtype` on `threads`
// threads: the best of three 0.25 s windows. Pure measurement, no
// communication.
double measure_cpu_gemm_flops(c10::ScalarType dtype, int threads, int64_t n = 1024);

// The job's peak for `dtype` on CPU: local rank 0 of every host measures
// with all the host's cores while the host's other ranks wait, the hosts'
// figures are summed. For a 16-bit dtype a host's figure is the faster of
// its GEMMs in that dtype and in f32: CPUs without fast 16-bit arithmetic
// run LibTorch's f16/bf16 GEMM far below their f32 speed, and a 16-bit
// model's step, which runs other kernels too (some in f32), then does more
// FLOP/s than that GEMM — it is no upper bound (an fp16 gpt2-tiny run
// reported MFU 169% against it).
// Collective over `world`; the same value everywhere.
double measure_job_cpu_peak_flops(const comm::ProcessGroupPtr& world, c10::ScalarType dtype);

}  // namespace torus::run
