#!/usr/bin/env bash
# Configures and builds Torus into ${TORUS_BUILD_DIR:-build} (Ninja, ccache).
# Extra arguments go to CMake's configure step, e.g. -DTORUS_WITH_CUDA=ON.
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
cmake -S . -B "$BUILD" -G Ninja "$@"
cmake --build "$BUILD" -j "$JOBS"
