#!/usr/bin/env bash
# bench/moe/run.sh — torus-bench-moe on 1, 2 and 4 ranks (ep = the rank
# count, the same total experts each time), merged into
# bench/results/moe.json and bench/results/moe.txt with the command, the
# commit and the date.
#
#   bench/moe/run.sh [ARGS...]        # ARGS go to every torus-bench-moe run
#   BUILD_DIR=build RANKS="1 2 4" TIMEOUT=600 bench/moe/run.sh --steps 10
#
# Builds nothing: build the target torus_bench_moe first. Each run writes
# bench/results/moe_np<N>.{json,txt}.tmp, merged and removed at the end. A
# run that fails (a failed check exits 2) stops the script with its status
# and records nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
EXE=$BUILD_DIR/bench/torus-bench-moe
RANKS=${RANKS:-1 2 4}
TIMEOUT=${TIMEOUT:-600}
OUT=bench/results

if [ ! -x "$EXE" ]; then
  echo "run.sh: $EXE not found; build the target torus_bench_moe first" >&2
  exit 1
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo "run.sh: mpirun not found (Open MPI)" >&2
  exit 1
fi
mkdir -p "$OUT"

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit (with uncommitted changes)"
fi
date=$(date -u '+%Y-%m-%d %H:%M UTC')
script_cmd="bench/moe/run.sh${*:+ $*}"

# One host, loopback only; as many ranks as asked whatever the core count.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl "self,vader,tcp" --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo --timeout "$TIMEOUT" -x TORUS_LOG_LEVEL=warn -x OMP_NUM_THREADS=1)
if [ "$(id -u)" = 0 ]; then
  MPIRUN+=(--allow-run-as-root)
fi

cleanup() {
  for n in $RANKS; do
    rm -f "$OUT/moe_np$n.json.tmp" "$OUT/moe_np$n.txt.tmp"
  done
}
trap cleanup EXIT

for n in $RANKS; do
  cmd=("${MPIRUN[@]}" -np "$n" "$EXE" --commit "$commit" --json "$OUT/moe_np$n.json.tmp" "$@")
  shown="mpirun -np $n $EXE$(printf ' %q' --commit "$commit" "$@")"
  echo "# $n rank(s): $shown" | tee "$OUT/moe_np$n.txt.tmp"
  rc=0
  "${cmd[@]}" >>"$OUT/moe_np$n.txt.tmp" || rc=$?
  tail -n +2 "$OUT/moe_np$n.txt.tmp"
  if [ "$rc" != 0 ]; then
    echo "run.sh: the $n-rank run failed (exit $rc); nothing recorded" >&2
    exit "$rc"
  fi
done

# shellcheck disable=SC2086  # RANKS: one argument per rank count
python3 - "$script_cmd" "$commit" "$date" $RANKS <<'EOF'
import json
import pathlib
import sys

command, commit, date, *ranks = sys.argv[1:]
out = pathlib.Path("bench/results")
runs, tables, goals = [], [], []
for n in ranks:
    run = json.loads((out / f"moe_np{n}.json.tmp").read_text())
    text = (out / f"moe_np{n}.txt.tmp").read_text()
    first = text.splitlines()[0] if text else ""
    run["mpirun"] = first.split(": ", 1)[1] if ": " in first else ""
    runs.append(run)
    tables.append(text if text.endswith("\n") else text + "\n")
    g = run.get("goal", {})
    goals.append({"ranks": run.get("ranks"), "ep": run.get("ep"), "ratio": g.get("ratio"), "pass": g.get("pass"),
                  "limit": g.get("limit")})

lines = []
for g in goals:
    if g["ratio"] is None:
        lines.append(f"#   ep={g['ep']}: n/a")
    else:
        lines.append(f"#   ep={g['ep']} ({g['ranks']} rank(s)): {g['ratio']:.3f}x "
                     f"(goal <= {g['limit']:.2f}x) {'PASS' if g['pass'] else 'FAIL'}")
summary = "# goal: dropless step time / capacity 1.25 step time, balanced router\n" + "\n".join(lines) + "\n"

header = f"# command: {command}\n# commit: {commit}\n# date: {date}\n"
(out / "moe.txt").write_text(header + "\n".join(tables) + "\n" + summary)
(out / "moe.json").write_text(json.dumps({"command": command, "commit": commit, "date": date, "goal": goals,
                                          "runs": runs}, indent=1) + "\n")
sys.stdout.write("\n" + summary)
print("recorded bench/results/moe.txt and bench/results/moe.json")
EOF
