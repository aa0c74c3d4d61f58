#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, builds
# everything (CUDA code included when nvcc is present: compiled and linked,
# GPU tests skip without a GPU), then runs every CTest test — unit tests,
# multi-rank tests under mpirun (1–8 ranks), the installed-package consumer
# and the Python tests; then the Neuron configuration (docs/neuron.md): its
# LibTorch-free part — the Neuron device, comm backend, program executor and
# the fake runtime — built beside the default build and tested against the
# fake (ctest -L neuron). Each multi-rank test is time bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"  # the same configure as scripts/main.sh (build.sh chooses CUDA)

# The Neuron configuration (exclusive with CUDA, hence its own build tree).
BUILD=${TORUS_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
mkdir -p "$BUILD-neuron"
cmake -S . -B "$BUILD-neuron" -G Ninja -DTORUS_WITH_NEURON=ON -DTORUS_WITH_CUDA=OFF -DTORUS_WITH_NCCL=OFF \
  > "$BUILD-neuron/configure.log"
cmake --build "$BUILD-neuron" -j "${TORUS_JOBS:-$(nproc)}" --target torus_neuron_checks
(cd "$BUILD-neuron" && ctest --output-on-failure --timeout 300 -L neuron)

cd "$BUILD"
ctest --output-on-failure --timeout 900 ${TORUS_CTEST_ARGS:-}
