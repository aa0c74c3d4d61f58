#!/usr/bin/env bash
# Installs this build of Torus into a scratch prefix, builds examples/consumer
# against it as an outside project (find_package(Torus CONFIG REQUIRED)) and
# runs it on 2 ranks under mpirun.
#   consumer_test.sh <build dir> <source dir> <mpirun>
set -euo pipefail
build=$1 src=$2 mpirun=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$mpirun" --allow-run-as-root --oversubscribe --bind-to none --timeout 120 -x TORUS_LOG_LEVEL=warn \
  -np 2 "$work/consumer/torus_consumer" | tee "$work/out.txt"
test "$(grep -c ' OK$' "$work/out.txt")" -eq 2
