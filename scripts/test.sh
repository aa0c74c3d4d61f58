#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, builds
# everything (CUDA code included when nvcc is present: compiled and linked,
# GPU tests skip without a GPU), then runs every CTest test — unit tests,
# multi-rank tests under mpirun (1–8 ranks), the installed-package consumer
# and the Python tests. Each multi-rank test is time bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
extra=()
if [[ -z "${TORUS_NO_CUDA:-}" ]] && command -v nvcc >/dev/null 2>&1; then
  extra+=(-DTORUS_WITH_CUDA=ON -DTORUS_WITH_NCCL=ON)
fi
scripts/build.sh "${extra[@]}" "$@"
cd "${TORUS_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 ${TORUS_CTEST_ARGS:-}
