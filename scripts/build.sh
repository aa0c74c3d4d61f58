#!/usr/bin/env bash
# Configures and builds Torus into ${TORUS_BUILD_DIR:-build} (Ninja, ccache).
# Extra arguments go to CMake's configure step, e.g. -DTORUS_BUILD_BENCH=OFF.
# The CUDA choice is made here, once for every script that builds (main.sh,
# test.sh), so that they all configure the same build and running one after
# another builds once: CUDA and NCCL on when nvcc is found and TORUS_NO_CUDA
# is unset, off otherwise; an explicit -DTORUS_WITH_CUDA=... or
# -DTORUS_WITH_NEURON=... argument makes the choice instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${TORUS_BUILD_DIR:-build}
JOBS=${TORUS_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths relative to the checkout, so clones in other folders share the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
# With -g ccache also hashes the working directory, so a clone in another
# folder would miss every object; leave it out (debug info may then name
# the folder of the clone that filled the cache).
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-10G}
cuda=()
if [[ " $* " != *" -DTORUS_WITH_CUDA="* && " $* " != *" -DTORUS_WITH_NEURON="* ]]; then
  if [[ -z "${TORUS_NO_CUDA:-}" ]] && command -v nvcc >/dev/null 2>&1; then
    cuda=(-DTORUS_WITH_CUDA=ON -DTORUS_WITH_NCCL=ON)
  else
    cuda=(-DTORUS_WITH_CUDA=OFF -DTORUS_WITH_NCCL=OFF)
  fi
fi
cmake -S . -B "$BUILD" -G Ninja "${cuda[@]}" "$@"
cmake --build "$BUILD" -j "$JOBS"
