#!/usr/bin/env bash
# Two ranks of the ofi backend on the shm provider whose process ids have
# different numbers of digits (shm's endpoint address names the pid, so the
# addresses differ in length). Runs inside a private pid namespace, as in
# any container: rank 0 gets a one-digit pid, and pids are used up before
# rank 1 starts so that its pid has two digits. Both ranks run every
# collective (the multi-host check's suite on one host).
#
# Usage: pid_digits_test.sh PROGRAM   (PROGRAM: torus_ofi_hosts_check)
# Exit 0: both ranks passed; 77: pid namespaces are not permitted here.
set -euo pipefail
prog=${1:?usage: pid_digits_test.sh PROGRAM}
if ! unshare --pid --fork --mount-proc true 2>/dev/null; then
  echo "pid_digits_test: pid namespaces are not permitted here; skipped"
  exit 77
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
export PROG="$prog" PORT="$port" TOKEN="$token"
exec timeout -k 5 120 unshare --pid --fork --mount-proc bash -c '
  set -u
  export TORUS_WORLD_SIZE=2 TORUS_LOCAL_SIZE=2 TORUS_MASTER_ADDR=127.0.0.1 TORUS_MASTER_PORT=$PORT \
         TORUS_JOB_TOKEN=$TOKEN TORUS_BACKEND=ofi FI_PROVIDER=shm NETNS_EXPECT_HOSTS=1 TORUS_LOG_LEVEL=warn
  TORUS_RANK=0 TORUS_LOCAL_RANK=0 "$PROG" & p0=$!
  # Use up pids until the next one has one digit more than rank 0s.
  want=1
  while (( want <= p0 )); do want=$((want * 10)); done
  while :; do
    sh -c "exit 0" & p=$!
    wait $p
    (( p + 1 >= want )) && break
  done
  TORUS_RANK=1 TORUS_LOCAL_RANK=1 "$PROG" & p1=$!
  echo "pid_digits_test: rank 0 has pid $p0, rank 1 has pid $p1"
  if (( ${#p0} == ${#p1} )); then
    echo "pid_digits_test: FAILED to give the ranks pids of different lengths"
    kill $p0 $p1 2>/dev/null
    exit 1
  fi
  rc=0
  wait $p0 || rc=$?
  wait $p1 || rc=$?
  if (( rc != 0 )); then echo "pid_digits_test: FAILED (exit status $rc)"; exit 1; fi
  echo "pid_digits_test: both ranks passed"
'
