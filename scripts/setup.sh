#!/usr/bin/env bash
# Installs every dependency of Torus on a fresh Debian 12 machine, skipping
# what is already there. Safe to run again and again.
#
#   scripts/setup.sh            # Debian packages + Python packages
#   TORUS_SKIP_APT=1 scripts/setup.sh   # Python packages only (no root)
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  openmpi-bin libopenmpi-dev
  libfabric-dev libfabric-bin
  libfmt-dev libssl-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev
  iproute2
)

log() { echo "[setup] $*"; }

if [[ "${TORUS_SKIP_APT:-0}" != "1" ]]; then
  missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    log "Debian packages: all present"
  fi
fi

PY=${PYTHON:-python3}
need_pip=0
while read -r line; do
  line=${line%%#*}
  [[ -z "${line// }" ]] && continue
  name=${line%%==*}
  want=${line#*==}
  have=$($PY -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
  if [[ "$have" != "$want" && "$have" != "$want+"* ]]; then
    log "python package $name: have '${have:-none}', want $want"
    need_pip=1
  fi
done < requirements.txt
if ((need_pip)); then
  log "installing Python packages from requirements.txt"
  $PY -m pip install -q --disable-pip-version-check --root-user-action=ignore -r requirements.txt
else
  log "Python packages: all present"
fi
log "done"
