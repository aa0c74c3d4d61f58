#!/usr/bin/env bash
# GPU check of the CUDA parts of Torus: the device layer, the CUDA kernels
# against their CPU references, the nccl backend (with the ranks the visible
# GPUs allow: one per GPU, so one on a single-GPU machine) and its fault
# handling, then each kernel's achieved memory bandwidth as a fraction of the
# GPU's. Every GPU test runs with TORUS_REQUIRE_GPU=1, so a test that would
# skip for lack of a GPU fails instead.
#
# Usage, from anywhere, on a machine with an NVIDIA GPU, the CUDA toolkit,
# NCCL, the pinned torch wheel and the build dependencies of Torus
# (scripts/setup.sh):
#   tests/gpu/run.sh [build-dir]          (default: <repo>/build-gpu)
# Environment: TORUS_GPU_JOBS (build parallelism, default: all cores),
# TORUS_CUDA_ARCHITECTURES (default: the first GPU's, e.g. 90 on H100/H200).
# Exit status: 0 when every step passed. Designed to finish in a few minutes
# on one H200; each step has its own time limit.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build-gpu}"
jobs="${TORUS_GPU_JOBS:-$(nproc)}"
t0=$(date +%s)
failed=()

step() { printf '\n=== %s  [%ds]\n' "$1" $(( $(date +%s) - t0 )); }
# run NAME LIMIT_SECONDS COMMAND...: runs one check, records a failure.
run() {
  local name="$1" limit="$2"
  shift 2
  step "$name"
  if timeout --kill-after=10 "$limit" "$@"; then
    echo "--- $name: PASS"
  else
    local rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "--- $name: TIMED OUT after ${limit}s"
    else
      echo "--- $name: FAIL (exit $rc)"
    fi
    failed+=("$name")
  fi
}

step "GPU"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "no NVIDIA GPU visible (nvidia-smi failed); this script checks the CUDA build on a GPU" >&2
  exit 1
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
nvcc --version | tail -n 2
arch="${TORUS_CUDA_ARCHITECTURES:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')}"
[ -n "$arch" ] || arch="80;90"
echo "building for CUDA architecture(s) $arch with $jobs jobs"

mkdir -p "$build"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
step "configure"
if ! cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DTORUS_WITH_CUDA=ON -DTORUS_WITH_NCCL=ON -DTORUS_WITH_OFI=OFF -DTORUS_WITH_MPI=OFF \
    -DTORUS_BUILD_PYTHON=OFF -DTORUS_BUILD_BENCH=OFF -DTORUS_CUDA_ARCHITECTURES="$arch" >"$build/gpu-configure.log" 2>&1; then
  tail -n 30 "$build/gpu-configure.log"
  echo "configure failed (log: $build/gpu-configure.log)" >&2
  exit 1
fi
grep -E "Torus .* configuration|TORUS_WITH_(CUDA|NCCL)|LibTorch" "$build/gpu-configure.log" || true

targets=(torus_device_tests torus_kernel_ref_tests torus_cuda_kernel_tests torus_kernel_bandwidth
         torus_nccl_policy_tests torus_nccl_tests torus_nccl_fault_tests torus_recompute_tests)
step "build"
if ! timeout 300 cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$build/gpu-build.log" 2>&1; then
  grep -E "error|Error" "$build/gpu-build.log" | head -n 40
  echo "build failed (log: $build/gpu-build.log)" >&2
  exit 1
fi
echo "built in $(( $(date +%s) - t0 ))s since start"

bin="$build/tests"
export TORUS_REQUIRE_GPU=1 TORUS_LOG_LEVEL=warn NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
run "device layer"                   60 "$bin/torus_device_tests"
run "kernel references (CPU)"        60 "$bin/torus_kernel_ref_tests"
run "CUDA kernels vs references"    180 "$bin/torus_cuda_kernel_tests"
run "nccl watchdog and EFA check"    60 "$bin/torus_nccl_policy_tests"
run "nccl backend ($(nvidia-smi -L | wc -l) rank(s))" 240 "$bin/torus_nccl_tests"
run "nccl fault: missing peer"       90 "$bin/torus_nccl_fault_tests" --gtest_filter=NcclFault.MissingPeerTimesOutInit
run "nccl fault: stalled op"         90 "$bin/torus_nccl_fault_tests" --gtest_filter=NcclFault.StalledOpTimesOutAndAborts
run "recompute on CUDA"             120 "$bin/torus_recompute_tests" --gtest_filter='RecomputeCuda.*'
run "kernel bandwidth"              120 "$bin/torus_kernel_bandwidth"

step "summary"
echo "total time: $(( $(date +%s) - t0 ))s"
if [ "${#failed[@]}" -ne 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all GPU checks passed"
