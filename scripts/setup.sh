#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian machine, used by the README and by CI:
#   Debian packages (docker.io, etcd-server, busybox-static, iproute2, iptables, openssl; for tests of the
#   usage views: prometheus, chromium and chromium-driver; npm), dockerd running, the fleet page's charting
#   library (uPlot, `npm ci` in ui/),
#   a virtualenv in .venv with this package installed (with test extras), local test images.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "setup: run as root (the agent manages containers and kernel settings)" >&2; exit 1; }

packages=(docker.io etcd-server busybox-static iproute2 iptables python3-venv irqbalance openssl prometheus
          chromium chromium-driver)
command -v npm >/dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # policy-rc.d may forbid starting services in containers; we start dockerd ourselves below.
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# dockerd: systemd may not be PID 1 here, so start it by hand when it is not answering.
if ! docker info >/dev/null 2>&1; then
  if [ "$(ps -o comm= -p 1)" = systemd ]; then
    systemctl start docker
  else
    echo "setup: starting dockerd"
    setsid dockerd >/var/log/twine-dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not come up; see /var/log/twine-dockerd.log" >&2; exit 1; }
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
  log=$(mktemp)
  if ! { .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e '.[test,rebalancer]'; } >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "setup: pip install failed" >&2; exit 1
  fi
  rm -f "$log"
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# the fleet page's charting library, from the npm registry at the version ui/package-lock.json pins
ui_stamp=ui/node_modules/.installed-$(sha256sum ui/package-lock.json | cut -c1-16)
if [ ! -e "$ui_stamp" ]; then
  log=$(mktemp)
  (cd ui && npm ci --no-audit --no-fund) >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; echo "setup: npm ci in ui/ failed" >&2; exit 1; }
  rm -f "$log"
  touch "$ui_stamp"
fi

scripts/build-images.sh
echo "setup: ready (docker $(docker version --format '{{.Server.Version}}'), $(.venv/bin/python --version))"
