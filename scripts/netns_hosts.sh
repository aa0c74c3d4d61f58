#!/usr/bin/env bash
# Several "hosts" on one machine: runs a command as the ranks of one job
# spread over network namespaces joined by veth pairs through a bridge, so
# that the ofi backend sees separate hosts and talks tcp between them.
#
#   scripts/netns_hosts.sh [-H hosts] [-r ranks-per-host] [-t timeout-s]
#                          [-R rate] [-D delay] -- command [args...]
#
#   -H  number of hosts (namespaces), default 2
#   -r  ranks per host, default 2
#   -t  seconds before the ranks are killed, default 120
#   -R  shape every host link with tc to this rate, e.g. 1gbit (netem, else
#       tbf; unshaped with a warning when the kernel has neither)
#   -D  and this one-way delay, e.g. 100us (netem only)
#
# Layout: namespace <p>sw holds a bridge; namespace <p>h<i> holds veth0 with
# 10.231.0.<i+1>/24, cabled to the bridge. Nothing is routed outside these
# namespaces; the root namespace only hosts the veth ends for a moment while
# they are created. Every namespace is removed on exit, whatever happens.
#
# Each rank runs `command` inside its host's namespace with the bootstrap
# variables set: TORUS_RANK, TORUS_WORLD_SIZE, TORUS_LOCAL_RANK,
# TORUS_LOCAL_SIZE, TORUS_MASTER_ADDR/PORT (rank 0's host), TORUS_JOB_TOKEN
# (fresh), TORUS_SOCKET_IFNAME=veth0, TORUS_BACKEND=ofi, FI_PROVIDER=tcp and
# FI_TCP_IFACE=veth0 (unless already set), NETNS_EXPECT_HOSTS. Output is
# prefixed with the rank.
#
# Exit status: 0 when every rank exited 0; 77 when network namespaces cannot
# be created here (the reason goes to stderr; CTest reports a skip); 124 on
# timeout; otherwise 1.
set -u

hosts=2
per_host=2
timeout_s=120
rate=""
delay=""
while getopts "H:r:t:R:D:h" opt; do
  case "$opt" in
    H) hosts=$OPTARG ;;
    r) per_host=$OPTARG ;;
    t) timeout_s=$OPTARG ;;
    R) rate=$OPTARG ;;
    D) delay=$OPTARG ;;
    *) sed -n '2,33p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
if [ $# -eq 0 ]; then
  echo "netns_hosts.sh: no command given (see -h)" >&2
  exit 2
fi
if [ "$hosts" -lt 1 ] || [ "$hosts" -gt 200 ] || [ "$per_host" -lt 1 ]; then
  echo "netns_hosts.sh: bad -H/-r" >&2
  exit 2
fi

prefix="trs$$"
switch="${prefix}sw"
created=()
pids=()

cleanup() {
  # Only processes inside the namespaces made here, then the namespaces.
  for ns in "${created[@]:-}"; do
    [ -n "$ns" ] && ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  done
  for pid in "${pids[@]:-}"; do
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  for ns in "${created[@]:-}"; do
    [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

skip() {
  echo "SKIP: network namespaces are not available here: $*" >&2
  exit 77
}

command -v ip >/dev/null 2>&1 || skip "the 'ip' tool (iproute2) is missing"
err=$(ip netns add "$switch" 2>&1) || skip "'ip netns add' failed: $err (needs root or CAP_SYS_ADMIN/CAP_NET_ADMIN)"
created+=("$switch")
ip -n "$switch" link set lo up
err=$(ip -n "$switch" link add br0 type bridge 2>&1) || skip "cannot create a bridge: $err"
ip -n "$switch" link set br0 up

# Shapes veth0 of namespace $1: netem (rate and delay) when the kernel has
# it, else tbf (rate only); without either the link stays unshaped (warning).
shape() {
  local netem=(netem) err
  [ -n "$delay" ] && netem+=(delay "$delay")
  [ -n "$rate" ] && netem+=(rate "$rate")
  err=$(ip netns exec "$1" tc qdisc add dev veth0 root "${netem[@]}" 2>&1) && return 0
  if [ -n "$rate" ] && ip netns exec "$1" tc qdisc add dev veth0 root tbf rate "$rate" burst 256kb latency 50ms \
       2>/dev/null; then
    [ -n "$delay" ] && [ "$1" = "${prefix}h0" ] && echo "netns_hosts.sh: no netem here ($err); shaping rate only" >&2
    return 0
  fi
  [ "$1" = "${prefix}h0" ] && echo "netns_hosts.sh: tc shaping unavailable ($err); links stay unshaped" >&2
  return 0
}

for ((h = 0; h < hosts; h++)); do
  ns="${prefix}h${h}"
  ip netns add "$ns" || { echo "cannot create namespace $ns" >&2; exit 1; }
  created+=("$ns")
  ip link add "${prefix}v${h}" type veth peer name "${prefix}p${h}" || { echo "cannot create a veth pair" >&2; exit 1; }
  ip link set "${prefix}v${h}" netns "$ns"
  ip link set "${prefix}p${h}" netns "$switch"
  ip -n "$ns" link set "${prefix}v${h}" name veth0
  ip -n "$ns" addr add "10.231.0.$((h + 1))/24" dev veth0
  ip -n "$ns" link set veth0 up
  ip -n "$ns" link set lo up
  ip -n "$switch" link set "${prefix}p${h}" master br0
  ip -n "$switch" link set "${prefix}p${h}" up
  if [ -n "$rate$delay" ]; then
    shape "$ns"
  fi
done

# The bridge needs a moment before it forwards (ranks retry their store
# connection anyway).
if command -v ping >/dev/null 2>&1; then
  for ((h = 1; h < hosts; h++)); do
    for _ in $(seq 50); do
      ip netns exec "${prefix}h${h}" ping -c1 -W1 10.231.0.1 >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
else
  sleep 0.5
fi

token=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
world=$((hosts * per_host))
for ((h = 0; h < hosts; h++)); do
  for ((l = 0; l < per_host; l++)); do
    rank=$((h * per_host + l))
    (
      ip netns exec "${prefix}h${h}" env \
        TORUS_RANK=$rank TORUS_WORLD_SIZE=$world TORUS_LOCAL_RANK=$l TORUS_LOCAL_SIZE=$per_host \
        TORUS_MASTER_ADDR=10.231.0.1 TORUS_MASTER_PORT=29500 TORUS_JOB_TOKEN="$token" \
        TORUS_SOCKET_IFNAME=veth0 TORUS_BACKEND="${TORUS_BACKEND:-ofi}" \
        FI_PROVIDER="${FI_PROVIDER:-tcp}" FI_TCP_IFACE="${FI_TCP_IFACE:-veth0}" \
        NETNS_EXPECT_HOSTS=$hosts "$@" 2>&1 | sed -u "s/^/[rank $rank] /"
      exit "${PIPESTATUS[0]}"
    ) &
    pids+=($!)
  done
done

status=0
deadline=$((SECONDS + timeout_s))
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "netns_hosts.sh: ranks still running after ${timeout_s}s; killing them" >&2
      exit 124
    fi
    sleep 0.2
  done
  wait "$pid"
  rc=$?
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=1
done
exit $status
