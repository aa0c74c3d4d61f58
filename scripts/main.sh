#!/usr/bin/env bash
# The main job: sets everything up, builds, then trains a byte-level GPT with
# tensor, pipeline and data parallelism (TP=2 x PP=2 x DP=2) on 8 local ranks
# with torus-train, on the licence texts every Debian system ships. Prints
# one line per step; writes runs/torus-train/metrics.jsonl and TensorBoard
# event files (runs/torus-train/tb), then draws runs/torus-train/loss.png with
# `python3 -m torus.plot` when the Python package is built.
# Extra arguments go to torus-train (see `build/bin/torus-train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD=${TORUS_BUILD_DIR:-build}
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 8 -x TORUS_LOG_LEVEL="${TORUS_LOG_LEVEL:-warn}" \
  "$BUILD/bin/torus-train" --tp 2 --pp 2 --dp 2 --out runs/torus-train --save-every 200 --keep-last 2 "$@"
out=runs/torus-train
for ((i = 1; i <= $#; ++i)); do
  [[ "${!i}" == "--out" ]] && { j=$((i + 1)); out=${!j}; }
  [[ "${!i}" == --out=* ]] && out=${!i#--out=}
done
if [[ -d "$BUILD/python/torus" ]]; then
  PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m torus.plot "$out"
fi
