#!/usr/bin/env bash
# Collective self-check: sets everything up, builds, then runs a 4-rank check and
# benchmark of every collective on the host backend, with the single-core
# memcpy probe as the limit of one host.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD=${TORUS_BUILD_DIR:-build}
exec mpirun --allow-run-as-root --oversubscribe --bind-to none -np "${TORUS_NP:-4}" \
  "$BUILD/bench/torus-bench-comm" --ops all_reduce,reduce_scatter,all_gather,all_to_all,broadcast,reduce \
  -b 1K -e 16M -f 4 --check "$@"
