#!/usr/bin/env bash
# Runs pytest on one rank of an mpirun job. Rank 0 prints its report; other
# ranks print theirs only when they fail, so a passing run stays readable.
#   run_pytest.sh <python interpreter> <python package dir> <pytest args...>
set -u
py=$1
export PYTHONPATH="$2${PYTHONPATH:+:$PYTHONPATH}"
shift 2
rank=${OMPI_COMM_WORLD_RANK:-${RANK:-0}}
if [[ "$rank" == "0" ]]; then
  exec "$py" -m pytest -p no:cacheprovider -q "$@"
fi
out=$(mktemp)
"$py" -m pytest -p no:cacheprovider -q "$@" >"$out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  sed "s/^/[rank $rank] /" "$out"
fi
rm -f "$out"
exit $rc
