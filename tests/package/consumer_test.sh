#!/usr/bin/env bash
# Installs this build of Torus into a scratch prefix, then
#  1. runs every installed executable (`--help`) from the prefix alone: each
#     compiled one must load the installed libtorus (not the build tree's)
#     and LibTorch with no LD_LIBRARY_PATH; a script (torus-launch) must run
#     from the installed files;
#  2. builds examples/consumer against the prefix as an outside project
#     (find_package(Torus CONFIG REQUIRED)) and runs it on 2 ranks under mpirun.
#   consumer_test.sh <build dir> <source dir> <mpirun>
set -euo pipefail
build=$1 src=$2 mpirun=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null

fail() { echo "consumer_test: FAILED: $*" >&2; exit 1; }
shopt -s nullglob
bins=("$prefix"/bin/*)
[ "${#bins[@]}" -gt 0 ] || fail "nothing installed under $prefix/bin"
[ -x "$prefix/bin/torus-train" ] || fail "torus-train is not installed"
for exe in "${bins[@]}"; do
  [ -f "$exe" ] && [ -x "$exe" ] || continue
  name=$(basename "$exe")
  resolved="(a script)"
  if [ "$(head -c 4 "$exe")" = $'\x7fELF' ]; then
    # Resolution as the dynamic loader does it, with nothing from the caller.
    resolved=$(env -u LD_LIBRARY_PATH ldd "$exe" | awk '$1 ~ /^libtorus\.so/ {print $3}')
    case "$(realpath -m "${resolved:-/nowhere}")" in
      "$(realpath "$prefix")"/*) ;;
      *) fail "$name loads libtorus from '${resolved:-nowhere}', not from $prefix:"$'\n'"$(env -u LD_LIBRARY_PATH ldd "$exe")" ;;
    esac
  fi
  if ! out=$(env -u LD_LIBRARY_PATH timeout 60 "$exe" --help 2>&1); then
    fail "installed $name --help failed:"$'\n'"$out"
  fi
  [ -n "$out" ] || fail "installed $name --help printed nothing"
  echo "installed $name --help: ok (libtorus from $resolved)"
done

cmake -S "$src/examples/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$mpirun" --allow-run-as-root --oversubscribe --bind-to none --timeout 120 -x TORUS_LOG_LEVEL=warn \
  -np 2 "$work/consumer/torus_consumer" | tee "$work/out.txt"
test "$(grep -c ' OK$' "$work/out.txt")" -eq 2
